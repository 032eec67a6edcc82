"""Plain-Python reference model of the CPU offloading manager (OrderedDict per list, one object per block).

Written independently of kvoffload.cache.manager, straight from docs/contract.md §2/§3 and the policy
docstrings, one key at a time. The property tests drive both with the same operations and
compare every output and the full internal order.
"""

from __future__ import annotations

from collections import OrderedDict

from tests.cache.headstart_reference import RefHeadStart

PENDING = -1


class Block:
    __slots__ = ("slot", "ref")

    def __init__(self, slot: int) -> None:
        self.slot = slot
        self.ref = PENDING


class RefError(Exception):
    """Raised where the real manager must raise KeyStateError."""


def _evictable(b: Block) -> bool:
    return b.ref == 0


class RefLRU:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[bytes, Block] = OrderedDict()

    def get(self, key: bytes) -> Block | None:
        return self.blocks.get(key)

    def insert(self, key: bytes, b: Block) -> None:
        self.blocks[key] = b

    def remove(self, key: bytes) -> None:
        del self.blocks[key]

    def touch(self, keys: list[bytes]) -> None:
        for key in reversed(keys):
            if key in self.blocks:
                self.blocks.move_to_end(key)

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, Block]] | None:
        out = []
        for key, b in self.blocks.items():
            if len(out) == n:
                break
            if _evictable(b) and key not in protected:
                out.append((key, b))
        if len(out) < n:
            return None
        for key, _ in out:
            del self.blocks[key]
        return out

    def clear(self) -> None:
        self.blocks.clear()

    def snapshot(self) -> object:
        return list(self.blocks)


class RefARC:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.t1: OrderedDict[bytes, Block] = OrderedDict()
        self.t2: OrderedDict[bytes, Block] = OrderedDict()
        self.b1: OrderedDict[bytes, None] = OrderedDict()
        self.b2: OrderedDict[bytes, None] = OrderedDict()
        self.target = 0.0

    def get(self, key: bytes) -> Block | None:
        b = self.t1.get(key)
        return b if b is not None else self.t2.get(key)

    def insert(self, key: bytes, b: Block) -> None:
        self.t1[key] = b
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: bytes) -> None:
        if key in self.t1:
            del self.t1[key]
        else:
            del self.t2[key]

    def touch(self, keys: list[bytes]) -> None:
        for key in reversed(keys):
            if key in self.t1:
                b = self.t1.pop(key)
                if b.ref == PENDING:
                    self.t1[key] = b
                else:
                    self.t2[key] = b
            elif key in self.t2:
                self.t2.move_to_end(key)
            elif key in self.b1:
                self.target = min(self.target + max(1.0, len(self.b2) / len(self.b1)), float(self.capacity))
                self.b1.move_to_end(key)
            elif key in self.b2:
                self.target = max(self.target - max(1.0, len(self.b1) / len(self.b2)), 0.0)
                self.b2.move_to_end(key)

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, Block]] | None:
        chosen: list[tuple[bytes, Block, bool]] = []
        taken: set[bytes] = set()

        def first(od: OrderedDict[bytes, Block]) -> tuple[bytes, Block] | None:
            for key, b in od.items():
                if _evictable(b) and key not in protected and key not in taken:
                    return key, b
            return None

        vt1 = len(self.t1)
        while len(chosen) < n:
            pick = None
            if vt1 >= int(self.target):
                e = first(self.t1)
                if e is not None:
                    pick = (e[0], e[1], True)
                    vt1 -= 1
            if pick is None:
                e = first(self.t2)
                if e is not None:
                    pick = (e[0], e[1], False)
                else:  # T2 has no victim: fall back to T1 (as vLLM 0.32 does)
                    e = first(self.t1)
                    if e is None:
                        return None
                    pick = (e[0], e[1], True)
                    vt1 -= 1
            chosen.append(pick)
            taken.add(pick[0])
        for key, _, from_t1 in chosen:
            if from_t1:
                del self.t1[key]
                self.b1[key] = None
            else:
                del self.t2[key]
                self.b2[key] = None
        for ghost in (self.b1, self.b2):
            while len(ghost) > self.capacity:
                ghost.popitem(last=False)
        return [(k, b) for k, b, _ in chosen]

    def clear(self) -> None:
        self.t1.clear()
        self.t2.clear()
        self.b1.clear()
        self.b2.clear()
        self.target = 0.0

    def snapshot(self) -> object:
        return (list(self.t1), list(self.t2), list(self.b1), list(self.b2), self.target)


