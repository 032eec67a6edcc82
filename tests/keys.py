"""Keys, request contexts and policy names shared by the tests (one place instead of a copy per file)."""

from __future__ import annotations

from kvoffload.cache.policies import available_policies
from kvoffload.core.base import ReqContext, make_offload_key

__all__ = ["CTX", "K0", "K1", "POLICIES", "ctx", "k", "ks"]

#: a request context for calls that need one (its id does not matter)
CTX = ReqContext(req_id="r")
#: group-0 keys (they end in four NUL bytes, which numpy's fixed-width bytes dtype strips)
K0 = [make_offload_key(b"hash%04d" % i, 0) for i in range(40)]
#: group-1 keys
K1 = [make_offload_key(b"hash%04d" % i, 1) for i in range(40)]
#: every registered cache policy, read from the registry when the tests are collected: a new
#: policy is tested by every policy-parametrised test without editing a list
POLICIES: list[str] = available_policies()


def k(i: int | str, group: int = 0) -> bytes:
    """The key of block ``i`` of KV-cache group ``group``."""
    return make_offload_key(str(i).encode(), group)


def ks(*ids: int | str) -> list[bytes]:
    """The keys of blocks ``ids`` (group 0)."""
    return [k(i) for i in ids]


def ctx(req_id: str) -> ReqContext:
    """A context for request ``req_id``."""
    return ReqContext(req_id=req_id)
