"""The model of the vLLM harness (:mod:`tests.integrations.vllm_harness`): a model runner that
computes nothing but writes, for every scheduled token, a known KV value, and samples a token that
is a function of the sequence so far.

It knows each request only as a vLLM worker does, from the ``SchedulerOutput`` of each step: the
prompt of a new request, the computed-token and output-token counts of a running one, the token
ids of a resumed one, and the tokens it sampled itself. Under async scheduling the scheduler
schedules a decode before it has seen the token that decode reads (a placeholder); the model then
reads the token it sampled one step before, as vLLM's GPU model runner does. Its rules are those of
vLLM's (V1) GPU model runner: output tokens beyond the scheduler's count are dropped (a step whose
output the scheduler discarded, e.g. after a failed KV load), and a request resumed from preemption
under async scheduling takes its output tokens from the scheduler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

HEADS, HEAD_DIM = 2, 4  # the KV of one token in one layer: 2 heads of 4 float32 channels (K and V)
MAX_LEN = 256  # kv_value is exact in float32 up to here
NULL_BLOCK = 0  # vLLM's block pool hands block 0 out as the placeholder of freed window blocks


class KVMismatch(AssertionError):
    """A computed position holds KV that the model did not write for it."""


def kv_value(token: int, pos: int) -> torch.Tensor:
    """The KV the model writes for ``token`` at ``pos``: one distinct float per channel."""
    base = float((token * MAX_LEN + pos) * 32)
    return base + torch.arange(2 * HEADS * HEAD_DIM, dtype=torch.float32).reshape(2, HEADS, HEAD_DIM)


def sample(tokens: Sequence[int]) -> int:
    """The token the model samples after ``tokens`` (the whole sequence, prompt first)."""
    return (len(tokens) * 7 + sum(tokens[-3:])) % 1000


class ModelRunner:
    """The worker's view of the requests, the KV writes and the sampling of one engine.

    Args:
        kvs: one KV tensor per KV-cache group, ``(blocks, 2, block_size, heads, head_dim)``.
        block_size: tokens per GPU block.
        block_ids: a request's GPU block ids per group (vLLM's KV-cache manager's, as the
            scheduler output hands them to the worker).
        async_scheduling: vLLM's ``async_scheduling`` (how a resumed request gets its tokens).
        write_kv: write KV (without it only tokens are sampled).
    """

    def __init__(
        self,
        kvs: list[torch.Tensor],
        block_size: int,
        block_ids: Callable[[str], list[list[int]]],
        async_scheduling: bool,
        write_kv: bool,
    ) -> None:
        self.kvs = kvs
        self.block_size = block_size
        self.block_ids = block_ids
        self.async_scheduling = async_scheduling
        self.write_kv = write_kv
        #: per request: its prompt then the output tokens this worker knows (sampled or sent)
        self.tokens: dict[str, list[int]] = {}
        self.prompt_len: dict[str, int] = {}

    def execute(self, sched_out: Any) -> tuple[list[str], list[list[int]]]:
        """Run one step: the scheduled requests (in order) and the tokens sampled for each (none
        for a prefill chunk that does not reach the end of the known tokens)."""
        starts = self._update_states(sched_out)
        req_ids = list(sched_out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for rid in req_ids:
            toks = self.tokens[rid]
            start, n = starts[rid], sched_out.num_scheduled_tokens[rid]
            assert start + n <= len(toks), f"{rid}: scheduled up to {start + n}, the worker knows {len(toks)} tokens"
            if self.write_kv:
                self._write(rid, toks, start, start + n)
            if start + n == len(toks):
                toks.append(sample(toks))
                sampled.append([toks[-1]])
            else:
                sampled.append([])
        return req_ids, sampled

    def _update_states(self, sched_out: Any) -> dict[str, int]:
        """Apply the scheduler output to the worker's requests; returns each scheduled request's
        first position of this step."""
        for rid in sched_out.finished_req_ids:
            self.tokens.pop(rid, None)
            self.prompt_len.pop(rid, None)
        starts: dict[str, int] = {}
        for new in sched_out.scheduled_new_reqs:
            self.tokens[new.req_id] = list(new.prompt_token_ids)
            self.prompt_len[new.req_id] = len(new.prompt_token_ids)
            starts[new.req_id] = new.num_computed_tokens
        cached = sched_out.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            starts[rid] = cached.num_computed_tokens[i]
            num_out, prompt = cached.num_output_tokens[i], self.prompt_len[rid]
            toks = self.tokens[rid]
            if rid in cached.resumed_req_ids and self.async_scheduling and num_out > 0:
                # the tokens of the steps in flight at preemption reach the worker from the scheduler
                toks[prompt:] = cached.all_token_ids[rid][-num_out:]
            elif num_out < len(toks) - prompt:
                del toks[prompt + num_out :]  # output the scheduler discarded
        return starts

    def _write(self, rid: str, toks: list[int], start: int, end: int) -> None:
        """The KV of positions ``start..end-1`` of request ``rid``."""
        bs = self.block_size
        for kv, blocks in zip(self.kvs, self.block_ids(rid), strict=True):
            for pos in range(start, end):
                b = blocks[pos // bs]
                if b != NULL_BLOCK:  # a sliding-window block already out of the window
                    kv[b, :, pos % bs] = kv_value(toks[pos], pos)


__all__ = ["HEADS", "HEAD_DIM", "MAX_LEN", "NULL_BLOCK", "KVMismatch", "ModelRunner", "kv_value", "sample"]
