"""Run vLLM's own offloading test suites against vLLM's classes and against kvoffload's.

Contract:

* ``--vllm VERSION`` (repeatable: 0.32.0, 0.33.0): the vLLM source release whose tests run. Its
  sdist is fetched once into ``--cache`` (default ``~/.cache/kvoffload/vllm-sdist``) the way a
  packager would (``pip download --no-binary :all: --no-deps --no-build-isolation``); pip
  prepares the metadata of an sdist it downloads, which vLLM's ``setup.py`` cannot do without its
  build requirements (``setuptools_rust``...), so when pip fails the file comes from PyPI's JSON
  API (``/pypi/vllm/<version>/json``, else ``/pypi/vllm/json``), checked against its sha256.
  Only ``tests/`` and ``pyproject.toml`` (vLLM's pytest markers) are extracted, into
  ``<cache>/vllm-<version>-tests/``; nothing of vLLM is copied into this repository.
* The vLLM code the tests run against: the installed ``vllm`` of ``--python``, or for a version
  that is not installed ``--vllm-path`` (default ``<venv of --python>/vllm-<version>``, the
  unpacked wheel of ``make test-vllm-033``) first on ``PYTHONPATH`` with
  ``VLLM_TARGET_DEVICE=cpu``. The version imported is checked before anything runs.
* Suites (each run UNMODIFIED, with vLLM's own ``tests/conftest.py``): ``kv_offload`` is
  ``tests/v1/kv_offload/``; ``kv_connector_offloading`` is every test file under
  ``tests/v1/kv_connector/unit/`` whose source names vLLM's ``OffloadingConnector`` or imports
  ``vllm.v1.kv_offload`` (the files found are recorded; the ``SimpleCPUOffloadConnector`` files,
  a different connector, do not match).
* ``--classes vllm|kvoffload|both``: ``vllm`` runs the suites as they are (the baseline);
  ``kvoffload`` runs them with ``-p swap`` (:mod:`swap`: vLLM's ``CPUOffloadingManager``,
  ``CPUOffloadingSpec`` and ``OffloadingConnector`` replaced by kvoffload's, see its docstring).
* Output (``--out FILE.json``, merged with what the file already holds for other versions): per
  version and suite, the files, and per classes: collected, passed, failed, skipped, errors,
  seconds; then, comparing the two runs: ``skipped_both`` (cannot run here, e.g. CUDA), the
  ``private_attribute`` tests (pass with vLLM's classes, fail with kvoffload's only because they
  read a private attribute of vLLM's class: test and attribute), the ``differences`` (every other
  test that passes with vLLM's classes and fails with kvoffload's: test, reason from
  :mod:`reasons`, the failure's first line) and ``kvoffload_only`` (fail with vLLM's, pass with
  kvoffload's). junit XML and pytest's log of each run stay in ``<cache>/runs/``;
  ``--compare-only`` recomputes the table from them (reasons edited, nothing run again).
* Both runs load :mod:`not_here` (``-p not_here``): without CUDA it skips the few vLLM tests that
  need CUDA (or model weights) but do not skip themselves.
* The connector tests build vLLM's ``ModelConfig`` for ``facebook/opt-125m``, which reads the
  model's ``config.json`` from the Hugging Face hub; offline, both runs get a synthetic hub cache
  (``<cache>/hf-hub``, ``HF_HUB_CACHE``) holding only that ``config.json``, written from
  ``transformers.OPTConfig()`` (whose defaults are opt-125m's shape). No weights: none of these
  tests loads a model (those that would are skipped by ``not_here``).

Each pytest run is bounded by ``--timeout-s``; the machine this was measured on has 2 cores, so
the runs go one after the other.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import tarfile
import time
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from reasons import INTERNAL_ATTRIBUTES, PRIVATE_ATTRIBUTE, reason_for  # noqa: E402

logger = logging.getLogger("vllm_suites.run")

REPO = HERE.parent.parent
DEFAULT_CACHE = Path.home() / ".cache" / "kvoffload" / "vllm-sdist"
SUITES = ("kv_offload", "kv_connector_offloading")
_CONNECTOR_FILES = re.compile(r"\bOffloadingConnector\b|\bvllm\.v1\.kv_offload\b")
_COUNTER = {"passed": "passed", "failed": "failed", "error": "errors", "skipped": "skipped"}
_MISSING_ATTR = re.compile(r"has no attribute '(\w+)'")


# --------------------------------------------------------------------------- sdist


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sdist_from_json(version: str, cache: Path) -> Path:
    """The sdist from PyPI's JSON API (version page, else the project page), sha256-checked."""
    files: list[dict[str, Any]] = []
    base = ""
    for url in (f"https://pypi.org/pypi/vllm/{version}/json", "https://pypi.org/pypi/vllm/json"):
        try:
            with urllib.request.urlopen(url, timeout=60) as r:
                data = json.load(r)
        except OSError as e:
            logger.info("%s: %s", url, e)
            continue
        files = data["urls"] if url.endswith(f"{version}/json") else data["releases"].get(version, [])
        base = url
        if files:
            break
    sdists = [f for f in files if f.get("packagetype") == "sdist"]
    if not sdists:
        raise RuntimeError(f"no sdist of vllm {version} on PyPI's JSON API")
    info = sdists[0]
    target = cache / info["filename"]
    url = urllib.parse.urljoin(base, info["url"])  # a mirror may answer relative URLs
    logger.info("downloading %s", url)
    part = target.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=600) as r, part.open("wb") as f:
        while chunk := r.read(1 << 20):
            f.write(chunk)
    if _sha256(part) != info["digests"]["sha256"]:
        part.unlink()
        raise RuntimeError(f"{url}: sha256 mismatch")
    part.rename(target)
    return target


