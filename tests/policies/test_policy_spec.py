"""One type for "a policy and its parameters": the replay's, ``auto``'s candidates, a shadow's."""

from __future__ import annotations

import pytest

from kvoffload.policies import PolicySpec, create_cache_policy
from kvoffload.selection.auto import AutoCachePolicy
from kvoffload.selection.shadow import ShadowEvaluator
from kvoffload.sim import replay


def test_the_replay_and_the_policies_name_one_type() -> None:
    assert replay.PolicySpec is PolicySpec


@pytest.mark.parametrize(
    ("spelled", "label"),
    [
        ("arc", "arc"),
        (("mq", {}), "mq"),
        (("kvaware", {"decay_window": 64, "a": 1}), "kvaware(a=1, decay_window=64)"),
        (["lru", {"x": 2}], "lru(x=2)"),
    ],
)
def test_every_spelling_parses_to_one_spec_with_the_shadows_label(
    spelled: object, label: str
) -> None:
    spec = PolicySpec.parse(spelled)
    assert PolicySpec.parse(spec) is spec
    assert spec.label == label
    assert PolicySpec.parse(spec.as_candidate()) == spec


def test_the_shadows_take_every_spelling_and_label_each_by_its_spec() -> None:
    """A spec is a shadow candidate as it is (it was a TypeError), beside names and pairs."""
    shadows = ShadowEvaluator(
        64,
        [PolicySpec.of("mq", params={"lifetime": 7}), "arc", ("lru", {})],
        sample_rate=1.0,
    )
    assert shadows.names == ["mq(lifetime=7)", "arc", "lru"]
    assert list(shadows.estimates()) == shadows.names
    with pytest.raises(ValueError, match="distinct"):
        ShadowEvaluator(64, [PolicySpec("arc"), "arc"])
    with pytest.raises(TypeError, match="a candidate must be a policy name"):
        ShadowEvaluator(64, [("arc", 1)])  # type: ignore[list-item]


def test_lists_and_their_errors() -> None:
    assert PolicySpec.parse_list(" mq, arc ,") == [PolicySpec("mq"), PolicySpec("arc")]
    with pytest.raises(ValueError, match="at least one policy, got an empty string"):
        PolicySpec.parse_list(" , ")
    with pytest.raises(ValueError, match="at least one policy"):
        PolicySpec.parse_list([])
    with pytest.raises(TypeError, match="comma-separated string or a sequence"):
        PolicySpec.parse_list(3)
    with pytest.raises(TypeError, match="a candidate must be a policy name"):
        PolicySpec.parse(("arc", 1))


def test_auto_takes_specs_as_candidates_and_builds_them_with_their_params() -> None:
    """A spec the simulator built is a candidate as it is (it was a TypeError)."""
    specs = [PolicySpec("arc"), PolicySpec.of("mq", params={"lifetime": 7})]
    auto = AutoCachePolicy(64, candidates=specs)
    assert auto.candidate_names == ("arc", "mq(lifetime=7)")
    built = auto._build(1)
    assert type(built).__name__ == "MQCachePolicy" and built.lifetime == 7  # type: ignore[attr-defined]
    same = create_cache_policy(
        "auto", 64, None, {"candidates": [("arc", {}), ("mq", {"lifetime": 7})]}
    )
    assert same.candidate_names == auto.candidate_names  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="own candidate"):
        AutoCachePolicy(64, candidates=[PolicySpec("auto")])
