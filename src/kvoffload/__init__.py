"""kvoffload: offload LLM KV-cache blocks out of GPU memory, with pluggable eviction policies.

The main names are importable from here; importing this package imports no policy module and
no third-party library.
"""

from kvoffload.context import ReqContext
from kvoffload.keys import (
    OffloadKey,
    get_offload_block_hash,
    get_offload_group_idx,
    hash_token_blocks,
    make_offload_key,
)
from kvoffload.manager import (
    CPUOffloadingManager,
    LookupResult,
    OffloadingManager,
    OffloadingStats,
    PrepareStoreOutput,
)
from kvoffload.policies import BlockStatus, CachePolicy, CachePolicyFactory

__version__ = "0.1.0"

__all__ = [
    "BlockStatus",
    "CPUOffloadingManager",
    "CachePolicy",
    "CachePolicyFactory",
    "LookupResult",
    "OffloadKey",
    "OffloadingManager",
    "OffloadingStats",
    "PrepareStoreOutput",
    "ReqContext",
    "__version__",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "hash_token_blocks",
    "make_offload_key",
]
