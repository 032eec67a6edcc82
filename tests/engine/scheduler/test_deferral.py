"""DeferredLookups: a deferred request stays deferred, asked the same, until a key it waits on
resolves -- through the scheduler (resolve) or the manager (take_resolved, drained first)."""

from __future__ import annotations

from kvoffload.engine.scheduler.deferral import DeferredLookups, request_signature
from tests.engine.scheduler.conftest import make_req


class Resolved:
    """A manager's record of resolved keys: ``take()`` hands over what was added since."""

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.takes = 0

    def take(self) -> list[bytes]:
        self.takes += 1
        out, self.keys = self.keys, []
        return out


def test_deferred_until_a_waited_key_resolves() -> None:
    rec = Resolved()
    d = DeferredLookups(rec.take)
    assert rec.takes == 1  # the manager's record starts before any deferral
    req = make_req("R", 16, 4, tag="d")
    sig = request_signature(req, 0, 16)
    assert not d.still_deferred("R", sig)  # never deferred
    d.defer("R", sig, [b"k1", b"k2", b"k1"])
    d.defer("S", ("other",) * 4, [b"k2", b"k3"])  # type: ignore[arg-type]
    assert len(d) == 2
    assert d.still_deferred("R", sig)
    d.resolve([b"zz"])  # not waited on
    rec.keys.append(b"k9")
    assert d.still_deferred("R", sig)
    rec.keys.append(b"k2")  # the manager resolved a key both wait on
    assert not d.still_deferred("R", sig)
    assert not d.still_deferred("S", ("other",) * 4)  # type: ignore[arg-type]
    assert len(d) == 0 and not d._watch


def test_scheduler_side_resolution_and_signature() -> None:
    rec = Resolved()
    d = DeferredLookups(rec.take)
    req = make_req("R", 16, 4, tag="e")
    sig = request_signature(req, 0, 16)
    d.defer("R", sig, [b"a", b"b"])
    assert not d.still_deferred("R", request_signature(req, 4, 16))  # other computed tokens
    assert not d.still_deferred("R", request_signature(req, 0, 12))  # other tokens
    longer = make_req("R", 20, 4, tag="e")
    assert not d.still_deferred("R", request_signature(longer, 0, 16))  # more hashes
    assert d.still_deferred("R", sig)
    d.resolve([b"b"])
    assert not d.still_deferred("R", sig)
    # forget / clear drop the record and its watched keys
    d.defer("R", sig, [b"a"])
    d.forget("R")
    assert not d.still_deferred("R", sig) and not d._watch
    d.defer("R", sig, [b"a"])
    d.clear()
    assert not d.still_deferred("R", sig) and not d._watch
    d.defer("R", sig, [])  # nothing to wait on: not remembered
    assert len(d) == 0


def test_poll_keeps_the_managers_record_short() -> None:
    rec = Resolved()
    d = DeferredLookups(rec.take)
    rec.keys.extend([b"x", b"y"])
    d.poll()
    assert rec.keys == [] and rec.takes == 2
