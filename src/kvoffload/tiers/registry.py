"""Tiers by name (``disk``, ``redis``, ...) and out of tree by ``module:Class``.

A small dict-based registry: the project-wide ``Registry[T]`` had not landed when this was
written; its three functions are the whole surface, so moving onto it later changes no caller.
Built-ins are registered lazily (by import path) so importing the registry imports no tier.
"""

from __future__ import annotations

import importlib

from kvoffload.tiers.base import Tier

_BUILTINS: dict[str, str] = {
    "disk": "kvoffload.tiers.disk.tier:DiskTier",
    "memory": "kvoffload.tiers.memory:MemoryTier",
}
_REGISTERED: dict[str, type[Tier]] = {}


def register_tier(name: str, cls: type[Tier]) -> None:
    """Make ``cls`` loadable as ``name`` (a later registration of the same name replaces it)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if not (isinstance(cls, type) and issubclass(cls, Tier)):
        raise TypeError(f"cls must be a Tier subclass, got {cls!r}")
    _REGISTERED[name] = cls


def _load(path: str) -> type[Tier]:
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"a tier path is 'module:Class', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import tier module {module_name!r}: {exc}") from exc
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Tier)):
        raise ValueError(f"{path!r} is not a Tier subclass")
    return cls


def get_tier_cls(name: str) -> type[Tier]:
    """The class registered as ``name``, or the ``module:Class`` that ``name`` spells."""
    if not isinstance(name, str):
        raise TypeError(f"tier name must be a str, got {type(name).__name__}")
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _BUILTINS:
        cls = _load(_BUILTINS[name])
        _REGISTERED[name] = cls
        return cls
    if ":" in name:
        return _load(name)
    raise ValueError(f"unknown tier {name!r}; available: {available_tiers()} (or 'module:Class')")


def available_tiers() -> list[str]:
    """Every registered and built-in tier name, sorted."""
    return sorted(set(_BUILTINS) | set(_REGISTERED))


__all__ = ["available_tiers", "get_tier_cls", "register_tier"]
