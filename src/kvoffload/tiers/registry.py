"""Tiers by name (``disk``, ``redis``, ``memory``), out of tree by ``module:Class``, and from
installed distributions under the entry-point group ``kvoffload.tiers``.

One :class:`~kvoffload.registry.Registry` of concrete :class:`Tier` subclasses, like the
policies'. Built-ins are registered lazily (by import path), so importing this module imports
no tier: ``redis`` needs redis-py only when it is asked for.
"""

from __future__ import annotations

from kvoffload.registry import Registry
from kvoffload.tiers.base import Tier

TIER_REGISTRY: Registry[type[Tier]] = Registry.of_subclasses(
    "tier", Tier, entry_point_group="kvoffload.tiers", module_path_key="tier_module_path"
)
TIER_REGISTRY.register(
    "disk",
    "kvoffload.tiers.disk.tier:DiskTier",
    description="bounded, crash-safe disk tier (arena file per namespace)",
)
TIER_REGISTRY.register(
    "memory", "kvoffload.tiers.memory:MemoryTier", description="in-memory tier (tests, simulations)"
)
TIER_REGISTRY.register(
    "redis",
    "kvoffload.tiers.redis.tier:RedisTier",
    description="shared Redis / Valkey tier (kvoffload[redis])",
)


def register_tier(name: str, cls: type[Tier], *, replace: bool = False) -> None:
    """Make ``cls`` loadable as ``name``.

    A name registered already is a ``ValueError``, as for policies
    (:class:`~kvoffload.registry.Registry`): two plug-ins claiming one name would otherwise
    leave the later import silently serving. ``replace=True`` says the replacement is meant
    (a test's stand-in, a plug-in reload).
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Tier)):
        raise TypeError(f"cls must be a Tier subclass, got {cls!r}")
    if replace and name in TIER_REGISTRY:
        TIER_REGISTRY.unregister(name)
    TIER_REGISTRY.register(name, lambda: cls)


def get_tier_cls(name: str, module_path: str | None = None) -> type[Tier]:
    """The class registered as ``name``, the ``module:Class`` it spells, or ``name`` in
    ``module_path`` (out of tree, no registration)."""
    return TIER_REGISTRY.resolve(name, module_path)


def available_tiers() -> list[str]:
    """Every registered and entry-point tier name, sorted."""
    return TIER_REGISTRY.known_names()


__all__ = ["TIER_REGISTRY", "available_tiers", "get_tier_cls", "register_tier"]
