"""Capacities as people say them: ``9139`` blocks, ``5%`` of unique blocks, ``4Mtok``, ``8GiB``.

Every form resolves to a whole number of blocks (rounded down: a block that does not fit is
not there), in exact arithmetic: ``9007199254740993`` is that many blocks, not the nearest
float. ``%`` is of the trace's unique blocks, ``int(unique * percent / 100)``, the
convention of the reference measurements. Tokens (suffix ``tok``) use decimal multipliers
(``4Mtok`` = 4,000,000 tokens); bytes take ``B``/``KB``/``MB``/``GB``/``TB`` (decimal) or
``KiB``/``MiB``/``GiB``/``TiB`` (binary) and need the KV bytes per token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from kvoffload._sizes import exact_bytes

_DECIMAL = {"": 1, "k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_NUMBER = r"(?P<num>\d+(?:\.\d*)?|\.\d+)"
_PERCENT_RE = re.compile(rf"^{_NUMBER}\s*%$")
_TOKENS_RE = re.compile(rf"^{_NUMBER}\s*(?P<mult>[kKMGT]?)\s*(?:tok|tokens)$")
_BLOCKS_RE = re.compile(rf"^{_NUMBER}\s*(?P<mult>[kKMGT]?)\s*(?:blk|blocks)?$")

CAPACITY_HELP = (
    "blocks (9139, 10k), percent of the trace's unique blocks (5%%), tokens (4Mtok) or "
    "bytes (8GiB, needs --bytes-per-token); comma-separate several"
)


@dataclass(frozen=True)
class Capacity:
    """A parsed capacity: what the user wrote and the blocks it means on a given trace."""

    label: str
    blocks: int


def parse_capacity(
    text: str,
    unique_blocks: int,
    block_tokens: int,
    bytes_per_token: float | None = None,
) -> Capacity:
    """Resolve one capacity string to blocks for a trace (see the module docstring)."""
    spec = text.strip()
    if not spec:
        raise ValueError("empty capacity; " + CAPACITY_HELP.replace("%%", "%"))
    if match := _PERCENT_RE.match(spec):
        percent = Fraction(match["num"])
        if percent > 100:
            raise ValueError(f"capacity '{text}': a percentage of unique blocks must be <= 100%")
        return Capacity(spec, int(unique_blocks * percent / 100))
    if match := _TOKENS_RE.match(spec):
        tokens = Fraction(match["num"]) * _DECIMAL[match["mult"]]
        return Capacity(spec, int(tokens // block_tokens))
    # Bytes read by the one size parser (kvoffload._sizes), exactly: rounded once, to blocks.
    if (total := exact_bytes(spec, unit_required=True)) is not None:
        if bytes_per_token is None or bytes_per_token <= 0:
            raise ValueError(
                f"capacity '{text}' is in bytes: also give --bytes-per-token (the KV size of "
                "one token: 2 * layers * kv_heads * head_dim * dtype bytes)"
            )
        return Capacity(spec, int(total // (Fraction(bytes_per_token) * block_tokens)))
    if match := _BLOCKS_RE.match(spec):
        blocks = Fraction(match["num"]) * _DECIMAL[match["mult"]]
        if blocks.denominator != 1:
            raise ValueError(f"capacity '{text}' is not a whole number of blocks")
        return Capacity(spec, int(blocks))
    raise ValueError(f"cannot read capacity '{text}': use " + CAPACITY_HELP.replace("%%", "%"))


def parse_capacities(
    texts: list[str] | str,
    unique_blocks: int,
    block_tokens: int,
    bytes_per_token: float | None = None,
) -> list[Capacity]:
    """Parse comma-separated and/or repeated capacities, keeping their order, dropping repeats."""
    items = [texts] if isinstance(texts, str) else list(texts)
    out: list[Capacity] = []
    seen: set[int] = set()
    for item in items:
        for part in item.split(","):
            capacity = parse_capacity(part, unique_blocks, block_tokens, bytes_per_token)
            if capacity.blocks not in seen:
                seen.add(capacity.blocks)
                out.append(capacity)
    return out


__all__ = ["CAPACITY_HELP", "Capacity", "parse_capacities", "parse_capacity"]
