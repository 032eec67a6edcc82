"""A model-free engine loop around vLLM's real Scheduler and OffloadingConnector (both roles), on CPU.

Test infrastructure of the integration tests: the "model" writes, for every scheduled token, a
known value per (token id, position, channel) into a CPU KV tensor; :meth:`Engine.check` (run
after every step) verifies every computed position of every running request against it. The model
config is written to a temporary folder (OPT-shaped, tiny); import this module after
:func:`tests.integrations.vllm_env.require_vllm`, which sets ``HF_HUB_OFFLINE=1`` so that nothing
is downloaded.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import OPTConfig
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK_SIZE = 4  # tokens per GPU block
HEADS, HEAD_DIM = 2, 4  # page = 2 (K, V) * 4 tokens * 2 heads * 4 dims * 4 bytes = 256 bytes
LAYER = "model.layers.0.self_attn.attn"
SW_LAYER = "model.layers.1.self_attn.attn"
PAGE = 2 * BLOCK_SIZE * HEADS * HEAD_DIM * 4  # bytes of one GPU block
MAX_LEN = 256

SPEC_MODULE = "kvoffload.integrations.vllm"
NULL_BLOCK = 0  # vLLM's block pool hands block 0 out as the placeholder of freed window blocks


class KVMismatch(AssertionError):
    """A computed position holds KV that the model did not write for it."""


def kv_value(token: int, pos: int) -> torch.Tensor:
    """The KV the model writes for ``token`` at ``pos``: one distinct float per channel."""
    base = float((token * MAX_LEN + pos) * 32)
    return base + torch.arange(2 * HEADS * HEAD_DIM, dtype=torch.float32).reshape(2, HEADS, HEAD_DIM)


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the engine runs: tokens per GPU block, the longest request, the scheduler's limits, and
    the KV of one token in one layer (``kv_heads`` heads of ``head_dim`` channels of ``kv_dtype``;
    :meth:`Engine.check` needs the defaults, which :func:`kv_value` writes)."""

    block_size: int = BLOCK_SIZE
    max_len: int = MAX_LEN
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 64
    kv_heads: int = HEADS
    head_dim: int = HEAD_DIM
    kv_dtype: torch.dtype = torch.float32

    @property
    def page(self) -> int:
        """Bytes of one GPU block (K and V of every head)."""
        return 2 * self.block_size * self.kv_heads * self.head_dim * self.kv_dtype.itemsize

    @property
    def checkable(self) -> bool:
        """Whether :func:`kv_value` fits this shape's KV (what ``check_kv`` needs)."""
        return (self.kv_heads, self.head_dim, self.kv_dtype) == (HEADS, HEAD_DIM, torch.float32) and (
            self.max_len <= MAX_LEN
        )


@functools.lru_cache(maxsize=8)
def _base_config(shape: Shape) -> VllmConfig:
    # one fixed folder per user: engines in several processes name the same model (the model name
    # is part of a shared tier's namespace)
    heads = shape.kv_heads
    d = os.path.join(tempfile.gettempdir(), f"kvoffload-opt-{os.getuid()}-{shape.max_len}-{heads}x{shape.head_dim}")
    if not os.path.exists(os.path.join(d, "config.json")):
        tmp = tempfile.mkdtemp(prefix="kvoffload-opt-")
        OPTConfig(
            num_hidden_layers=1,
            hidden_size=heads * shape.head_dim,
            num_attention_heads=heads,
            ffn_dim=16,
            vocab_size=1000,
            max_position_embeddings=shape.max_len,
        ).save_pretrained(tmp)
        try:
            os.rename(tmp, d)  # atomic; another process may have won
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    mc = ModelConfig(
        model=d, tokenizer=d, skip_tokenizer_init=True, dtype="float32", max_model_len=shape.max_len, seed=0
    )
    sc = SchedulerConfig(
        max_num_seqs=shape.max_num_seqs,
        max_num_batched_tokens=shape.max_num_batched_tokens,
        max_model_len=shape.max_len,
        is_encoder_decoder=False,
    )
    sc.async_scheduling = False
    kt = KVTransferConfig(kv_connector="KVOffloadConnector", kv_connector_module_path=SPEC_MODULE, kv_role="kv_both")
    vc = VllmConfig(
        model_config=mc,
        cache_config=CacheConfig(block_size=shape.block_size, enable_prefix_caching=True),
        scheduler_config=sc,
        device_config=DeviceConfig("cpu"),
        kv_transfer_config=kt,
    )
    init_none_hash(sha256)
    return vc


