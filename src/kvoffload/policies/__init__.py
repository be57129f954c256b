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
from kvoffload.policies.spec import PolicySpec
from kvoffload.policies.switching import SwitchReport, switch_resident_set

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
    (
        "fifo",
        "kvoffload.policies.fifo",
        "FIFOCachePolicy",
        "First in, first out: evicts the ready block that was stored earliest.",
    ),
    (
        "clock",
        "kvoffload.policies.clock",
        "ClockCachePolicy",
        "CLOCK (second chance): a hand sweeps the blocks and evicts the first one not used lately.",
    ),
    (
        "sieve",
        "kvoffload.policies.sieve",
        "SieveCachePolicy",
        "SIEVE (NSDI'24): a FIFO with visited bits; a hand evicts the first unvisited block.",
    ),
    (
        "s3fifo",
        "kvoffload.policies.s3fifo",
        "S3FIFOCachePolicy",
        "S3-FIFO (SOSP'23): a small FIFO filters one-use blocks, a main FIFO keeps re-used ones.",
    ),
    (
        "lfu",
        "kvoffload.policies.lfu",
        "LFUCachePolicy",
        "Least frequently used: evicts the ready block with the fewest uses (LRU among equals).",
    ),
    (
        "lfuda",
        "kvoffload.policies.lfuda",
        "LFUDACachePolicy",
        "LFU with dynamic aging: evicts the lowest uses + cache-age priority, then ages the cache.",
    ),
    (
        "2q",
        "kvoffload.policies.twoq",
        "TwoQCachePolicy",
        "2Q (VLDB'94): FIFO for first uses, a ghost FIFO of its evictees, LRU for re-used blocks.",
    ),
    (
        "slru",
        "kvoffload.policies.slru",
        "SLRUCachePolicy",
        "Segmented LRU: blocks climb from probation through protected levels by being re-used.",
    ),
    (
        "mq",
        "kvoffload.policies.mq",
        "MQCachePolicy",
        "Multi-Queue (ATC'01): LRU queues by access count, with lifetime-based demotion.",
    ),
    (
        "lirs",
        "kvoffload.policies.lirs",
        "LIRSCachePolicy",
        "LIRS (SIGMETRICS'02): ranks blocks by reuse distance, evicts from a small HIR queue.",
    ),
    (
        "wtinylfu",
        "kvoffload.policies.wtinylfu",
        "WTinyLFUCachePolicy",
        "W-TinyLFU (ACM TOS'17): an LRU window, then a frequency-filtered SLRU main cache.",
    ),
    (
        "lecar",
        "kvoffload.policies.lecar",
        "LeCaRCachePolicy",
        "LeCaR (HotStorage'18): learns online how to mix LRU and LFU evictions from its regrets.",
    ),
    (
        "prefix-lru",
        "kvoffload.policies.prefix_lru",
        "PrefixLRUCachePolicy",
        "Prefix-aware LRU: evicts leaves first, so a cached tail never outlives its head.",
    ),
    (
        "retention",
        "kvoffload.policies.retention",
        "RetentionCachePolicy",
        "Retention priorities (TensorRT-LLM style): low priority first, LRU within a level.",
    ),
    (
        "sae",
        "kvoffload.policies.sae",
        "SAECachePolicy",
        "Session-aware eviction (vLLM PR #50422): evicts the weakest sessions, tail first.",
    ),
    (
        "kvaware",
        "kvoffload.policies.kvaware",
        "KVAwareCachePolicy",
        "KV-aware: learns reuse odds per block class online, evicts the least likely reused.",
    ),
    (
        "auto",
        "kvoffload.selection.auto",
        "AutoCachePolicy",
        "Picks a candidate by sampled shadows.",
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
    "PolicySpec",
    "SwitchReport",
    "Victims",
    "available_cache_policies",
    "create_cache_policy",
    "get_cache_policy_cls",
    "switch_resident_set",
]
