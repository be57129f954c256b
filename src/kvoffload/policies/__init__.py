"""Cache policies: the contract, the registry, and the built-in policies (one module each).

Built-ins are registered here by name with lazy loaders: importing :mod:`kvoffload.policies`
imports no policy module. A policy module is imported when its name is first resolved.
"""

from __future__ import annotations

from kvoffload.policies.base import BlockStatus, CachePolicy, Victims
from kvoffload.policies.factory import (
    CachePolicyFactory,
    PolicyInfo,
    available_cache_policies,
    create_cache_policy,
    get_cache_policy_cls,
)

#: (name, module, class, one-line description). The description must equal the first line of
#: the class docstring (a test checks it), so listings need no import.
BUILTIN_POLICIES: tuple[tuple[str, str, str, str], ...] = (
    (
        "lru",
        "kvoffload.policies.lru",
        "LRUCachePolicy",
        "Least recently used: evicts the ready block whose last use is oldest.",
    ),
    (
        "arc",
        "kvoffload.policies.arc",
        "ARCCachePolicy",
        "Adaptive Replacement Cache (FAST'03): balances recency and frequency with ghost lists.",
    ),
)


def _register_builtins() -> None:
    for name, module, class_name, description in BUILTIN_POLICIES:
        if name not in CachePolicyFactory.registered_names():
            CachePolicyFactory.register_cache_policy(
                name, module, class_name, description, _source="built-in"
            )


_register_builtins()

__all__ = [
    "BUILTIN_POLICIES",
    "BlockStatus",
    "CachePolicy",
    "CachePolicyFactory",
    "PolicyInfo",
    "Victims",
    "available_cache_policies",
    "create_cache_policy",
    "get_cache_policy_cls",
]
