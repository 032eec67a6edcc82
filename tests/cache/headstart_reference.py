"""Plain-Python reference model of the ``headstart`` policy, one key at a time.

Written from the rules in the docstrings of kvoffload/cache/policies/headstart.py,
headstart_tuner.py and ghost.py, without their code: lists and dicts instead of slot arrays,
pure-Python integer arithmetic for the fingerprint, a list per ghost bucket, a list scan for each
small cache's oldest block. The manager property tests compare it with the real policy after
every operation (lists, stamps, head start).
"""

from __future__ import annotations

import zlib
from collections import OrderedDict
from typing import Any

CANDIDATES = (0.0, 1.0, 4.0, 16.0)
SAMPLE_BLOCKS = 128
WAYS = 16
M32 = 0xFFFFFFFF


def fingerprint(key: bytes) -> int:
    """lowbias32(crc32(key))."""
    x = zlib.crc32(key)
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    x ^= x >> 16
    return x


class RefGhost:
    """The last ``size`` fingerprints added, in buckets of WAYS overwritten in turn."""

    def __init__(self, size: int) -> None:
        self.size = size
        b = 1
        while b * WAYS < 2 * size:
            b *= 2
        self.nb = b
        self.entries = [[(0, 0)] * WAYS for _ in range(b)]
        self.cursor = [0] * b
        self.added = 0

    def contains_pop(self, f: int) -> bool:
        row = self.entries[f % self.nb]
        for i, (v, seq) in enumerate(row):
            if v == f | 1 and (self.added - seq) % 2**32 <= self.size:
                row[i] = (0, seq)
                return True
        return False

    def add(self, fps: list[int]) -> None:
        """One call: sequence numbers in order; per bucket, its keys latest first, at most WAYS."""
        by_bucket: dict[int, list[tuple[int, int]]] = {}
        for i, f in enumerate(fps):
            by_bucket.setdefault(f % self.nb, []).append((f | 1, (self.added + i) % 2**32))
        for b, items in by_bucket.items():
            for v, seq in reversed(items[-WAYS:]):
                self.entries[b][self.cursor[b]] = (v, seq)
                self.cursor[b] = (self.cursor[b] + 1) % WAYS
        self.added += len(fps)


class RefSmallCache:
    def __init__(self, size: int, h: float) -> None:
        self.size = size
        self.h = h
        self.new: list[list[Any]] = []  # [fingerprint, stamp], oldest first
        self.seen: list[list[Any]] = []
        self.ghost: list[int] = []
        self.clock = 0
        self.hits = 0

    def access(self, key: int) -> None:
        for lst in (self.seen, self.new):
            for i, (k, _) in enumerate(lst):
                if k == key:
                    self.hits += 1
                    del lst[i]
                    self.seen.append([key, self.clock])
                    return
        if len(self.new) + len(self.seen) >= self.size:
            if self.new and (not self.seen or self.new[0][1] <= self.seen[0][1] + self.h * self.size):
                victim = self.new.pop(0)[0]
            else:
                victim = self.seen.pop(0)[0]
            self.ghost.append(victim)
            if len(self.ghost) > 4 * self.size:
                self.ghost.pop(0)
        if key in self.ghost:
            self.ghost.remove(key)
            self.seen.append([key, self.clock])
        else:
            self.new.append([key, self.clock])
        self.clock += 1


