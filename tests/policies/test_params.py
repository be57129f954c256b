"""The shared parameter checks: types, closed and open ends, NaN, and what the message says."""

from __future__ import annotations

import math

import pytest

from kvoffload.policies.params import check_int, check_number


def test_check_int() -> None:
    assert check_int("n", 3, 1, 3) == 3
    with pytest.raises(TypeError, match="n must be an int, got bool"):
        check_int("n", True, 0, 9)
    with pytest.raises(TypeError, match="got float"):
        check_int("n", 2.0, 0, 9)
    with pytest.raises(ValueError, match=r"n must be in \[1, 3\] \(why\), got 4"):
        check_int("n", 4, 1, 3, why=" (why)")


def test_check_number_ends() -> None:
    assert check_number("r", 0, 0, 1) == 0.0
    assert check_number("r", 1, 0, 1) == 1.0
    with pytest.raises(ValueError, match=r"r must be in \(0, 1\], got 0"):
        check_number("r", 0, 0, 1, low_open=True)
    with pytest.raises(ValueError, match=r"r must be in \[0, 1\), got 1"):
        check_number("r", 1, 0, 1, high_open=True)
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="r must be in"):
            check_number("r", bad, 0, 1)
    with pytest.raises(TypeError, match="r must be a number, got str"):
        check_number("r", "0.5", 0, 1)
    with pytest.raises(TypeError, match="got bool"):
        check_number("r", False, 0, 1)
