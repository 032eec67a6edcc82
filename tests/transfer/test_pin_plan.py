"""Where a host pool is page-locked (kvoffload.transfer.pin_plan): row-aligned, bounded chunks that
cover exactly the used rows, or each row's used range alone in a shared region's wide rows."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from kvoffload.transfer.pin_plan import MIN_SAVED_BYTES_PER_ROW, RegisterPlan, plan_registrations

P = 4096
MiB = 1 << 20


def _used_ranges(base: int, n: int, stride: int, used: int, end: int) -> list[tuple[int, int]]:
    return [(base + r * stride, min(base + r * stride + used, end)) for r in range(n)]


def check_plan(plan: RegisterPlan, base: int, n: int, stride: int, used: int, end: int) -> None:
    """The plan's invariants, checked independently of how it was built."""
    starts, sizes = plan.starts.tolist(), plan.sizes.tolist()
    assert starts and all(s % P == 0 for s in starts) and all(z > 0 and z % P == 0 for z in sizes)
    ends = [s + z for s, z in zip(starts, sizes, strict=True)]
    assert all(e <= s for e, s in zip(ends, starts[1:], strict=False)), "registrations overlap (or are unordered)"
    assert plan.rows.tolist() == sorted(plan.rows.tolist()) and int(plan.rows[-1]) == n
    rows = _used_ranges(base, n, stride, used, end)
    for r, (a, b) in enumerate(rows):  # each row's used bytes in exactly one registration, the right one
        holders = [i for i, (s, e) in enumerate(zip(starts, ends, strict=True)) if s <= a and b <= e]
        assert len(holders) == 1, f"row {r} [{a}, {b}) is not inside one registration"
        i = holders[0]
        assert (int(plan.rows[i - 1]) if i else 0) <= r < int(plan.rows[i])
    if plan.per_row:
        assert [(s, e) for s, e in zip(starts, ends, strict=True)] == [(a // P * P, -(-b // P) * P) for a, b in rows], (
            "a row's registration is not its used range rounded out to pages"
        )
    else:  # one run of pages from the first row's page to the last used byte's page, no gap
        assert starts[0] == base // P * P and ends[-1] == -(-rows[-1][1] // P) * P
        assert all(e == s for e, s in zip(ends, starts[1:], strict=False))
    # cuts: exactly the boundaries at which two contiguous rows' used bytes meet
    want = [c - base for (_, b), (c, _) in zip(rows, rows[1:], strict=False) if b == c and c in starts[1:]]
    assert plan.cuts.tolist() == want


@pytest.mark.parametrize(
    ("base", "n", "stride", "used", "bound"),
    [
        (0, 10, 8192, 8192, 20000),  # 2 rows per chunk
        (0, 10, 8192, 8000, 20000),  # rows do not touch: no cut
        (0, 10, 6144, 6144, 20000),  # every other row boundary is on a page
        (0, 64, 5000, 5000, 3 * P),  # none within the bound: one oversized chunk
        (0, 1100, 5000, 5000, 1 << 20),  # boundaries only every 512 rows
        (100, 10, 8192, 8192, 20000),  # a pool off the page grid, rows touching: no boundary at all
        (3 * 1024, 12, 4 * P, 1024, 6 * P),  # one worker's area of each row, small saving: whole rows
        (0, 5, MiB, MiB, 100),  # bound below a row: one row per chunk
        (0, 7, 9 * P, 9 * P, 64 << 30),  # fits one chunk
        (0, 1, 100, 100, 1),
    ],
)
def test_whole_row_chunks(base: int, n: int, stride: int, used: int, bound: int) -> None:
    end = base + n * stride
    plan = plan_registrations(base, n, stride, used, end, bound, P)
    assert not plan.per_row and plan.first_chunk == 1
    check_plan(plan, base, n, stride, used, end)
    # within the bound, unless no page-aligned row boundary lies within it
    for s, z in zip(plan.starts.tolist(), plan.sizes.tolist(), strict=True):
        if z > bound:
            assert not any(
                s < (base + r * stride) // P * P <= s + bound
                and (base + r * stride) // P * P >= base + (r - 1) * stride + used
                for r in range(1, n)
            )
    # chunks as large as the bound allows: the next one could not have started later
    for i in range(len(plan) - 1):
        s = int(plan.starts[i])
        later = [
            (base + r * stride) // P * P
            for r in range(int(plan.rows[i]) + 1, n)
            if (base + r * stride) // P * P >= base + (r - 1) * stride + used
        ]
        assert not any(x - s <= bound for x in later) or int(plan.sizes[i]) > bound


def test_whole_row_chunk_counts() -> None:
    assert len(plan_registrations(0, 10, 8192, 8192, 10 * 8192, 20000, P)) == 5
    assert plan_registrations(0, 10, 8192, 8192, 10 * 8192, 20000, P).cuts.tolist() == [
        16384,
        32768,
        49152,
        65536,
    ]
    assert len(plan_registrations(100, 10, 8192, 8192, 100 + 10 * 8192, 20000, P)) == 1
    assert len(plan_registrations(0, 1100, 5000, 5000, 1100 * 5000, 1 << 20, P)) == 3  # rows 512, 1024


def test_short_last_row_is_covered_to_the_pool_end() -> None:
    base, n, stride = 1000, 3, 4 * P
    end = base + 2 * stride + 700  # the mapping ends 700 bytes into the last row
    plan = plan_registrations(base, n, stride, stride, end, 1 << 30, P)
    check_plan(plan, base, n, stride, stride, end)
    assert int(plan.starts[-1] + plan.sizes[-1]) == -(-end // P) * P


@pytest.mark.parametrize(("rank", "workers"), [(0, 2), (1, 2), (2, 3)])
def test_per_row_in_a_shared_region(rank: int, workers: int) -> None:
    """vLLM's shared region: row c holds every worker's area; a worker registers only its area of
    each row, rounded out to pages, when that saves >= 3 MiB per row."""
    area = 3 * MiB + 1234
    row = -(-workers * area // P) * P
    n = 6
    base, end = rank * area, n * row
    plan = plan_registrations(base, n, row, area, end, 2 * (area + 2 * P), P)
    assert plan.per_row and plan.rows.tolist() == list(range(1, n + 1))
    check_plan(plan, base, n, row, area, end)
    assert plan.nbytes < n * row - (workers - 1) * n * area + 2 * n * P  # only this worker's areas (and their pages)
    assert plan.first_chunk == 2 and plan.cuts.size == 0


def test_per_row_only_when_it_saves_enough() -> None:
    used = 4 * P
    enough = used + max(P, MIN_SAVED_BYTES_PER_ROW)
    assert plan_registrations(0, 4, enough, used, 4 * enough, 1 << 30, P).per_row
    assert not plan_registrations(0, 4, enough - P, used, 4 * (enough - P), 1 << 30, P).per_row


def test_oversized_chunk_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="kvoffload.transfer.pin_plan"):
        plan = plan_registrations(0, 64, 5000, 5000, 64 * 5000, 3 * P, P)
    assert int(plan.sizes.max()) > 3 * P
    assert any("exceeds the bound" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kvoffload.transfer.pin_plan"):
        plan_registrations(0, 10, 8192, 8192, 10 * 8192, 20000, P)
    assert not caplog.records


def test_random_geometries() -> None:
    rng = np.random.default_rng(7)
    for _ in range(300):
        stride = int(rng.integers(1, 5 * P))
        used = int(rng.integers(1, stride + 1))
        n = int(rng.integers(1, 80))
        base = int(rng.integers(0, 3 * P))
        end = base + (n - 1) * stride + int(rng.integers(1, stride + 1))
        bound = int(rng.integers(1, 12 * P))
        check_plan(plan_registrations(base, n, stride, used, end, bound, P), base, n, stride, used, end)
