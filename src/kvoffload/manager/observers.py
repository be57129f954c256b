"""What a manager tells the components that watch its key stream (shadows, ...).

The manager knows nothing of policy selection: whoever builds it with shadows builds the
:class:`~kvoffload.selection.shadow.ShadowEvaluator` (or any object with these three methods)
and hands it over as an observer (``CPUOffloadingManager(..., observers=[...])``). The
manager calls, for each observer in order:

* ``record(keys, ctx)`` with the keys a request accesses, once each per request and in
  order, exactly where the policy would be touched (misses included, whether or not the
  policy itself learns from misses); ``ctx`` is ``None`` for a touch outside a request;
* ``request_finished(ctx)`` when a request ends;
* ``stats()`` for flat gauges that join the policy's in ``get_stats().policy``.

Observers survive ``switch_policy`` and ``reset_cache`` (they watch the stream, not the
cache), and are not in a saved state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable

from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey


@runtime_checkable
class AccessObserver(Protocol):
    """Watches a manager's accesses (see the module)."""

    def record(self, keys: Iterable[OffloadKey], ctx: ReqContext | None = None) -> object:
        """The keys a request accesses, once each, in order."""

    def request_finished(self, ctx: ReqContext) -> None:
        """The request ``ctx`` ended."""

    def stats(self) -> Mapping[str, float]:
        """Gauges for ``get_stats().policy``."""


def check_observers(observers: Iterable[AccessObserver]) -> tuple[AccessObserver, ...]:
    """``observers`` as a tuple; ``TypeError`` for one that lacks a method."""
    out = tuple(observers)
    for observer in out:
        if not isinstance(observer, AccessObserver):
            raise TypeError(
                "an observer needs record(keys, ctx), request_finished(ctx) and stats(), got "
                f"{type(observer).__name__}"
            )
    return out


__all__ = ["AccessObserver", "check_observers"]
