"""Per-request data the manager and policies may read: :class:`ReqContext`.

It lives below both the policies and the manager (layer arrows point one way), so policies can
use request signals (token positions, prefix-hit length, session, priority) without importing
the manager. Every field except ``req_id`` is an optional hint from the caller; a policy must
work when a hint is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(eq=False)
class ReqContext:
    """Request-scoped information passed to every manager call and on to the policy.

    Attributes:
        req_id: the engine's request id.
        kv_transfer_params: the request's raw per-request parameters (vLLM's field), if any.
        session_id: conversation / agent-session id, when the caller knows it.
        priority: retention priority hint (higher = keep longer); ``None`` = default.
        priority_duration_s: how long ``priority`` holds before falling back to the default.
        category: free-form request kind (``"chat"``, ``"agent"``, ...), for kind-aware policies.
        timestamp: the request's arrival time in seconds (trace time in the simulator);
            ``None`` means "use the policy's own clock".
        prefix_hit_blocks: how many leading blocks of the request were hits at lookup.
        num_blocks: how many blocks (keys) the request has in total, if known.
        partial_tail_key: the key of the request's last, partially filled block, if any.
        prompt_tokens: the request's prompt length in tokens, if known.
        output_tokens: how many tokens the request generated; known once it finished (set it
            before ``on_request_finished``), ``None`` before.
    """

    req_id: str = ""
    kv_transfer_params: dict[str, Any] | None = None
    session_id: str | None = None
    priority: int | None = None
    priority_duration_s: float | None = None
    category: str | None = None
    timestamp: float | None = None
    prefix_hit_blocks: int = 0
    num_blocks: int | None = None
    partial_tail_key: bytes | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    _positions: dict[bytes, int] = field(default_factory=dict, repr=False)
    _state: dict[type, object] = field(default_factory=dict, repr=False)

    def set_offload_key_position(self, key: bytes, end_token: int) -> None:
        """Record the token position at which ``key``'s block ends (head < tail)."""
        self._positions[key] = end_token

    def get_offload_key_position(self, key: bytes) -> int | None:
        """The recorded end-token position of ``key``, or ``None`` when unknown."""
        return self._positions.get(key)

    @property
    def key_positions(self) -> Mapping[bytes, int]:
        """Every recorded end-token position, read-only (``.get`` looks up many keys fast)."""
        return MappingProxyType(self._positions)

    def set_key_positions(self, keys: list[bytes], block_tokens: int, start: int = 0) -> None:
        """Record positions of consecutive ``block_tokens``-token blocks starting at ``start``."""
        positions = self._positions
        for i, key in enumerate(keys):
            positions[key] = start + (i + 1) * block_tokens

    def block_index(self, key: bytes, block_tokens: int) -> int | None:
        """0-based index of ``key`` in the request (from its position), or ``None`` if unknown."""
        end = self._positions.get(key)
        if end is None:
            return None
        return max(0, (end - 1) // block_tokens)

    def set_state(self, obj: object) -> None:
        """Attach one private object per type (e.g. a tier's parsed parameters)."""
        self._state[type(obj)] = obj

    def get_state(self, cls: type[T]) -> T | None:
        """The object of type ``cls`` attached with :meth:`set_state`, or ``None``."""
        return self._state.get(cls)  # type: ignore[return-value]  # keyed by exact type


#: The fields that belong to the live request, not to a copy of it: the engine's raw
#: parameters and the components' per-request state.
LIVE_FIELDS: tuple[str, ...] = ("kv_transfer_params", "_state")
#: The fields a copy of a request's context carries (its hints and key positions).
HINT_FIELDS: tuple[str, ...] = tuple(
    f.name for f in fields(ReqContext) if f.name not in LIVE_FIELDS
)

__all__ = ["HINT_FIELDS", "LIVE_FIELDS", "ReqContext"]
