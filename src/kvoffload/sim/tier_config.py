"""``--tiers cpu=5%,disk=50%,redis=100%``: the tiers a multi-tier replay simulates, and their costs.

A tier list names the CPU tier first, then the secondaries nearest first; each capacity takes
the forms of ``--capacity`` (blocks, ``%`` of unique blocks, tokens, bytes). Each tier type
has a medium whose bandwidth and latency turn the blocks it serves into load time, set
against the time prefill takes to recompute them (:func:`load_seconds`,
:func:`recompute_seconds`). The defaults are round figures for common hardware, stated as
assumptions (docs/simulator.md, "Multi-tier replay"); they are not measurements.
"""

from __future__ import annotations

import difflib
import warnings
from dataclasses import dataclass

from kvoffload._checks import check_int
from kvoffload.sim.capacity import Capacity, parse_capacity
from kvoffload.tiers.settings import WritePolicy


@dataclass(frozen=True)
class MediumCost:
    """How fast a medium serves one request's batch of blocks: ``latency + bytes / bandwidth``."""

    bandwidth_bytes_per_s: float
    latency_s: float

    def __post_init__(self) -> None:
        if not self.bandwidth_bytes_per_s > 0:
            raise ValueError(f"bandwidth must be > 0 bytes/s, got {self.bandwidth_bytes_per_s}")
        if not self.latency_s >= 0:
            raise ValueError(f"latency must be >= 0 s, got {self.latency_s}")


@dataclass(frozen=True)
class TierType:
    """A tier type of ``--tiers``: its medium, whether it is shared, its default costs."""

    name: str
    medium: str
    shared: bool
    cost: MediumCost


#: Tier types and their default costs (docs/simulator.md says where each figure comes from).
TIER_TYPES: dict[str, TierType] = {
    # Host DRAM to GPU over PCIe Gen5 x16: ~25 GB/s effective from pinned memory.
    "cpu": TierType("cpu", "cpu", False, MediumCost(25e9, 10e-6)),
    # One NVMe SSD (PCIe Gen4): ~5 GB/s sequential read, ~100 us per batch.
    "disk": TierType("disk", "disk", False, MediumCost(5e9, 100e-6)),
    # A remote store over a 25 Gb/s network: ~3 GB/s, ~1 ms per pipelined batch.
    "redis": TierType("redis", "remote", True, MediumCost(3e9, 1e-3)),
}

#: KV geometry of the default block size: Llama-3-8B in bf16 (32 layers, 8 KV heads,
#: head_dim 128, 2 bytes): 2 (K and V) x 32 x 8 x 128 x 2 = 131072 bytes per token.
DEFAULT_KV_GEOMETRY = {"layers": 32, "kv_heads": 8, "head_dim": 128, "dtype_bytes": 2}
DEFAULT_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2

TIERS_HELP = (
    "simulate a tiered cache: TYPE=CAPACITY,... with the CPU first, then secondaries nearest "
    "first; types: " + ", ".join(TIER_TYPES) + "; capacities as --capacity "
    "(e.g. cpu=5%%,disk=50%% or cpu=5%%,redis=100%%)"
)


@dataclass(frozen=True)
class SimTier:
    """One tier of a simulated tier list."""

    type: TierType
    capacity: Capacity
    label: str

    @property
    def blocks(self) -> int:
        return self.capacity.blocks


@dataclass(frozen=True)
class SimTierList:
    """A parsed ``--tiers`` value: the CPU tier, the secondaries, and how many instances.

    Not :class:`kvoffload.tiers.config.TierConfig` (one checked entry of a live ``tiers``
    config, built into a real tier): this is a whole simulated tier list, capacities in blocks
    of one trace, costs by tier type.
    """

    text: str
    tiers: tuple[SimTier, ...]
    instances: int = 1
    tier_policy: str = "lru"  # eviction policy of every secondary (a registry name)
    write_policy: str = "write_through"  # how every secondary gets the CPU's blocks

    def __post_init__(self) -> None:
        # The TieringManager's write policies, less ``none`` (a simulated secondary is written).
        allowed = simulated_write_policies()
        if self.write_policy not in allowed:
            raise ValueError(
                f"--tier-write-policy must be one of {', '.join(allowed)}, "
                f"got {self.write_policy!r}"
            )
        check_int("--instances", self.instances, 1, why=" (engines sharing the remote tiers)")

    @property
    def cpu(self) -> SimTier:
        return self.tiers[0]

    @property
    def secondaries(self) -> tuple[SimTier, ...]:
        return self.tiers[1:]

    @property
    def label(self) -> str:
        """The config as written (plus ``xN`` instances when more than one)."""
        return self.text + (f" x{self.instances}" if self.instances > 1 else "")


