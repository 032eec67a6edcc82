"""KV bytes per token from Hugging Face configs on disk (``--model-config``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvoffload.app.cli import main
from kvoffload.errors import InvalidArgumentError
from kvoffload.simulate.model_config import read_model_config
from tests.simulate.mooncake_traces import random_mooncake, write_mooncake

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V3 = {
    "hidden_size": 7168,
    "num_attention_heads": 128,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
    "torch_dtype": "bfloat16",
}
GEMMA3_TEXT = {
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 5376,
        "num_attention_heads": 32,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "num_hidden_layers": 62,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
    },
    "torch_dtype": "bfloat16",
}


def _write(tmp_path: Path, cfg: dict[str, Any]) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_gqa_counts_k_and_v_of_the_kv_heads(tmp_path: Path) -> None:
    s = read_model_config(_write(tmp_path, LLAMA_8B))
    assert s.bytes_per_token == 32 * 2 * 8 * 128 * 2 == 128 * 1024  # the named 8b shape's
    assert (s.kind, s.sliding_layers) == ("gqa", 0)
    assert read_model_config(_write(tmp_path, LLAMA_8B), "fp8").bytes_per_token == 64 * 1024
    mha = {k: v for k, v in LLAMA_8B.items() if k != "num_key_value_heads"}
    assert read_model_config(_write(tmp_path, mha)).bytes_per_token == 32 * 2 * 32 * 128 * 2


def test_mla_counts_the_latent_and_the_rope_key(tmp_path: Path) -> None:
    s = read_model_config(_write(tmp_path, DEEPSEEK_V3))
    assert s.kind == "mla" and s.bytes_per_token == 61 * (512 + 64) * 2
    assert "MLA" in s.describe()


def test_sliding_window_hybrids_state_the_sliding_share(tmp_path: Path) -> None:
    s = read_model_config(_write(tmp_path, GEMMA3_TEXT))
    # every 6th layer is global: 62 - 10 = 52 sliding layers
    assert (s.layers, s.sliding_layers, s.sliding_window) == (62, 52, 1024)
    assert s.bytes_per_token == 62 * 2 * 16 * 128 * 2
    assert s.sliding_share == pytest.approx(52 / 62)
    types = ["sliding_attention", "full_attention"] * 12
    cfg = {**LLAMA_8B, "num_hidden_layers": 24, "layer_types": types, "sliding_window": 128}
    s = read_model_config(_write(tmp_path, cfg))
    assert (s.sliding_layers, s.sliding_share) == (12, 0.5) and "sliding-window" in s.describe()
    qwen = {**LLAMA_8B, "use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 28}
    assert read_model_config(_write(tmp_path, qwen)).sliding_layers == 4
    assert read_model_config(_write(tmp_path, {**qwen, "use_sliding_window": False})).sliding_layers == 0


@pytest.mark.parametrize(
    ("cfg", "needle"),
    [
        ({k: v for k, v in LLAMA_8B.items() if k != "num_hidden_layers"}, "missing field 'num_hidden_layers'"),
        ({k: v for k, v in DEEPSEEK_V3.items() if k != "qk_rope_head_dim"}, "missing field 'qk_rope_head_dim'"),
        ({k: v for k, v in LLAMA_8B.items() if k != "torch_dtype"}, "missing field 'torch_dtype'"),
        ({k: v for k, v in LLAMA_8B.items() if k != "hidden_size"}, "missing field 'hidden_size'"),
        ({**LLAMA_8B, "num_key_value_heads": "8"}, "field 'num_key_value_heads' must be a non-negative int"),
        ({**LLAMA_8B, "torch_dtype": "int4"}, "'torch_dtype' 'int4' is not one of"),
        ({**LLAMA_8B, "layer_types": ["full_attention"]}, "field 'layer_types' must list 32"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_configs_name_the_field(tmp_path: Path, cfg: Any, needle: str) -> None:
    with pytest.raises(InvalidArgumentError, match=needle.replace("(", r"\(")):
        read_model_config(_write(tmp_path, cfg))


def test_simulate_takes_the_config_and_refuses_mixing_it_with_shape_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_mooncake(tmp_path / "m.jsonl", random_mooncake(40, 2, block_tokens=64))
    cfg = _write(tmp_path, DEEPSEEK_V3)
    argv = ["simulate", "--trace", str(trace), "--trace-block-size", "64", "--replay", "cache", "--jobs", "1"]
    out = tmp_path / "o"
    assert main([*argv, "--policies", "lru", "--capacities", "8", "--model-config", str(cfg), "--out", str(out)]) == 0
    sweep = json.loads((out / "results.json").read_text())["sweep"]
    assert sweep["model_shape"]["bytes_per_token"] == 61 * 576 * 2
    assert main([*argv, "--capacities", "8", "--model-config", str(cfg), "--layers", "4", "--out", str(out)]) == 2
    assert "--model-config gives the shape: drop --layers" in capsys.readouterr().err
    rc = main([*argv, "--capacities", "8", "--model-config", str(cfg), "--replicas", "2", "--out", str(out)])
    assert rc == 2 and "needs --prefill-tokens-per-s" in capsys.readouterr().err
    rc = main([*argv, "--capacities", "8", "--model-config", str(cfg), "--replicas", "2",
               "--prefill-tokens-per-s", "5000", "--out", str(out)])  # fmt: skip
    assert rc == 0 and "5,000 prefill tokens/s (--prefill-tokens-per-s)" in capsys.readouterr().out
