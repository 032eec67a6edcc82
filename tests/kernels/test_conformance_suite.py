"""The shipped conformance suite runs with the documented command, passes correct backends, fails broken ones."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run_suite(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "kvoffload.testing", *args]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("KVOFFLOAD_")}
    full_env.update(PYTHONPATH=str(ROOT), **(env or {}))
    proc = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def _count(out: str, word: str) -> int:
    m = re.search(rf"(\d+) {word}", out)
    return int(m.group(1)) if m else 0


@pytest.mark.slow
def test_documented_command_passes_torch_backend() -> None:
    rc, out = _run_suite("-p", "kvoffload.testing.plugin", "--kvoffload-backend=torch", "--kvoffload-device=cpu")
    assert rc == 0, out[-3000:]
    assert _count(out, "passed") >= 80 and _count(out, "failed") == 0


@pytest.mark.slow
def test_env_var_form_and_module_class_spec() -> None:
    rc, out = _run_suite(
        "-k",
        "test_pack_byte_exact and mla",
        env={"KVOFFLOAD_BACKEND": "kvoffload.kernels.torch_ref:TorchBackend", "KVOFFLOAD_TEST_DEVICE": "cpu"},
    )
    assert rc == 0, out[-3000:]
    assert _count(out, "passed") == 4


BROKEN = {  # class -> tests it must fail (each class is wrong in a different way)
    "ShiftedRecords": "byte_exact and flashinfer",
    "SkipsLastView": "byte_exact and mixed",
    "NoValidation": "bad_input and (out_of_range or host_too_small)",
}


@pytest.mark.slow
def test_suite_fails_broken_backends() -> None:
    """One run over three deliberately broken backends: each fails the tests aimed at its defect."""
    selection = " or ".join(f"({sel})" for sel in BROKEN.values())
    backends = [f"--kvoffload-backend=tests.kernels.broken_backends:{cls}" for cls in BROKEN]
    rc, out = _run_suite("-p", "kvoffload.testing.plugin", *backends, "--kvoffload-device=cpu", "-k", selection, "-rf")
    assert rc == 1, out[-3000:]
    failed = [line for line in out.splitlines() if line.startswith("FAILED")]
    for cls in BROKEN:
        assert sum(f":{cls}-" in line for line in failed) >= 4, (cls, out[-3000:])


@pytest.mark.parametrize("form", ["option", "env"])
def test_unknown_backend_is_one_usage_error(form: str) -> None:
    if form == "option":
        rc, out = _run_suite("-p", "kvoffload.testing.plugin", "--kvoffload-backend=nope", "--kvoffload-device=cpu")
    else:
        rc, out = _run_suite(env={"KVOFFLOAD_BACKEND": "nope", "KVOFFLOAD_TEST_DEVICE": "cpu"})
    assert rc in (2, 4), out[-3000:]  # interrupted by a collection error / usage error
    assert "unusable kernel backend(s): 'nope'" in out, out[-3000:]
    assert _count(out, "passed") == 0 and _count(out, "errors?") <= 1 and "setup" not in out.lower()
