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


@pytest.mark.parametrize(
    ("text", "blocks"),
    [
        ("9007199254740993", 9007199254740993),  # 2**53 + 1: a float would give ...992
        ("9007199254740993blocks", 9007199254740993),
        ("18014398509481985k", 18014398509481985000),
        ("4611686018427387905tok", 4611686018427387905 // 512),
        ("0.3%", 131),  # 43924 * 0.003 = 131.772
    ],
)
def test_capacities_are_exact_not_floats(text: str, blocks: int) -> None:
    assert parse_capacity(text, 43924, 512).blocks == blocks


def test_percent_of_a_huge_trace_is_exact() -> None:
    unique = 2**60 + 7
    assert parse_capacity("1%", unique, 512).blocks == unique // 100
