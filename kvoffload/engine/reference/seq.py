"""Engine-side state of one request of the reference engine."""

from __future__ import annotations

from kvoffload.engine.reference.request import SimRequest

__all__ = ["Seq", "WAITING", "LOADING", "READY", "RUNNING", "FINISHED"]

WAITING, LOADING, READY, RUNNING, FINISHED = "waiting", "loading", "ready", "running", "finished"


class Seq:
    """Engine-side state of one request: status, computed tokens, per-group GPU block tables,
    and what its current admission did.

    Per admission: ``admit_len`` tokens (the request's ``num_tokens`` when admitted: its prompt,
    plus what it generated before a preemption), ``hit`` of them from the GPU prefix cache,
    ``ext`` offered by the CPU tier and ``loaded`` of those used (not recomputed), then
    ``prefill`` tokens computed up to ``admit_len`` and ``decode`` tokens computed after it.
    """

    __slots__ = ("req", "status", "num_computed", "tables", "hit", "ext", "admit_len", "loaded", "prefill", "decode")

    def __init__(self, req: SimRequest, num_groups: int) -> None:
        self.req = req
        self.status = WAITING
        self.num_computed = 0
        self.tables: list[list[int]] = [[] for _ in range(num_groups)]
        self.admit(0, 0, 0)

    def admit(self, admit_len: int, hit: int, ext: int) -> None:
        """Start a new admission (counters of the previous one are dropped)."""
        self.admit_len, self.hit, self.ext = admit_len, hit, ext
        self.loaded = self.prefill = self.decode = 0
