"""kvoffload.checks: ints, bools and id arrays, one message per fault."""

from __future__ import annotations

import numpy as np
import pytest

from kvoffload.checks import INT64_MAX, check_bool, check_int, check_int_array, id_array, id_list
from kvoffload.errors import InvalidArgumentError, InvalidTypeError


def test_check_int() -> None:
    assert check_int(3, "n") == 3 and type(check_int(np.int32(3), "n")) is int
    with pytest.raises(InvalidTypeError, match=r"n must be an int, got bool True"):
        check_int(True, "n")
    with pytest.raises(InvalidTypeError, match="n must be an int"):
        check_int(1.0, "n")
    with pytest.raises(InvalidArgumentError, match=r"n must be >= 1, got 0"):
        check_int(0, "n", 1)


def test_check_bool() -> None:
    assert check_bool(np.bool_(True), "f") is True
    for bad in (0, 1, None, "yes"):
        with pytest.raises(InvalidTypeError, match="f must be a bool"):
            check_bool(bad, "f")


@pytest.mark.parametrize("conv", [id_array, id_list])
def test_id_conversions_agree(conv: object) -> None:
    for good in ([0, 5, INT64_MAX], np.array([1, 2], dtype=np.uint32), (3,), []):
        out = conv(good, "ids")  # type: ignore[operator]
        assert list(out) == [int(v) for v in good]
    cases: list[tuple[object, type[Exception], str]] = [
        ([1, 2**63], InvalidArgumentError, r"ids\[1\] must be <= 2\*\*63 - 1"),
        (np.array([2**63], dtype=np.uint64), InvalidArgumentError, r"ids\[0\] must be <= 2\*\*63 - 1"),
        ([1, True], InvalidTypeError, r"ids\[1\] must be an int"),
        (np.array([1.5]), InvalidTypeError, "ids must hold integers"),
        (np.zeros((2, 2), dtype=np.int64), InvalidArgumentError, "ids must be 1-D"),
        ("12", InvalidTypeError, "ids must be a sequence of ints"),
        (7, InvalidTypeError, "ids must be a sequence of ints"),
    ]
    for bad, err, msg in cases:
        with pytest.raises(err, match=msg):
            conv(bad, "ids")  # type: ignore[operator]


def test_negative_ids_are_refused_by_id_list_and_kept_by_id_array() -> None:
    """A spec's ids (id_array) are range-checked by the worker that receives them."""
    for bad in ([1, -2], np.array([3, -1])):
        with pytest.raises(InvalidArgumentError, match=r"ids\[1\] must be non-negative"):
            id_list(bad, "ids")
        assert id_array(bad, "ids").tolist() == list(bad)


def test_id_array_is_a_private_read_only_copy() -> None:
    src = np.array([1, 2], dtype=np.int64)
    out = id_array(src, "ids")
    src[0] = 9
    assert out.tolist() == [1, 2] and not out.flags.writeable


def test_check_int_array_keeps_negatives_and_int64_input() -> None:
    src = np.array([-1, 2], dtype=np.int64)
    assert check_int_array(src, "x") is src
    assert check_int_array([-3], "x").tolist() == [-3]
