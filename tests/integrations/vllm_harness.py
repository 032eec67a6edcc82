"""A model-free engine loop around vLLM's real Scheduler and OffloadingConnector (both roles), on CPU.

Test infrastructure of the integration tests: the "model" (:mod:`tests.integrations.harness_model`)
writes, for every scheduled token, a known value per (token id, position, channel) into a CPU KV
tensor; :meth:`Engine.check` (run after every step) verifies every computed position of every
running request against it. The model config is written to a temporary folder (OPT-shaped, tiny);
import this module after :func:`tests.integrations.vllm_env.require_vllm`, which sets
``HF_HUB_OFFLINE=1`` so that nothing is downloaded.

``Engine(async_scheduling=True)`` runs vLLM's ``AsyncScheduler`` with ``async_scheduling`` set in
the config (vLLM's CPU platform turns it off; the harness sets it back after the config is built,
which vLLM's scheduler reads, e.g. to defer freeing the blocks of a step in flight), and overlaps
steps as vLLM's engine core does with its batch queue of two (``step_with_batch_queue``): step N+1
is scheduled and executed before step N's output reaches ``update_from_output``.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from tests.integrations.harness_config import BLOCK_SIZE, DEFAULT_SHAPE, PAGE, SPEC_MODULE, Shape, make_config
from tests.integrations.harness_model import HEAD_DIM, HEADS, MAX_LEN, NULL_BLOCK, KVMismatch, ModelRunner, kv_value

LAYER = "model.layers.0.self_attn.attn"
SW_LAYER = "model.layers.1.self_attn.attn"


class Engine:
    """vLLM's Scheduler + the connector in both roles + a KV-writing fake model.

    Args:
        extra: ``kv_connector_extra_config``.
        num_gpu_blocks: GPU blocks in the shared pool.
        connector: ``"KVOffloadConnector"``, vLLM's ``"OffloadingConnector"``, or None: no KV
            connector (vLLM without offloading, the reference of generated tokens).
        sliding_window: if set, a second KV-cache group (one sliding-window layer of this many
            tokens) beside the full-attention one, sharing the block pool (a hybrid model).
        shape: block size, longest request and scheduler limits.
        check_kv: the model writes KV and :meth:`check` verifies it after every step; without
            it the model writes nothing and nothing is checked (tokens and transfers still run:
            for benchmarks of the scheduler side).
        async_scheduling: vLLM's ``AsyncScheduler``, steps overlapped as vLLM's engine core does
            (see the module's docstring).
    """

    def __init__(
        self,
        extra: dict[str, Any],
        num_gpu_blocks: int = 64,
        connector: str | None = "KVOffloadConnector",
        sliding_window: int | None = None,
        shape: Shape = DEFAULT_SHAPE,
        check_kv: bool = True,
        async_scheduling: bool = False,
    ) -> None:
        if check_kv and not shape.checkable:
            raise ValueError(
                f"check_kv needs max_len <= {MAX_LEN} (kv_value is exact in float32 up to there) and the default "
                f"KV ({HEADS} heads of {HEAD_DIM} float32 channels), got {shape}"
            )
        self.shape = shape
        self.check_kv = check_kv
        self.async_scheduling = async_scheduling
        bs = shape.block_size
        self.vllm_config = make_config(extra, connector, shape, async_scheduling)
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
        scheduler_class = AsyncScheduler if async_scheduling else Scheduler
        self.scheduler = scheduler_class(
            vllm_config=self.vllm_config,
            kv_cache_config=self.kv_cache_config,
            structured_output_manager=StructuredOutputManager(self.vllm_config),
            block_size=bs,
            log_stats=True,
        )
        self.worker_connector: Any = None
        if connector is not None:
            self.worker_connector = KVConnectorFactory.create_connector(
                self.vllm_config, KVConnectorRole.WORKER, self.kv_cache_config
            )
            self.worker_connector.register_kv_caches({name: kv for (name, _), kv in zip(specs, self.kvs, strict=True)})
        self.model = ModelRunner(self.kvs, bs, self._block_ids, async_scheduling, write_kv=check_kv)
        self.hasher = get_request_block_hasher(bs, sha256)
        self.outputs: dict[str, list[int]] = {}
        self.invalid_reported: set[int] = set()
        self.steps = 0
        #: steps executed whose output the scheduler has not seen yet, newest first (vLLM's batch queue)
        self.in_flight: deque[tuple[Any, ModelRunnerOutput]] = deque()
        #: steps in flight at most: vLLM's ``max_concurrent_batches`` (2 with async scheduling)
        self.batch_queue_size = self.vllm_config.max_concurrent_batches
        assert self.batch_queue_size == (2 if async_scheduling else 1)
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
        self,
        req_id: str,
        prompt: list[int],
        max_tokens: int = 3,
        kv_transfer_params: dict[str, Any] | None = None,
        stop_token_ids: list[int] | None = None,
    ) -> Request:
        """Queue a request of ``max_tokens`` output tokens (fewer if it samples a ``stop_token_ids``)."""
        extra = {"kv_transfer_params": kv_transfer_params} if kv_transfer_params is not None else None
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, stop_token_ids=stop_token_ids, extra_args=extra)
        req = Request(
            request_id=req_id,
            prompt_token_ids=list(prompt),
            sampling_params=params,
            pooling_params=None,
            block_hasher=self.hasher,
        )
        self.scheduler.add_request(req)
        self.outputs[req_id] = []
        return req

    def abort(self, req_id: str) -> None:
        """Abort a request (as the API server does when a client goes away), whatever is in flight."""
        self.scheduler.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)

    def _block_ids(self, req_id: str) -> list[list[int]]:
        return [list(g) for g in self.scheduler.kv_cache_manager.get_block_ids(req_id)]

    def step(self) -> Any:
        """One engine step: schedule, execute (worker-side connector calls and the model), then
        hand the oldest step in flight to ``update_from_output`` once the batch queue is full (at
        once without async scheduling). Returns the step's ``SchedulerOutput``."""
        sched_out = self.scheduler.schedule()
        self.in_flight.appendleft((sched_out, self._execute(sched_out)))
        if len(self.in_flight) >= self.batch_queue_size:
            self._update(*self.in_flight.pop())
        self.steps += 1
        if self.check_kv:
            self.check()
        return sched_out

    def _execute(self, sched_out: Any) -> ModelRunnerOutput:
        """The worker: the connector's worker-side calls around the model, as vLLM's model runner makes them."""
        wc = self.worker_connector
        if wc is None:
            req_ids, sampled = self.model.execute(sched_out)
            return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled_token_ids=sampled)
        meta = sched_out.kv_connector_metadata
        wc.handle_preemptions(meta)
        wc.bind_connector_metadata(meta)
        wc.start_load_kv(None)
        if self.after_load is not None:
            self.after_load(self)
        req_ids, sampled = self.model.execute(sched_out)
        wc.wait_for_save()
        sending, recving = wc.get_finished(sched_out.finished_req_ids)
        invalid = wc.get_block_ids_with_load_errors()
        self.invalid_reported |= invalid
        worker_meta = wc.build_connector_worker_meta()
        wc.clear_connector_metadata()
        return ModelRunnerOutput(
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

    def _update(self, sched_out: Any, out: ModelRunnerOutput) -> None:
        """The scheduler takes a step's output."""
        engine_out = self.scheduler.update_from_output(sched_out, out)
        for eco in engine_out.values():
            for o in eco.outputs:
                self.outputs[o.request_id].extend(o.new_token_ids)

    def flush(self) -> None:
        """Hand every step in flight to the scheduler (vLLM's engine core once nothing is left to schedule)."""
        while self.in_flight:
            self._update(*self.in_flight.pop())
        if self.check_kv:
            self.check()

    def check(self) -> int:
        """Verify every computed position of every running request; returns positions checked.

        In a sliding-window group only the positions inside the window of the next token are
        checked (older blocks may already be freed). The tokens are the scheduler's; under async
        scheduling a position computed by a step in flight whose token the scheduler has not seen
        yet (a placeholder) is checked after the step that sampled that token is taken."""
        n = 0
        for req in self.scheduler.running:
            toks = req.all_token_ids
            done = min(req.num_computed_tokens, len(toks))
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
        """A few empty steps so pending store completions reach the manager, then every step in
        flight is taken."""
        for _ in range(steps):
            self.step()
        self.flush()

    def reset_gpu(self) -> None:
        """Forget the GPU prefix cache and zero the KV tensor (only the CPU tier remains)."""
        assert not self.scheduler.has_unfinished_requests() and not self.in_flight
        assert self.scheduler.kv_cache_manager.reset_prefix_cache()
        for kv in self.kvs:
            kv.zero_()

    def settle(self, timeout: float = 60.0) -> None:
        """Step until the offloading manager has no transfer in flight (tier cascades included)."""
        deadline = time.monotonic() + timeout
        while True:
            self.flush()  # a step's output may complete transfers (and start tier cascades)
            if not self.manager.has_pending_work():
                return
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


__all__ = ["Engine", "KVMismatch", "Shape", "kv_value", "BLOCK_SIZE", "PAGE", "SPEC_MODULE", "make_config"]
