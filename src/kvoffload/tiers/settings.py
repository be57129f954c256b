"""A tiering manager's settings per secondary tier, their one validation rule, and its stats.

Why apart from the manager: a ``tiers`` config is checked with the same rule before any tier
is built (``tiers.config``), and the settings are data, not the manager's moves.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from kvoffload._checks import check_bool, check_int
from kvoffload.admission import AdmissionFilter
from kvoffload.manager import OffloadingStats
from kvoffload.tiers.base import Tier
from kvoffload.tiers.breaker import CircuitBreaker

#: Failure reasons that say nothing about the tier's health (they never trip the breaker).
BENIGN_REASONS = frozenset({"missing", "exists", "no_space", "too_large", "busy", "cancelled"})


class WritePolicy(str, enum.Enum):
    """When a secondary tier receives the CPU tier's blocks."""

    WRITE_THROUGH = "write_through"
    WRITE_BACK = "write_back"
    SELECTIVE = "selective"
    NONE = "none"


@dataclass
class SecondaryTier:
    """A secondary tier and how the manager uses it.

    Args:
        tier: the tier (its ``memory`` must be the manager's host slots).
        write_policy: ``write_through``, ``write_back``, ``selective`` or ``none``.
        admission: the filter of a ``selective`` tier (default: admit on the
            ``store_threshold``-th offer).
        store_threshold: offers before a ``selective`` tier admits a block (default 2).
        fill: also write blocks promoted from farther tiers into this one.
        max_inflight_bytes: most bytes of jobs in flight on this tier (0: no bound).
        breaker_threshold: failed jobs in a row that open its breaker (0: never).
        breaker_backoff_s / breaker_max_backoff_s: first and longest wait before a probe.
        lookup_retries: ``RETRY`` answers per request and key while the tier says UNKNOWN.
        write_back_reserve_blocks: free CPU slots each ``step`` keeps ready for stores by
            evicting (and writing back) ahead of need (default, 0: a sixteenth of the CPU
            tier, at least 1); ``docs/tiers.md`` (write_back) says what a store short of them does.
        label: name in stats (default: the tier's ``name``; repeated names get ``#i``).
    """

    tier: Tier
    write_policy: WritePolicy | str = WritePolicy.WRITE_THROUGH
    admission: AdmissionFilter | None = None
    store_threshold: int = 2
    fill: bool = False
    max_inflight_bytes: int = 0
    breaker_threshold: int = 5
    breaker_backoff_s: float = 1.0
    breaker_max_backoff_s: float = 60.0
    lookup_retries: int = 4
    write_back_reserve_blocks: int = 0
    label: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tier, Tier):
            raise TypeError(f"tier must be a Tier, got {type(self.tier).__name__}")
        # A tier that declares it cannot hold one block would fail every put: say so now.
        limit = self.tier.capabilities.max_value_bytes
        block = self.tier.memory.slot_bytes
        if limit and block > limit:
            raise ValueError(
                f"tier {self.tier.name!r} takes records of at most {limit} bytes "
                f"(capabilities.max_value_bytes), but a block is {block} bytes"
            )
        check_tier_settings({name: getattr(self, name) for name in _SETTING_DEFAULTS})
        self.write_policy = WritePolicy(self.write_policy)
        if self.admission is not None and not isinstance(self.admission, AdmissionFilter):
            raise TypeError(
                "admission must provide admit(keys, ctx) and reset(), got "
                f"{type(self.admission).__name__}"
            )


#: SecondaryTier's settings (every field but ``tier`` and ``admission``) and their defaults.
_SETTING_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(SecondaryTier) if f.name not in ("tier", "admission")
}
#: Its int settings (each >= 0), with what 0 means where it means something.
_INT_SETTINGS = {
    "store_threshold": "",
    "max_inflight_bytes": " (0: no bound)",
    "lookup_retries": "",
    "write_back_reserve_blocks": " (0: a sixteenth of the CPU tier)",
}


def check_tier_settings(settings: Mapping[str, Any]) -> None:
    """:class:`SecondaryTier`'s rules for its settings (``settings`` over the defaults).

    The dataclass checks its fields with it, and a ``tiers`` config its manager keys before
    any tier is built, so both give the same error for the same key.
    """
    given = {**_SETTING_DEFAULTS, **settings}
    for name, why in _INT_SETTINGS.items():
        check_int(name, given[name], 0, why=why)
    CircuitBreaker.check_settings(
        given["breaker_threshold"], given["breaker_backoff_s"], given["breaker_max_backoff_s"]
    )
    check_bool("fill", given["fill"])
    label = given["label"]
    if label is not None and not isinstance(label, str):
        raise TypeError(f"label must be a str or None, got {type(label).__name__} {label!r}")
    policy = given["write_policy"]
    values = tuple(p.value for p in WritePolicy)
    if not isinstance(policy, str) or policy not in values:  # a member is a str too
        error = ValueError if isinstance(policy, str) else TypeError
        raise error(
            f"write_policy must be one of {', '.join(values)}, got "
            f"{type(policy).__name__} {policy!r}"
        )


@dataclass(frozen=True)
class TieringStats(OffloadingStats):
    """The CPU tier's statistics plus the tiering counters and one dict per secondary tier."""

    tiering: Mapping[str, float] = field(default_factory=dict)
    tiers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        out.pop("tiering", None)
        out.pop("tiers", None)
        out.update({f"tiering_{k}": v for k, v in self.tiering.items()})
        for label, stats in self.tiers.items():
            for name, value in stats.items():
                if isinstance(value, Mapping):
                    out.update({f"tier_{label}_{name}_{k}": v for k, v in value.items()})
                else:
                    out[f"tier_{label}_{name}"] = value
        return out


__all__ = [
    "BENIGN_REASONS",
    "SecondaryTier",
    "TieringStats",
    "WritePolicy",
    "check_tier_settings",
]
