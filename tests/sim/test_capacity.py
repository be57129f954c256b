"""Capacity strings: blocks, percent of unique blocks, tokens and bytes."""

from __future__ import annotations

import pytest

from kvoffload.sim.capacity import parse_capacities, parse_capacity


@pytest.mark.parametrize(
    ("text", "blocks"),
    [
        ("9139", 9139),
        ("10k", 10000),
        ("2Mblocks", 2_000_000),
        ("1%", 439),
        ("5%", 2196),
        ("10%", 4392),
        ("25%", 10981),
        ("0.5%", 219),
        ("3Mtok", 5859),
        ("4Mtok", 7812),
        ("1000 tokens", 1),
        ("8GiB", 8 * 2**30 // (131072 * 512)),
        ("1TB", 10**12 // (131072 * 512)),
    ],
)
def test_forms(text: str, blocks: int) -> None:
    assert parse_capacity(text, 43924, 512, bytes_per_token=131072).blocks == blocks


def test_percent_matches_the_reference_convention_on_conversation() -> None:
    got = [parse_capacity(f"{p}%", 182790, 512).blocks for p in (1, 5, 10, 25)]
    assert got == [1827, 9139, 18279, 45697]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty capacity"),
        ("lots", "cannot read capacity"),
        ("8GiB", "--bytes-per-token"),
        ("150%", "<= 100%"),
        ("1.5", "whole number of blocks"),
        ("5XB", "cannot read capacity"),
    ],
)
def test_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_capacity(text, 1000, 512)


def test_lists_keep_order_and_drop_repeats() -> None:
    caps = parse_capacities(["5%,100", "50"], 1000, 512)
    assert [(c.label, c.blocks) for c in caps] == [("5%", 50), ("100", 100)]
