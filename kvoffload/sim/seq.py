"""Engine-side state of one request of the reference engine."""

from __future__ import annotations

from kvoffload.sim.request import SimRequest

__all__ = ["Seq", "WAITING", "LOADING", "READY", "RUNNING", "FINISHED"]

WAITING, LOADING, READY, RUNNING, FINISHED = "waiting", "loading", "ready", "running", "finished"


class Seq:
    """Engine-side state of one request: status, computed tokens, per-group GPU block tables,
    and the GPU hit / loaded token counts of its last admission."""

    __slots__ = ("req", "status", "num_computed", "tables", "hit", "ext")

    def __init__(self, req: SimRequest, num_groups: int) -> None:
        self.req = req
        self.status = WAITING
        self.num_computed = 0
        self.tables: list[list[int]] = [[] for _ in range(num_groups)]
        self.hit = 0
        self.ext = 0
