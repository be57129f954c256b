"""Every parameter of every built-in, through the factory as a user passes it: a wrong type is
a ``TypeError`` and a wrong value a ``ValueError``, each naming the parameter."""

from __future__ import annotations

import importlib
import inspect
import math
from typing import Any

import pytest

from kvoffload.policies import BUILTIN_POLICIES, CachePolicyFactory

#: policy -> parameter -> a wrong value of the right type (None: every value of the type is
#: accepted, only the type is checked).
WRONG_VALUES: dict[str, dict[str, Any]] = {
    "clock": {"init_freq": 99, "n_bit_counter": 0},
    "s3fifo": {"small_size_ratio": 1.5, "ghost_size_ratio": -1.0, "move_to_main_threshold": 0},
    "2q": {"a_in_ratio": 1.5, "a_out_ratio": -0.5},
    "slru": {"protected_ratio": 1.0, "num_segments": 1, "fill_free_segments": None},
    "mq": {"num_queues": 0, "lifetime": 0, "qout_ratio": math.nan},
    "lirs": {"hir_ratio": 2.0, "stack_ratio": 0.5},
    "wtinylfu": {
        "window_ratio": -0.1,
        "protected_ratio": 1.1,
        "adaptive": None,
        "sample_factor": 0,
        "doorkeeper": None,
    },
    "lecar": {
        "learning_rate": -1.0,
        "initial_lru_weight": 1.5,
        "history_ratio": math.inf,
        "seed": None,
    },
    "retention": {"default_priority": 101, "clock": None},
    "sae": {
        "decay_interval": 0,
        "decay_factor": 1.5,
        "ghost_hit_weight": -1.0,
        "ghost_miss_weight": -1.0,
        "ghost_norm": 0.0,
        "touch_weight": -1.0,
        "depth_bonus": -1.0,
        "depth_half_life": 0.0,
        "ghost_prune_threshold": -0.5,
        "ghost_capacity": -1,
    },
    "kvaware": {
        "short_output_tokens": -1,
        "long_output_tokens": -1,
        "horizon_factor": 0.0,
        "ghost_factor": -1.0,
        "decay_window": -1,
        "prior_reuse": 1.0,
        "prior_weight": 0.0,
    },
    "auto": {
        "candidates": None,  # an unknown name is the factory's error (it names the policy)
        "sample_rate": 2.0,
        "min_shadow_blocks": -1,
        "window": 0,
        "decay": 1.0,
        "margin": 2.0,
        "relative_margin": -1.0,
        "patience": 0,
        "min_dwell": -1,
        "warmup_windows": -1,
        "z": -1.0,
        "history": -1.0,
        "long_run": None,
        "alpha": 1.0,
        "max_history": -1,
    },
}
#: Wrong types where a string is a right one.
WRONG_TYPES: dict[tuple[str, str], tuple[Any, ...]] = {("auto", "candidates"): (5, [1])}


def _parameters() -> list[tuple[str, str]]:
    rows = []
    for name, module, class_name, _ in BUILTIN_POLICIES:
        cls = getattr(importlib.import_module(module), class_name)
        for p in inspect.signature(cls.__init__).parameters.values():
            if p.name not in ("self", "cache_capacity") and p.kind is not p.VAR_KEYWORD:
                rows.append((name, p.name))
    return rows


PARAMETERS = _parameters()


def test_the_table_covers_every_parameter() -> None:
    listed = {(policy, param) for policy, params in WRONG_VALUES.items() for param in params}
    assert listed == set(PARAMETERS)


@pytest.mark.parametrize("policy, param", PARAMETERS)
def test_a_wrong_type_is_a_type_error_naming_the_parameter(policy: str, param: str) -> None:
    cls = CachePolicyFactory.get_cache_policy_cls(policy)
    for wrong in WRONG_TYPES.get((policy, param), ("x", [1])):
        with pytest.raises(TypeError, match=param if param != "candidates" else "candidate"):
            cls(64, **{param: wrong})


@pytest.mark.parametrize("policy, param", PARAMETERS)
def test_a_wrong_value_is_a_value_error_naming_the_parameter(policy: str, param: str) -> None:
    wrong = WRONG_VALUES[policy][param]
    if wrong is None:
        pytest.skip(f"{policy}.{param}: only its type is checked")
    cls = CachePolicyFactory.get_cache_policy_cls(policy)
    with pytest.raises(ValueError, match=param):
        cls(64, **{param: wrong})


def test_the_same_key_gives_the_same_error_through_config_and_constructor() -> None:
    from kvoffload.manager import CPUOffloadingManager
    from kvoffload.spec import OffloadingConfig

    errors = []
    for make in (
        lambda: CPUOffloadingManager(8, store_threshold="2"),
        lambda: OffloadingConfig(cpu_bytes_to_use=1 << 20, store_threshold="2"),
    ):
        with pytest.raises(TypeError) as info:
            make()
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "store_threshold" in errors[0]
