"""Selection moved to ``kvoffload.selection``: the old module paths are deprecated aliases."""

from __future__ import annotations

import importlib

import pytest

import kvoffload.selection as selection
from kvoffload.policies import create_cache_policy


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("kvoffload.policies.shadow", "kvoffload.selection.shadow", "ShadowEvaluator"),
        ("kvoffload.policies.shadow", "kvoffload.selection.shadow", "sample_hash"),
        ("kvoffload.policies.auto", "kvoffload.selection.auto", "AutoCachePolicy"),
        ("kvoffload.policies.switching", "kvoffload.selection.switching", "warm_switch"),
    ],
)
def test_an_old_path_gives_the_same_object_with_a_deprecation_warning(
    old: str, new: str, name: str
) -> None:
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match="kvoffload.selection"):
        got = getattr(module, name)
    assert got is getattr(importlib.import_module(new), name)


def test_the_move_itself_stays_on_the_policies_floor_without_a_warning() -> None:
    from kvoffload.policies import SwitchReport, switch_resident_set

    assert selection.switch_resident_set is switch_resident_set
    assert selection.SwitchReport is SwitchReport


def test_auto_is_still_a_builtin_resolved_by_name() -> None:
    policy = create_cache_policy("auto", 16, None, {"candidates": "lru,arc"})
    assert isinstance(policy, selection.AutoCachePolicy)
    assert type(policy).__module__ == "kvoffload.selection.auto"


def test_a_name_that_did_not_move_is_an_attribute_error_without_a_warning() -> None:
    import warnings

    import kvoffload.policies.auto as old_auto
    import kvoffload.policies.switching as switching

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="no attribute 'ShadowEvaluator'"):
            switching.ShadowEvaluator  # noqa: B018 - only warm_switch and HistoryEntry moved
        with pytest.raises(AttributeError, match="__wrapped__"):
            old_auto.__wrapped__  # noqa: B018 - dunders are never forwarded