def simulated_write_policies() -> tuple[str, ...]:
    """The :class:`~kvoffload.tiers.settings.WritePolicy` values a simulated secondary can have
    (all but ``none``: a secondary nothing is written to serves no hit)."""
    return tuple(p.value for p in WritePolicy if p is not WritePolicy.NONE)


def _unknown_type(name: str, where: str) -> ValueError:
    close = difflib.get_close_matches(name, list(TIER_TYPES), n=1, cutoff=0.5)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return ValueError(
        f"{where}: unknown tier type '{name}'{hint}; known types: {', '.join(TIER_TYPES)}"
    )


def parse_sim_tiers(
    text: str,
    unique_blocks: int,
    block_tokens: int,
    bytes_per_token: float | None = None,
    instances: int = 1,
    tier_policy: str = "lru",
    write_policy: str = "write_through",
) -> SimTierList:
    """Parse ``TYPE=CAPACITY,...`` for a trace; errors name the part that is wrong."""
    if not isinstance(text, str):
        raise TypeError(f"--tiers must be a string, got {type(text).__name__}")
    where = f"--tiers '{text}'"
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise ValueError(f"{where}: empty tier; write TYPE=CAPACITY,... e.g. cpu=5%,disk=50%")
    tiers: list[SimTier] = []
    labels: dict[str, int] = {}
    for index, part in enumerate(parts):
        name, sep, raw = part.partition("=")
        name = name.strip().lower()
        if not sep or not name or not raw.strip():
            raise ValueError(f"{where}: tier '{part}' must look like TYPE=CAPACITY (cpu=5%)")
        if name not in TIER_TYPES:
            raise _unknown_type(name, where)
        if index == 0 and name != "cpu":
            raise ValueError(f"{where}: the first tier must be cpu (the gateway), got '{name}'")
        if index > 0 and name == "cpu":
            raise ValueError(f"{where}: only the first tier may be cpu (tier {index + 1} is)")
        try:
            capacity = parse_capacity(raw, unique_blocks, block_tokens, bytes_per_token)
        except ValueError as exc:
            raise ValueError(f"{where}: tier '{name}': {exc}") from None
        if capacity.blocks < 1:
            raise ValueError(
                f"{where}: tier '{name}' capacity '{raw.strip()}' is {capacity.blocks} blocks "
                "on this trace; give at least 1 block"
            )
        labels[name] = labels.get(name, 0) + 1
        label = name if labels[name] == 1 else f"{name}#{labels[name]}"
        tiers.append(SimTier(TIER_TYPES[name], capacity, label))
    return SimTierList(",".join(parts), tuple(tiers), instances, tier_policy, write_policy)


@dataclass(frozen=True)
class TieredCapacity(Capacity):
    """A grid column that is a whole tier list (``blocks`` is its CPU tier's)."""

    config: SimTierList | None = None

    @classmethod
    def of(cls, config: SimTierList) -> TieredCapacity:
        return cls(config.label, config.cpu.blocks, config)


def load_seconds(
    blocks: int, batches: int, block_bytes: float, cost: MediumCost, via: MediumCost | None = None
) -> float:
    """Time to load ``blocks`` read in ``batches`` (one per request) from a medium.

    ``via`` is the CPU's cost when the blocks come from a secondary: they travel tier -> CPU,
    then CPU -> GPU, each hop paying its latency once per batch and its bandwidth per byte.
    """
    seconds = batches * cost.latency_s + blocks * block_bytes / cost.bandwidth_bytes_per_s
    if via is not None:
        seconds += batches * via.latency_s + blocks * block_bytes / via.bandwidth_bytes_per_s
    return seconds


def recompute_seconds(tokens: int, prefill_tokens_per_s: float) -> float:
    """Time prefill takes to compute ``tokens`` again."""
    if not prefill_tokens_per_s > 0:
        raise ValueError(f"prefill_tokens_per_s must be > 0, got {prefill_tokens_per_s}")
    return tokens / prefill_tokens_per_s


#: Names this module had before the simulator's tier list got a name of its own (the live
#: config's ``TierConfig`` / ``parse_tiers`` in :mod:`kvoffload.tiers.config` are another
#: concept): still importable, with a DeprecationWarning.
_RENAMED = {"TierConfig": "SimTierList", "parse_tiers": "parse_sim_tiers"}


def __getattr__(name: str) -> object:
    if name in _RENAMED:
        new = _RENAMED[name]
        warnings.warn(
            f"kvoffload.sim.tier_config.{name} is now {new}",
            DeprecationWarning,
            stacklevel=2,
        )
        return globals()[new]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DEFAULT_BYTES_PER_TOKEN",
    "DEFAULT_KV_GEOMETRY",
    "TIERS_HELP",
    "TIER_TYPES",
    "MediumCost",
    "SimTier",
    "SimTierList",
    "TierType",
    "TieredCapacity",
    "load_seconds",
    "parse_sim_tiers",
    "recompute_seconds",
    "simulated_write_policies",
]
