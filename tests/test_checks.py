"""The one validator: types, closed, open and missing ends, NaN, and what the message says."""

from __future__ import annotations

import math

import pytest

from kvoffload._checks import check_bool, check_callable, check_int, check_number


def test_check_int() -> None:
    assert check_int("n", 3, 1, 3) == 3
    assert check_int("n", 10**30, 0) == 10**30  # no upper end
    with pytest.raises(TypeError, match=r"n must be an int in \[0, 9\], got bool True"):
        check_int("n", True, 0, 9)
    with pytest.raises(TypeError, match=r"got float 2\.0"):
        check_int("n", 2.0, 0, 9)
    with pytest.raises(ValueError, match=r"n must be an int in \[1, 3\] \(why\), got 4"):
        check_int("n", 4, 1, 3, why=" (why)")
    with pytest.raises(ValueError, match="n must be an int >= 1 or None, got 0"):
        check_int("n", 0, 1, or_none=True)
    with pytest.raises(ValueError, match="n must be an int <= 5, got 6"):
        check_int("n", 6, None, 5)


def test_check_number_ends() -> None:
    assert check_number("r", 0, 0, 1) == 0.0
    assert check_number("r", 1, 0, 1) == 1.0
    with pytest.raises(ValueError, match=r"r must be a finite number in \(0, 1\], got 0"):
        check_number("r", 0, 0, 1, low_open=True)
    with pytest.raises(ValueError, match=r"r must be a finite number in \[0, 1\), got 1"):
        check_number("r", 1, 0, 1, high_open=True)
    with pytest.raises(ValueError, match="r must be a finite number > 0, got 0"):
        check_number("r", 0, 0, low_open=True)
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError, match="r must be a finite number"):
            check_number("r", bad, 0, 1)
        with pytest.raises(ValueError, match="r must be a finite number"):
            check_number("r", bad)
    with pytest.raises(TypeError, match=r"r must be a finite number in .*, got str .0\.5."):
        check_number("r", "0.5", 0, 1)
    with pytest.raises(TypeError, match="got bool"):
        check_number("r", False, 0, 1)


def test_check_bool_and_callable() -> None:
    assert check_bool("b", False) is False
    with pytest.raises(TypeError, match="b must be True or False, got int 1"):
        check_bool("b", 1)
    assert check_callable("f", len, "a function") is len
    with pytest.raises(TypeError, match="f must be a function, got str 'x'"):
        check_callable("f", "x", "a function")


def test_long_values_are_cut_in_messages() -> None:
    with pytest.raises(TypeError) as info:
        check_int("n", "y" * 500)
    assert len(str(info.value)) < 120