class RefTuner:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.threshold = min(4096, -(-4096 * SAMPLE_BLOCKS // capacity))
        self.mini = max(1, capacity * self.threshold // 4096)
        self.clear()

    def clear(self) -> None:
        self.caches = [RefSmallCache(self.mini, h) for h in CANDIDATES]
        self.choice = 0
        self.head_start = 0
        self.count = 0

    def observe(self, keys: list[bytes]) -> None:
        for key in keys:
            f = fingerprint(key)
            if f >> 20 >= self.threshold:
                continue
            for c in self.caches:
                c.access(f)
            self.count += 1
            if self.count == self.mini:
                self.count = 0
                hits = [c.hits for c in self.caches]
                if hits[self.choice] < max(hits):
                    self.choice = hits.index(max(hits))
                    self.head_start = round(CANDIDATES[self.choice] * self.capacity)
                for c in self.caches:
                    c.hits //= 2


class RefTags:
    """Per-tag reuse counts (headstart_tags.py's rules), keyed by OffloadKey."""

    def __init__(self, capacity: int) -> None:
        self.window = max(capacity, 1024)
        self.ids: dict[str, int] = {}
        self.label: dict[bytes, int] = {}
        self.reused = [0] * 256
        self.evicted = [0] * 256
        self.counted = 0

    def class_of(self, tag: str | None) -> int:
        if tag is None:
            return 0
        if tag not in self.ids:
            if len(self.ids) >= 255:
                return 0
            self.ids[tag] = len(self.ids) + 1
        return self.ids[tag]

    def hot(self, t: int) -> bool:
        if t == 0:
            return False
        r, tot = self.reused[t], self.reused[t] + self.evicted[t]
        r_all = sum(self.reused[1:])
        return tot >= 16 and 2 * r * (r_all + sum(self.evicted[1:])) > 3 * tot * r_all

    def count(self, n: int) -> None:
        self.counted += n
        if self.counted >= self.window:
            self.reused = [x // 2 for x in self.reused]
            self.evicted = [x // 2 for x in self.evicted]
            self.counted = 0

    def read(self, keys: list[bytes], t: int) -> None:
        for k in keys:
            self.reused[self.label.get(k, 0)] += 1
            self.label[k] = t
        self.count(len(keys))

    def gone(self, keys: list[bytes]) -> None:
        for k in keys:
            self.evicted[self.label.pop(k, 0)] += 1
        self.count(len(keys))


class RefHeadStart:
    """The policy over blocks with ``.ref`` (0 = evictable), keyed by OffloadKey; ``workload`` is
    the current request's tag (set by the test before each call)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.new: OrderedDict[bytes, Any] = OrderedDict()
        self.seen: OrderedDict[bytes, Any] = OrderedDict()
        self.stamp: dict[bytes, int] = {}
        self.ghost = RefGhost(max(1, 4 * capacity))
        self.queued: list[int] = []  # victims' fingerprints not yet in the ghost history
        self.tuner = RefTuner(max(capacity, 1))
        self.tags = RefTags(capacity)
        self.workload: str | None = None
        self.clock = 0

    def tagged(self) -> bool:
        return self.workload is not None or bool(self.tags.ids)

    def get(self, key: bytes) -> Any:
        b = self.new.get(key)
        return b if b is not None else self.seen.get(key)

    def insert(self, key: bytes, b: Any) -> None:
        self.tuner.observe([key])
        ghost_hit = self.ghost.contains_pop(fingerprint(key))
        hot = False
        if self.tagged():
            t = self.tags.class_of(self.workload)
            self.tags.label[key] = t
            hot = self.tags.hot(t)
        if ghost_hit or hot:
            self.seen[key] = b
        else:
            self.new[key] = b
        self.stamp[key] = self.clock
        self.clock += 1

    def remove(self, key: bytes) -> None:
        if key in self.new:
            del self.new[key]
        else:
            del self.seen[key]
        del self.stamp[key]

    def touch(self, keys: list[bytes]) -> None:
        present = [k for k in dict.fromkeys(keys) if self.get(k) is not None]
        if present and self.tagged():
            self.tags.read(present, self.tags.class_of(self.workload))
        self.tuner.observe(present)
        for key in reversed(present):
            b = self.new.pop(key) if key in self.new else self.seen.pop(key)
            self.seen[key] = b
            self.stamp[key] = self.clock

    def request_finished(self, keys: list[bytes], inserted_only: set[bytes]) -> None:
        present = [k for k in dict.fromkeys(keys) if self.get(k) is not None]
        if present and self.tagged():
            self.tags.read([k for k in present if k not in inserted_only], self.tags.class_of(self.workload))
        self.tuner.observe([k for k in present if k not in inserted_only])
        for key in reversed(present):
            if key in inserted_only:
                od = self.new if key in self.new else self.seen
                od.move_to_end(key)
            else:
                b = self.new.pop(key) if key in self.new else self.seen.pop(key)
                self.seen[key] = b
            self.stamp[key] = self.clock

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, Any]] | None:
        def first(od: OrderedDict[bytes, Any]) -> bytes | None:
            for key, b in od.items():
                if b.ref == 0 and key not in protected:
                    return key
            return None

        out: list[tuple[bytes, Any]] = []
        while len(out) < n:
            kn, ks = first(self.new), first(self.seen)
            if kn is None and ks is None:
                raise AssertionError("reference headstart: nothing evictable (manager pre-check broken)")
            if kn is not None and (ks is None or self.stamp[kn] <= self.stamp[ks] + self.tuner.head_start):
                key, od = kn, self.new
            else:
                key, od = ks, self.seen  # type: ignore[assignment]
            out.append((key, od.pop(key)))
            del self.stamp[key]
            self.queued.append(fingerprint(key))
        if len(self.queued) >= max(1, min(1024, self.ghost.size // 64)):
            self.ghost.add(self.queued)
            self.queued = []
        if self.tags.ids:
            self.tags.gone([k for k, _ in out])
        return out

    def clear(self) -> None:
        self.new.clear()
        self.seen.clear()
        self.stamp.clear()
        self.ghost = RefGhost(max(1, 4 * self.capacity))
        self.queued.clear()
        self.tuner.clear()
        self.tags = RefTags(self.capacity)
        self.clock = 0

    def keys(self) -> list[bytes]:
        return list(self.new) + list(self.seen)

    def snapshot(self) -> object:
        return (list(self.new), list(self.seen), sorted(self.stamp.items()), self.tuner.head_start, self.clock)