def fetch_sdist(version: str, cache: Path, python: str) -> tuple[Path, str]:
    """The cached sdist of ``vllm==version`` and where it came from (cache, pip, pypi-json)."""
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / f"vllm-{version}.tar.gz"
    sidecar = cache / f"vllm-{version}.tar.gz.source"  # how the cached file was fetched
    if target.exists():
        how = sidecar.read_text().strip() if sidecar.exists() else "?"
        return target, f"cache (fetched by {how})"
    cmd = [python, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "--no-build-isolation"]
    cmd += [f"vllm=={version}", "-d", str(cache)]
    logger.info("%s", " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode == 0 and target.exists():
        sidecar.write_text("pip\n")
        return target, "pip"
    errors = [line.strip() for line in (proc.stdout + proc.stderr).splitlines() if "Error" in line]
    logger.warning("pip download failed (%s); using PyPI's JSON API", (errors or ["?"])[-1])
    path = _sdist_from_json(version, cache)
    sidecar.write_text("pypi-json (pip download failed: pip prepares the sdist's metadata)\n")
    return path, "pypi-json"


def extract_tests(sdist: Path, version: str, cache: Path) -> Path:
    """``tests/`` and ``pyproject.toml`` of the sdist under ``<cache>/vllm-<version>-tests``."""
    root = cache / f"vllm-{version}-tests"
    if (root / ".extracted").exists():
        return root
    prefix = f"vllm-{version}/"
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            if not m.name.startswith(prefix):
                continue
            rel = m.name[len(prefix) :]
            if rel == "pyproject.toml" or rel.startswith("tests/"):
                m.name = rel
                members.append(m)
        tar.extractall(root, members=members, filter="data")
    (root / ".extracted").write_text(sdist.name + "\n")
    return root


def suite_paths(root: Path) -> dict[str, list[str]]:
    unit = root / "tests" / "v1" / "kv_connector" / "unit"
    files = sorted(
        str(p.relative_to(root))
        for p in unit.rglob("test_*.py")
        if _CONNECTOR_FILES.search(p.read_text(encoding="utf-8", errors="replace"))
    )
    return {"kv_offload": ["tests/v1/kv_offload"], "kv_connector_offloading": files}


# --------------------------------------------------------------------------- running


_SYNTHETIC_REV = "kvoffload-synthetic"


def synthetic_hf_cache(cache: Path, python: str) -> Path:
    """A hub cache with ``facebook/opt-125m``'s config.json only (see the module docstring)."""
    hub = cache / "hf-hub"
    repo = hub / "models--facebook--opt-125m"
    snapshot = repo / "snapshots" / _SYNTHETIC_REV
    if not (snapshot / "config.json").exists():
        snapshot.mkdir(parents=True, exist_ok=True)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(_SYNTHETIC_REV)
        code = (
            "import sys, transformers; transformers.OPTConfig(architectures=['OPTForCausalLM'], "
            "torch_dtype='float16').save_pretrained(sys.argv[1])"
        )
        subprocess.run([python, "-c", code, str(snapshot)], check=True, capture_output=True, timeout=300)
    return hub


def run_env(version: str, python: str, vllm_path: Path | None, hf_hub: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    if hf_hub is not None:
        env["HF_HUB_CACHE"] = str(hf_hub)
    path = [str(HERE), str(REPO)]
    if vllm_path is not None:
        path.insert(0, str(vllm_path))
        env["VLLM_TARGET_DEVICE"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(path + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.setdefault("HF_HUB_OFFLINE", "1")
    probe = "import vllm, kvoffload; print(vllm.__version__); print(kvoffload.__file__)"
    out = subprocess.run([python, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"cannot import vllm / kvoffload: {out.stderr.strip()[-500:]}")
    got, kv_file = out.stdout.split()[-2:]
    if not got.startswith(version):
        raise RuntimeError(f"{python} imports vllm {got}, not {version} (give --vllm-path)")
    if not Path(kv_file).resolve().is_relative_to(REPO):
        raise RuntimeError(f"kvoffload imported from {kv_file}, not from {REPO}")
    return env


@dataclass
class Outcome:
    status: str  # passed, failed, error, skipped
    message: str = ""


@dataclass
class RunResult:
    collected: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    seconds: float = 0.0
    returncode: int = 0
    tests: dict[str, Outcome] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        keys = ("collected", "passed", "failed", "skipped", "errors", "seconds", "returncode")
        return {k: getattr(self, k) for k in keys}


def _node_id(case: ET.Element) -> str:
    cls, name = case.get("classname", ""), case.get("name", "")
    parts = cls.split(".")
    # classname is module path (+ class): tests.v1.x.test_mod[.TestClass]
    for i in range(len(parts), 0, -1):
        if parts[i - 1].startswith("test_"):
            return "/".join(parts[:i]) + ".py::" + "::".join(parts[i:] + [name])
    return f"{cls}::{name}"


def parse_junit(path: Path) -> dict[str, Outcome]:
    tests: dict[str, Outcome] = {}
    if not path.exists():
        return tests
    for case in ET.parse(path).getroot().iter("testcase"):
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = (child.get("message") or "") + "\n" + (child.text or "")
                break
        tests[_node_id(case)] = Outcome(status, message.strip())
    return tests


def _count(res: RunResult) -> None:
    for o in res.tests.values():
        counter = _COUNTER[o.status]
        setattr(res, counter, getattr(res, counter) + 1)
    res.collected = len(res.tests)


def run_suite(
    root: Path,
    paths: list[str],
    env: dict[str, str],
    python: str,
    swap: bool,
    junit: Path,
    timeout_s: int,
    compare_only: bool = False,
) -> RunResult:
    if compare_only:  # the outcomes of the last run, as its junit XML recorded them
        res = RunResult(tests=parse_junit(junit))
        _count(res)
        return res
    cmd = [python, "-m", "pytest", "-q", "-rs", "--durations=10", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    cmd += ["-p", "not_here"]
    if swap:
        cmd += ["-p", "swap"]
    cmd += paths
    logger.info("(cd %s && %s)", root, " ".join(cmd))
    junit.unlink(missing_ok=True)
    t0 = time.monotonic()
    log = junit.with_suffix(".log")  # pytest's output, written as it runs
    with log.open("w") as f:
        try:
            rc = subprocess.run(
                ["timeout", str(timeout_s), *cmd], cwd=root, env=env, stdout=f, stderr=subprocess.STDOUT, check=False
            ).returncode
        except OSError as e:
            rc = -1
            f.write(str(e))
    res = RunResult(seconds=round(time.monotonic() - t0, 1), returncode=rc, tests=parse_junit(junit))
    _count(res)
    if rc not in (0, 1):
        logger.warning("pytest exited %d (see %s)", rc, log)
    return res


# --------------------------------------------------------------------------- comparing


def _first_line(message: str) -> str:
    for line in message.splitlines():
        line = line.strip()
        if line:
            return line[:300]
    return ""


def compare(base: RunResult, swapped: RunResult, version: str) -> dict[str, Any]:
    private: list[dict[str, str]] = []
    differences: list[dict[str, str]] = []
    kvoffload_only: list[str] = []
    skipped_both = 0
    for test, b in sorted(base.tests.items()):
        s = swapped.tests.get(test)
        if s is None:
            if b.status == "passed":
                differences.append({"test": test, "reason": "not collected with kvoffload's classes", "message": ""})
            continue
        if b.status == "skipped" and s.status == "skipped":
            skipped_both += 1
        if b.status == "passed" and s.status in ("failed", "error"):
            attr = PRIVATE_ATTRIBUTE.get(test.split("[", 1)[0]) or PRIVATE_ATTRIBUTE.get(test)
            m = _MISSING_ATTR.search(s.message)
            if attr is None and m is not None and (m.group(1).startswith("_") or m.group(1) in INTERNAL_ATTRIBUTES):
                attr = m.group(1)
            if attr is not None:
                private.append({"test": test, "attribute": attr, "internal": not attr.startswith("_")})
            else:
                differences.append(
                    {"test": test, "reason": reason_for(test, version), "message": _first_line(s.message)}
                )
        elif b.status in ("failed", "error") and s.status == "passed":
            kvoffload_only.append(test)
    return {
        "skipped_both": skipped_both,
        "private_attribute": private,
        "differences": differences,
        "kvoffload_only": kvoffload_only,
    }


def run_version(args: argparse.Namespace, version: str) -> dict[str, Any]:
    t0 = time.monotonic()
    sdist, source = fetch_sdist(version, args.cache, args.python)
    root = extract_tests(sdist, version, args.cache)
    vllm_path = args.vllm_path
    if vllm_path is None:
        candidate = Path(args.python).parent.parent / f"vllm-{version}"
        vllm_path = candidate if candidate.is_dir() else None
    hf_hub = None if os.environ.get("HF_HUB_CACHE") else synthetic_hf_cache(args.cache, args.python)
    env = run_env(version, args.python, vllm_path, hf_hub)
    previous: dict[str, Any] = json.loads(args.out.read_text()).get("versions", {}) if args.out.exists() else {}
    runs_dir = args.cache / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    classes = ("vllm", "kvoffload") if args.classes == "both" else (args.classes,)
    out: dict[str, Any] = {
        "sdist": sdist.name,
        "sdist_sha256": _sha256(sdist),
        "sdist_source": source,
        "vllm_code": str(vllm_path) if vllm_path else "installed",
        "hf_hub_cache": "synthetic: facebook/opt-125m config.json only" if hf_hub else env.get("HF_HUB_CACHE"),
        "suites": {},
    }
    for suite, paths in suite_paths(root).items():
        if args.suite and suite not in args.suite:
            continue
        entry: dict[str, Any] = {"files": paths}
        results: dict[str, RunResult] = {}
        for cls in classes:
            junit = runs_dir / f"{version}-{suite}-{cls}.xml"
            results[cls] = run_suite(
                root, paths, env, args.python, cls == "kvoffload", junit, args.timeout_s, args.compare_only
            )
            entry[cls] = results[cls].summary()
            if args.compare_only and version in previous:  # keep the timings of the run
                old = previous[version].get("suites", {}).get(suite, {}).get(cls, {})
                entry[cls].update({k: old[k] for k in ("seconds", "returncode") if k in old})
            logger.info("%s %s %s: %s", version, suite, cls, entry[cls])
        if len(results) == 2:
            entry.update(compare(results["vllm"], results["kvoffload"], version))
        out["suites"][suite] = entry
    if args.suite and version in previous:  # the suites not run this time stay as they were
        for suite, entry in previous[version].get("suites", {}).items():
            out["suites"].setdefault(suite, entry)
    # pytest's time of every run of this version (the runs of one version go one after the other)
    out["seconds"] = round(
        sum(e[c]["seconds"] for e in out["suites"].values() for c in ("vllm", "kvoffload") if c in e), 1
    )
    out["wall_seconds_last_invocation"] = round(time.monotonic() - t0, 1)
    if args.compare_only and version in previous:
        out["command"] = previous[version].get("command")
        out["wall_seconds_last_invocation"] = previous[version].get("wall_seconds_last_invocation")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm", action="append", required=True, help="vLLM version (repeatable): 0.32.0, 0.33.0")
    p.add_argument("--classes", choices=("vllm", "kvoffload", "both"), default="both")
    p.add_argument("--out", type=Path, required=True, help="JSON file (merged with its other versions)")
    p.add_argument("--suite", action="append", choices=SUITES, help="only these suites (default: both)")
    p.add_argument("--python", default=sys.executable, help="the interpreter of the vLLM venv")
    p.add_argument("--vllm-path", type=Path, default=None, help="vLLM code put first on PYTHONPATH")
    p.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--timeout-s", type=int, default=1800, help="per pytest run")
    p.add_argument(
        "--compare-only",
        action="store_true",
        help="run nothing: recompute the table from the junit XML of the last runs (after editing reasons.py)",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if len(args.vllm) > 1 and args.vllm_path is not None:
        p.error("--vllm-path goes with one --vllm")
    command = "python bench/vllm_suites/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    for version in args.vllm:
        result = run_version(args, version)
        if not args.compare_only or not result.get("command"):
            result["command"] = command
        # read just before writing: runs of other versions may share the file
        data: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
        data["swap"] = "bench/vllm_suites/swap.py (pytest -p swap)"
        data.setdefault("versions", {})[version] = result
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
