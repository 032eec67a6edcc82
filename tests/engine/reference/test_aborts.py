"""The reference engine aborts requests in any state, telling the scheduler as vLLM does (issue 15).

vLLM's scheduler frees (and reports to its connector) also a request aborted while still waiting,
which the offloading side may never have seen, and reporting a request that finished already is
harmless. The engine does both; every loaded byte is still checked afterwards.
"""

from __future__ import annotations

import pytest

from kvoffload.engine.reference.config import GroupConfig
from kvoffload.engine.reference.request import SimRequest
from kvoffload.errors import InvalidArgumentError
from tests.engine.reference.helpers import make_engine, run, tokens


def test_aborts_in_every_state_keep_the_engine_correct() -> None:
    eng = make_engine(
        [GroupConfig(4, 2)],
        enable_gpu_prefix_cache=False,
        transfer_latency_steps=2,
        max_num_batched_tokens=16,
        num_gpu_blocks=40,
    )
    sched = eng.scheduler
    p = tokens(48)
    run(eng, SimRequest("a", p, max_tokens=2))  # its prompt goes to the CPU tier

    # waiting, never seen by the scheduler
    eng.add_request(SimRequest("w", tokens(20, seed=1)))
    assert sched.get_request_state("w") is None
    assert eng.abort_request("w") is True and eng.status_of("w") == "finished"

    # loading: its load job is in flight (2 steps of latency)
    eng.add_request(SimRequest("b", list(p)))
    eng.step()
    assert eng.status_of("b") == "loading" and sched.num_in_flight_jobs == 1
    assert eng.abort_request("b") is True and sched.get_request_state("b") is None

    # running, with a store job in flight
    eng.add_request(SimRequest("r", tokens(40, seed=2), max_tokens=4))
    while eng.status_of("r") != "running" or not sched.get_request_state("r").in_flight:
        eng.step()
    assert eng.abort_request("r") is True

    # finished already, and aborted already: finished again at the scheduler (a no-op there)
    assert eng.abort_request("a") is False and eng.abort_request("w") is False
    assert eng.abort_request("b") is False
    with pytest.raises(InvalidArgumentError, match="never added"):
        eng.abort_request("nobody")

    # the engine goes on: the same prompt loads again and every loaded block is right
    run(eng, SimRequest("c", list(p)), SimRequest("d", tokens(20, seed=1)))
    s = eng.stats
    assert s.requests_aborted == 3 and s.requests_finished == 3
    assert s.blocks_loaded > 0 and s.verified_blocks > 0 and s.verification_failures == 0
    assert s.computed_tokens == s.prefill_computed_tokens + s.decode_tokens + s.discarded_tokens
    assert sched.num_in_flight_jobs == 0 and not sched._states
    st = eng.manager.get_stats()
    assert st.num_pinned == 0 and st.num_pending == 0
