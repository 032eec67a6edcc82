"""The products the docs label (docs/contract.md §1): loading kvoffload as vLLM loads it (the
connector's module, its spec, manager and worker built) brings in nothing of the engine kit
(``engine``, ``app``, ``testing``) or of the sizing tool (``simulate``)."""

from __future__ import annotations

from tests.integrations.vllm_env import require_vllm

require_vllm()

import subprocess  # noqa: E402
import sys  # noqa: E402

#: the engine kit's and the sizing tool's modules: a vLLM deployment never loads them
KIT = ("kvoffload.engine", "kvoffload.simulate", "kvoffload.app", "kvoffload.testing")


def test_vllm_path_loads_no_engine_kit_module() -> None:
    code = (
        "import sys\n"
        "from tests.integrations.vllm_harness import Engine, PAGE\n"
        "e = Engine({'spec_name': 'KVOffloadSpec', 'spec_module_path': 'kvoffload.integrations.vllm',"
        " 'cpu_bytes_to_use': 64 * PAGE})\n"
        "e.add('a', list(range(1, 30)))\n"
        "e.run()\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('kvoffload')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    loaded = set(out.stdout.split())
    assert "kvoffload.integrations.vllm.worker" in loaded and "kvoffload.cache.manager" in loaded
    assert sorted(m for m in loaded if m.startswith(KIT)) == []
