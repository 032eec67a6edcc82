"""Workload classes for the ``headstart`` policy: which request tags place blocks that are read again.

The "KVCache in the wild" study (Alibaba Bailian traces, USENIX ATC 2025) finds that reuse depends
on the request's type and turn. When requests carry a workload tag (``ReqContext.workload``, e.g.
``"text/1"``), :class:`TagClasses` learns online, per tag, how often the blocks its requests
stored or read were read again before being evicted, and calls a tag *hot* when that rate is well
above the rate of all tagged blocks. ``headstart`` then puts the first-sight blocks a hot tag's
request stores straight on its seen list (as if seen before).

Rules (the reference model in the tests implements exactly these):

* tags get class ids ``1, 2, ...`` in first-seen order, at most :data:`MAX_TAGS`; a request without a
  tag, or with a tag beyond those, is class 0. Until the first tag arrives nothing is kept (tags
  absent cost one test per call).
* every block carries the class of the last request that stored or read it (its *label*).
* a present block read by a request (a touch; at a request's end, the blocks it did not only store)
  counts one *reuse* for its label, then takes the request's class; an evicted block counts one
  *eviction* for its label. After each such call, once ``max(capacity, WINDOW)`` reuses and
  evictions were counted since the last halving, every count is halved (integer ``>> 1``).
* class ``t`` is hot iff ``t != 0``, ``reused[t] + evicted[t] >= MIN_COUNT`` and
  ``2 * reused[t] * all > 3 * (reused[t] + evicted[t]) * reused_all`` (``all`` and ``reused_all``
  summed over classes ``>= 1``): its blocks are read again more than 1.5 times as often as tagged
  blocks are on average.

Memory: one ``uint8`` label per block and two ``int64[MAX_TAGS + 1]`` count arrays (4 KB).
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["MAX_TAGS", "MIN_COUNT", "WINDOW", "TagClasses"]

#: distinct tags with their own class (later ones share class 0 with untagged requests)
MAX_TAGS = 255
#: reuses + evictions a class needs before it can be hot
MIN_COUNT = 16
#: counts are halved every ``max(capacity, WINDOW)`` counted reuses and evictions
WINDOW = 1024


class TagClasses:
    """Per-tag reuse counts and block labels (module docstring).

    Args:
        capacity: the policy's capacity in blocks.
    """

    def __init__(self, capacity: int) -> None:
        self.window = max(capacity, WINDOW)
        self.label = np.zeros(capacity, dtype=np.uint8)
        self.ids: dict[str, int] = {}
        self.reused = np.zeros(MAX_TAGS + 1, dtype=np.int64)
        self.evicted = np.zeros(MAX_TAGS + 1, dtype=np.int64)
        self.counted = 0

    def class_of(self, tag: str | None) -> int:
        """The class id of ``tag`` (0: none), assigning the next id to a new tag."""
        if tag is None:
            return 0
        t = self.ids.get(tag)
        if t is None:
            if len(self.ids) >= MAX_TAGS:
                return 0
            t = self.ids[tag] = len(self.ids) + 1
        return t

    def hot(self, t: int) -> bool:
        """Whether class ``t``'s blocks are read again well above the tagged average."""
        if t == 0:
            return False
        r, tot = int(self.reused[t]), int(self.reused[t] + self.evicted[t])
        if tot < MIN_COUNT:
            return False
        r_all = int(self.reused[1:].sum())
        return 2 * r * (r_all + int(self.evicted[1:].sum())) > 3 * tot * r_all

    def read(self, slots: np.ndarray, t: int) -> None:
        """Present blocks ``slots`` (distinct) were read by a request of class ``t``."""
        self.reused += np.bincount(self.label[slots], minlength=MAX_TAGS + 1)
        self.label[slots] = t
        self._count(len(slots))

    def gone(self, slots: np.ndarray) -> None:
        """Blocks ``slots`` were evicted."""
        self.evicted += np.bincount(self.label[slots], minlength=MAX_TAGS + 1)
        self._count(len(slots))

    def _count(self, n: int) -> None:
        self.counted += n
        if self.counted >= self.window:
            self.reused >>= 1
            self.evicted >>= 1
            self.counted = 0

    def clear(self) -> None:
        self.label[:] = 0
        self.ids.clear()
        self.reused[:] = 0
        self.evicted[:] = 0
        self.counted = 0

    def nbytes(self) -> int:
        return self.label.nbytes + self.reused.nbytes + self.evicted.nbytes