def make_config(extra: dict[str, Any], connector: str = "KVOffloadConnector", shape: Shape = Shape()) -> VllmConfig:
    """A VllmConfig whose connector is ``connector`` with ``kv_connector_extra_config=extra``."""
    vc = copy.copy(_base_config(shape))
    module = SPEC_MODULE if connector == "KVOffloadConnector" else None
    vc.kv_transfer_config = KVTransferConfig(
        kv_connector=connector,
        kv_connector_module_path=module,
        kv_role="kv_both",
        kv_load_failure_policy="recompute",
        kv_connector_extra_config=dict(extra),
    )
    return vc


class Engine:
    """vLLM's Scheduler + the connector in both roles + a KV-writing fake model.

    Args:
        extra: ``kv_connector_extra_config``.
        num_gpu_blocks: GPU blocks in the shared pool.
        connector: ``"KVOffloadConnector"`` or vLLM's ``"OffloadingConnector"``.
        sliding_window: if set, a second KV-cache group (one sliding-window layer of this many
            tokens) beside the full-attention one, sharing the block pool (a hybrid model).
        shape: block size, longest request and scheduler limits.
        check_kv: the model writes KV and :meth:`check` verifies it after every step; without
            it the model writes nothing and nothing is checked (tokens and transfers still run:
            for benchmarks of the scheduler side).
    """

    def __init__(
        self,
        extra: dict[str, Any],
        num_gpu_blocks: int = 64,
        connector: str = "KVOffloadConnector",
        sliding_window: int | None = None,
        shape: Shape = Shape(),
        check_kv: bool = True,
    ) -> None:
        if check_kv and not shape.checkable:
            raise ValueError(
                f"check_kv needs max_len <= {MAX_LEN} (kv_value is exact in float32 up to there) and the default "
                f"KV ({HEADS} heads of {HEAD_DIM} float32 channels), got {shape}"
            )
        self.shape = shape
        self.check_kv = check_kv
        bs = shape.block_size
        self.vllm_config = make_config(extra, connector, shape)
        self.vllm_config.cache_config = copy.copy(self.vllm_config.cache_config)
        self.vllm_config.cache_config.num_gpu_blocks = num_gpu_blocks
        layer = dict(block_size=bs, num_kv_heads=shape.kv_heads, head_size=shape.head_dim, dtype=shape.kv_dtype)
        specs: list[tuple[str, Any]] = [(LAYER, FullAttentionSpec(**layer))]  # type: ignore[arg-type]
        if sliding_window is not None:
            specs.append((SW_LAYER, SlidingWindowSpec(**layer, sliding_window=sliding_window)))  # type: ignore[arg-type]
        self.windows = [None, sliding_window]
        #: one KV tensor per group (its single layer)
        kv_shape = (num_gpu_blocks, 2, bs, shape.kv_heads, shape.head_dim)
        self.kvs = [torch.zeros(kv_shape, dtype=shape.kv_dtype) for _ in specs]
        self.kv = self.kvs[0]
        size = self.kv.numel() * self.kv.element_size()
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_gpu_blocks,
            kv_cache_tensors=[
                KVCacheTensor(size=size, layers=[name], layer_stride=size, block_stride=shape.page) for name, _ in specs
            ],
            kv_cache_groups=[KVCacheGroupSpec([name], spec) for name, spec in specs],
        )
        self.scheduler = Scheduler(
            vllm_config=self.vllm_config,
            kv_cache_config=self.kv_cache_config,
            structured_output_manager=StructuredOutputManager(self.vllm_config),
            block_size=bs,
            log_stats=True,
        )
        self.worker_connector = KVConnectorFactory.create_connector(
            self.vllm_config, KVConnectorRole.WORKER, self.kv_cache_config
        )
        self.worker_connector.register_kv_caches({name: kv for (name, _), kv in zip(specs, self.kvs, strict=True)})
        self.hasher = get_request_block_hasher(bs, sha256)
        self.outputs: dict[str, list[int]] = {}
        self.invalid_reported: set[int] = set()
        self.steps = 0
        #: called after the worker's loads ran, before the model writes (tests corrupt things here)
        self.after_load: Callable[[Engine], None] | None = None

    # ------------------------------------------------------------------ plumbing
    @property
    def connector(self) -> Any:
        """The scheduler-role connector."""
        return self.scheduler.connector

    @property
    def manager(self) -> Any:
        return self.connector.connector_scheduler.manager

    @property
    def worker(self) -> Any:
        return self.worker_connector.connector_worker.worker

    def add(
        self, req_id: str, prompt: list[int], max_tokens: int = 3, kv_transfer_params: dict[str, Any] | None = None
    ) -> Request:
        extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params is not None else None
        req = Request(
            request_id=req_id,
            prompt_token_ids=list(prompt),
            sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=extra),
            pooling_params=None,
            block_hasher=self.hasher,
        )
        self.scheduler.add_request(req)
        self.outputs[req_id] = []
        return req

    def _block_ids(self, req_id: str) -> list[list[int]]:
        return [list(g) for g in self.scheduler.kv_cache_manager.get_block_ids(req_id)]

    def step(self) -> Any:
        sched_out = self.scheduler.schedule()
        meta = sched_out.kv_connector_metadata
        wc = self.worker_connector
        wc.handle_preemptions(meta)
        wc.bind_connector_metadata(meta)
        wc.start_load_kv(None)
        if self.after_load is not None:
            self.after_load(self)
        req_ids = list(sched_out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in req_ids:
            req = self.scheduler.requests[rid]
            n = sched_out.num_scheduled_tokens[rid]
            end = req.num_computed_tokens  # already advanced by schedule()
            toks = req.all_token_ids
            if self.check_kv:
                self._write(rid, toks, end - n, end)
            sampled.append([(len(toks) * 7 + sum(toks[-3:])) % 1000] if end >= req.num_tokens else [])
        wc.wait_for_save()
        sending, recving = wc.get_finished(sched_out.finished_req_ids)
        invalid = wc.get_block_ids_with_load_errors()
        self.invalid_reported |= invalid
        worker_meta = wc.build_connector_worker_meta()
        wc.clear_connector_metadata()
        out = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(
                finished_sending=sending or None,
                finished_recving=recving or None,
                invalid_block_ids=invalid,
                kv_connector_worker_meta=worker_meta,
            ),
        )
        engine_out = self.scheduler.update_from_output(sched_out, out)
        for eco in engine_out.values():
            for o in eco.outputs:
                self.outputs[o.request_id].extend(o.new_token_ids)
        self.steps += 1
        if self.check_kv:
            self.check()
        return sched_out

    def _write(self, rid: str, toks: list[int], start: int, end: int) -> None:
        """The model: the KV of positions ``start..end-1`` of request ``rid``."""
        bs = self.shape.block_size
        for kv, blocks in zip(self.kvs, self._block_ids(rid), strict=True):
            for pos in range(start, end):
                b = blocks[pos // bs]
                if b != NULL_BLOCK:  # a sliding-window block already out of the window
                    kv[b, :, pos % bs] = kv_value(toks[pos], pos)

    def check(self) -> int:
        """Verify every computed position of every running request; returns positions checked.

        In a sliding-window group only the positions inside the window of the next token are
        checked (older blocks may already be freed)."""
        n = 0
        for req in self.scheduler.running:
            toks = req.all_token_ids
            done = req.num_computed_tokens
            for g, (kv, blocks) in enumerate(zip(self.kvs, self._block_ids(req.request_id), strict=True)):
                window = self.windows[g]
                first = 0 if window is None else max(0, done - window + 1)
                for pos in range(first, done):
                    b = blocks[pos // self.shape.block_size]
                    if b == NULL_BLOCK or not torch.equal(
                        kv[b, :, pos % self.shape.block_size], kv_value(toks[pos], pos)
                    ):
                        raise KVMismatch(
                            f"step {self.steps}: request {req.request_id} group {g} position {pos} holds wrong KV"
                        )
                    n += 1
        return n

    def run(self, max_steps: int = 500) -> None:
        """Step until every request finished."""
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished_requests():
                self.drain()
                return
            self.step()
        raise AssertionError(f"requests still unfinished after {max_steps} steps")

    def drain(self, steps: int = 3) -> None:
        """A few empty steps so pending store completions reach the manager."""
        for _ in range(steps):
            self.step()

    def reset_gpu(self) -> None:
        """Forget the GPU prefix cache and zero the KV tensor (only the CPU tier remains)."""
        assert not self.scheduler.has_unfinished_requests()
        assert self.scheduler.kv_cache_manager.reset_prefix_cache()
        for kv in self.kvs:
            kv.zero_()

    def settle(self, timeout: float = 60.0) -> None:
        """Step until the offloading manager has no transfer in flight (tier cascades included)."""
        deadline = time.monotonic() + timeout
        while self.manager.has_pending_work():
            if time.monotonic() > deadline:
                raise AssertionError(f"offloading transfers still pending after {timeout} s")
            self.step()
            time.sleep(0.002)

    def close(self) -> None:
        """Shut the manager and the worker down (releases a shared region and tier connections)."""
        self.manager.shutdown()
        self.worker.shutdown()

    def finished_ok(self, req_id: str) -> bool:
        return req_id not in self.scheduler.requests and len(self.outputs[req_id]) > 0


__all__ = ["Engine", "KVMismatch", "Shape", "kv_value", "BLOCK_SIZE", "PAGE", "make_config"]
