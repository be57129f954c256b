"""Checks for policy parameters: they come from users (``cache_policy_params``, ``--param``),
so a bad one fails at construction with its name, the accepted range and the value given."""

from __future__ import annotations

import math


def check_int(name: str, value: object, low: int, high: int, why: str = "") -> int:
    """``value`` as an int in ``[low, high]``; ``TypeError`` / ``ValueError`` otherwise.

    ``why`` (e.g. ``" (ghosts per block)"``) is added to the range in the message.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}]{why}, got {value}")
    return value


def check_number(
    name: str,
    value: object,
    low: float,
    high: float,
    *,
    low_open: bool = False,
    high_open: bool = False,
    why: str = "",
) -> float:
    """``value`` as a float in the range from ``low`` to ``high`` (ends closed unless open).

    NaN is always out of range. ``TypeError`` for a non-number (``bool`` included),
    ``ValueError`` for a number out of range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    too_low = value <= low if low_open else value < low
    too_high = value >= high if high_open else value > high
    if math.isnan(value) or too_low or too_high:
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in {interval}{why}, got {value}")
    return float(value)


__all__ = ["check_int", "check_number"]
