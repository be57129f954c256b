"""The one validator for user-given parameters (policy params, config keys, CLI flags).

One rule everywhere: a wrong type is a ``TypeError``, a wrong value a ``ValueError``, and each
message names the parameter, what it accepts and what was given, so the same key gives the
same error through a config, the CLI and a constructor. ``bool`` is never a number here.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any


def _given(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _bounds(
    low: float | None, high: float | None, low_open: bool = False, high_open: bool = False
) -> str:
    if low is not None and high is not None:
        return f" in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    if low is not None:
        return f" {'>' if low_open else '>='} {low}"
    if high is not None:
        return f" {'<' if high_open else '<='} {high}"
    return ""


def check_int(
    name: str,
    value: object,
    low: int | None = None,
    high: int | None = None,
    why: str = "",
    *,
    or_none: bool = False,
) -> int:
    """``value`` as an int in ``[low, high]`` (``None`` for an end: unbounded there).

    ``why`` (e.g. ``" (ghosts per block)"``) is added to what the message says is accepted;
    ``or_none=True`` only says that ``None`` is accepted too (the caller handles it).
    """
    accepts = f"an int{_bounds(low, high)}{why}{' or None' if or_none else ''}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {accepts}, got {type(value).__name__} {_given(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise ValueError(f"{name} must be {accepts}, got {value}")
    return value


def check_number(
    name: str,
    value: object,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    why: str = "",
    or_none: bool = False,
) -> float:
    """``value`` as a finite float between ``low`` and ``high`` (ends closed unless open).

    NaN and infinities are always out of range. ``TypeError`` for a non-number (``bool``
    included), ``ValueError`` for a number out of range.
    """
    accepts = (
        f"a finite number{_bounds(low, high, low_open, high_open)}{why}"
        f"{' or None' if or_none else ''}"
    )
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be {accepts}, got {type(value).__name__} {_given(value)}")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if not math.isfinite(value) or too_low or too_high:
        raise ValueError(f"{name} must be {accepts}, got {value}")
    return float(value)


def check_bool(name: str, value: object) -> bool:
    """``value`` as ``True`` or ``False`` (no truthy stand-ins: ``1``, ``"yes"``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {_given(value)}")
    return value


def check_callable(name: str, value: object, accepts: str) -> Callable[..., Any]:
    """``value`` if it can be called; ``accepts`` says what the call must do."""
    if not callable(value):
        raise TypeError(f"{name} must be {accepts}, got {type(value).__name__} {_given(value)}")
    return value


#: Words of a parameter name that make its value a secret (``password``, ``ssl_password``,
#: ``secret``, ``auth_token``; not ``max_tokens``).
_SECRET_WORDS = frozenset(
    ("password", "passwd", "secret", "token", "credential", "credentials", "apikey")
)
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]*@")
_URL_QUERY_SECRET = re.compile(
    r"(?P<name>[?&;](?:[^=&;#\s]*(?:password|secret|passwd|token)[^=&;#\s]*)=)[^&;#\s]*",
    re.IGNORECASE,
)
MASK = "***"


def is_secret_name(name: str) -> bool:
    """Whether a parameter called ``name`` holds a secret (``password``, ``secret``, ...)."""
    return any(word in _SECRET_WORDS for word in re.split(r"[^a-z0-9]+", name.lower()))


def redact_url(text: str) -> str:
    """``text`` with every URL's ``user:password@`` and ``?password=`` values as ``***``."""
    text = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", text)
    return _URL_QUERY_SECRET.sub(lambda m: f"{m.group('name')}{MASK}", text)


def redact(name: str, value: object) -> object:
    """``value`` fit for a log line or a repr: ``***`` for a secret-named parameter, URLs in
    text with their credentials masked, mappings and sequences masked item by item."""
    if value is None:
        return None
    if is_secret_name(name):
        return MASK
    if isinstance(value, str):
        return redact_url(value) if "://" in value else value
    if isinstance(value, Mapping):
        return {k: redact(str(k), v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(name, v) for v in value)
    return value


__all__ = [
    "MASK",
    "check_bool",
    "check_callable",
    "check_int",
    "check_number",
    "is_secret_name",
    "redact",
    "redact_url",
]