class RefS3FIFO:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.small_target = max(1, capacity // 10)
        self.s: OrderedDict[bytes, Block] = OrderedDict()
        self.m: OrderedDict[bytes, Block] = OrderedDict()
        self.freq: dict[bytes, int] = {}
        self.ghost: OrderedDict[bytes, None] = OrderedDict()

    def get(self, key: bytes) -> Block | None:
        b = self.s.get(key)
        return b if b is not None else self.m.get(key)

    def insert(self, key: bytes, b: Block) -> None:
        self.freq[key] = 0
        if key in self.ghost:
            del self.ghost[key]
            self.m[key] = b
        else:
            self.s[key] = b

    def remove(self, key: bytes) -> None:
        if key in self.s:
            del self.s[key]
        else:
            del self.m[key]
        del self.freq[key]

    def touch(self, keys: list[bytes]) -> None:
        for key in set(keys):
            if key in self.freq:
                self.freq[key] = min(self.freq[key] + 1, 3)

    def evict(self, n: int, protected: set[bytes]) -> list[tuple[bytes, Block]] | None:
        def first(od: OrderedDict[bytes, Block]) -> bytes | None:
            for key, b in od.items():
                if _evictable(b) and key not in protected:
                    return key
            return None

        out: list[tuple[bytes, Block]] = []
        while len(out) < n:
            ks, km = first(self.s), first(self.m)
            if ks is not None and (len(self.s) >= self.small_target or km is None):
                b = self.s.pop(ks)
                if self.freq[ks] > 0:
                    self.freq[ks] = 0
                    self.m[ks] = b
                else:
                    del self.freq[ks]
                    self.ghost[ks] = None
                    out.append((ks, b))
            elif km is not None:
                if self.freq[km] > 0:
                    self.freq[km] -= 1
                    self.m.move_to_end(km)
                else:
                    b = self.m.pop(km)
                    del self.freq[km]
                    out.append((km, b))
            else:
                raise AssertionError("reference s3fifo: nothing evictable (manager pre-check broken)")
        while len(self.ghost) > self.capacity:
            self.ghost.popitem(last=False)
        return out

    def clear(self) -> None:
        self.s.clear()
        self.m.clear()
        self.freq.clear()
        self.ghost.clear()

    def snapshot(self) -> object:
        return (list(self.s), list(self.m), list(self.ghost), sorted(self.freq.items()))


#: ``request_lru`` without key positions (these tests' contexts carry none) orders blocks as LRU does
POLICIES = {"lru": RefLRU, "request_lru": RefLRU, "arc": RefARC, "s3fifo": RefS3FIFO, "headstart": RefHeadStart}


class RefManager:
    """The manager contract of docs/contract.md §2, one key at a time."""

    def __init__(self, num_blocks: int, policy: str) -> None:
        self.num_blocks = num_blocks
        self.allocated = 0
        self.free: list[int] = []
        self.policy = POLICIES[policy](num_blocks)
        self.events: list[tuple[list[bytes], bool]] = []

    def lookup(self, key: bytes) -> bool | None:
        b = self.policy.get(key)
        if b is None:
            return False
        return True if b.ref >= 0 else None

    def prepare_load(self, keys: list[bytes]) -> list[int]:
        blocks = []
        for key in keys:
            b = self.policy.get(key)
            if b is None or b.ref < 0:
                raise RefError(key)
            blocks.append(b)
        for b in blocks:
            b.ref += 1
        return [b.slot for b in blocks]

    def complete_load(self, keys: list[bytes]) -> None:
        need: dict[bytes, int] = {}
        for key in keys:
            need[key] = need.get(key, 0) + 1
        for key, c in need.items():
            b = self.policy.get(key)
            if b is None or b.ref < c:
                raise RefError(key)
        for key in keys:
            self.policy.get(key).ref -= 1  # type: ignore[union-attr]

    def touch(self, keys: list[bytes]) -> None:
        self.policy.touch(keys)

    def prepare_store(self, keys: list[bytes]) -> tuple[list[bytes], list[int], list[bytes]] | None:
        to_store = [k for k in keys if self.policy.get(k) is None]
        if not to_store:
            return [], [], []
        free = self.num_blocks - self.allocated + len(self.free)
        need = len(to_store) - free
        evicted: list[bytes] = []
        if need > 0:
            evictable = [k for k in self.all_keys() if self.policy.get(k).ref == 0 and k not in keys]
            if len(evictable) < need:  # room cannot be made: change nothing
                return None
            got = self.policy.evict(need, set(keys))
            if got is None:
                return None
            for key, b in got:
                self.free.append(b.slot)
                evicted.append(key)
            self.events.append((evicted, True))
        slots = []
        for key in to_store:
            if self.allocated < self.num_blocks:
                slot = self.allocated
                self.allocated += 1
            else:
                slot = self.free.pop()
            b = Block(slot)
            self.policy.insert(key, b)
            slots.append(slot)
        return to_store, slots, evicted

    def complete_store(self, keys: list[bytes], success: bool) -> None:
        done = []
        for key in keys:
            b = self.policy.get(key)
            if b is None or b.ref != PENDING:
                continue
            if success:
                b.ref = 0
                done.append(key)
            else:
                self.policy.remove(key)
                self.free.append(b.slot)
        if done:
            self.events.append((done, False))

    def all_keys(self) -> list[bytes]:
        p = self.policy
        if isinstance(p, RefLRU):
            return list(p.blocks)
        if isinstance(p, RefARC):
            return list(p.t1) + list(p.t2)
        if isinstance(p, RefHeadStart):
            return p.keys()
        return list(p.s) + list(p.m)

    def reset(self) -> None:
        self.policy.clear()
        self.allocated = 0
        self.free.clear()

    def take_events(self) -> list[tuple[list[bytes], bool]]:
        out, self.events = self.events, []
        return out

    def state(self, universe: list[bytes]) -> dict[bytes, tuple[int, int]]:
        """key -> (slot, ref) for present keys of ``universe``."""
        out = {}
        for key in universe:
            b = self.policy.get(key)
            if b is not None:
                out[key] = (b.slot, b.ref)
        return out


def test_reference_model_reproduces_the_worked_lru_scenario() -> None:
    """The reference itself must pass the issue's worked example (else it proves nothing)."""

    def k(i: int) -> bytes:
        return str(i).encode() + b"\0\0\0\0"

    m = RefManager(4, "lru")
    assert m.prepare_store([k(1), k(2)]) == ([k(1), k(2)], [0, 1], [])
    assert m.lookup(k(1)) is None
    m.complete_store([k(1), k(2)], True)
    assert m.prepare_store([k(2), k(3), k(4), k(5)]) == ([k(3), k(4), k(5)], [2, 3, 0], [k(1)])
    assert m.prepare_store([k(1), k(6)]) is None
    m.complete_store([k(2), k(3), k(4), k(5)], True)
    assert m.prepare_load([k(2), k(3)]) == [1, 2]
    assert m.prepare_store([k(6), k(7), k(8)]) is None
    m.complete_load([k(2), k(3)])
    assert m.prepare_store([k(6), k(7), k(8)]) == ([k(6), k(7), k(8)], [3, 2, 1], [k(2), k(3), k(4)])
    m.complete_store([k(6), k(7), k(8)], True)
    m.touch([k(5), k(6), k(7)])
    assert m.prepare_store([k(9)]) == ([k(9)], [1], [k(8)])
    m.complete_store([k(7), k(9)], False)
    assert m.lookup(k(7)) is True and m.lookup(k(9)) is False
    ev = m.take_events()
    assert [e for e, removed in ev if not removed] == [[k(1), k(2)], [k(3), k(4), k(5)], [k(6), k(7), k(8)]]
    assert [e for e, removed in ev if removed] == [[k(1)], [k(2), k(3), k(4)], [k(8)]]
