"""The victim helpers the policies share."""

from __future__ import annotations

from collections import OrderedDict

from kvoffload.policies.victims import (
    append_absent,
    first_unprotected,
    next_unprotected,
    protected_disjoint,
)


def test_first_unprotected_walks_the_orders_in_turn_and_skips_protected_keys() -> None:
    orders = [OrderedDict.fromkeys([b"a", b"b"]), OrderedDict(), OrderedDict.fromkeys([b"c", b"d"])]
    assert first_unprotected(orders, 3, {b"b"}) == [b"a", b"c", b"d"]
    assert first_unprotected(orders, 2, []) == [b"a", b"b"]
    assert first_unprotected(orders, 1, (b"a", b"b")) == [b"c"]  # any collection protects
    assert first_unprotected(orders, 0, set()) == []


def test_first_unprotected_is_none_when_too_few_are_free() -> None:
    orders = [[b"a", b"b"], [b"c"]]
    assert first_unprotected(orders, 3, {b"c"}) is None
    assert first_unprotected(orders, 4, set()) is None
    assert first_unprotected([], 1, set()) is None


def test_next_unprotected_and_protected_disjoint() -> None:
    it = iter([b"a", b"b", b"c"])
    assert next_unprotected(it, {b"a"}) == b"b"
    assert next_unprotected(it, {b"c"}) is None
    assert protected_disjoint({b"x"}, [b"a", b"b"])
    assert not protected_disjoint([b"b"], [b"a", b"b"])


def test_append_absent_keeps_order_and_lets_a_repeated_key_land_at_its_last_mark() -> None:
    order = OrderedDict.fromkeys([b"x"])
    append_absent(order, [b"a", b"b"])
    assert list(order) == [b"x", b"a", b"b"]
    append_absent(order, [b"c", b"d", b"c", b"e"])
    assert list(order) == [b"x", b"a", b"b", b"d", b"c", b"e"]
