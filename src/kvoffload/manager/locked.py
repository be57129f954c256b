"""Locking for managers that several threads call: a subclass whose public methods hold a lock.

``locked_class(cls)`` returns (once per class) a subclass of ``cls`` in which every method
named in ``LOCKED_METHODS`` runs under the instance's ``_lock`` (a re-entrant lock, so a
locked method may call another). The methods are defined on the class, not set on instances:
an unlocked manager pays nothing, and introspection and type checkers see the real methods.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

LOCKED_METHODS = (
    "lookup",
    "prepare_load",
    "touch",
    "complete_load",
    "prepare_store",
    "complete_store",
    "on_new_request",
    "on_request_finished",
    "take_events",
    "reset_cache",
    "get_stats",
    "has_pending_work",
    "release_stale_slots",
    "evict_ahead",
    "release_evicted",
    "switch_policy",
    "export_state",
    "shutdown",
)

_cache: dict[type[Any], type[Any]] = {}
_cache_lock = threading.Lock()


def _locked(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return wrapper


def locked_class(cls: type[T]) -> type[T]:
    """The subclass of ``cls`` whose public methods hold ``self._lock`` (made once)."""
    if getattr(cls, "_is_locked_class", False):
        return cls
    with _cache_lock:
        sub = _cache.get(cls)
        if sub is None:
            namespace: dict[str, Any] = {
                name: _locked(getattr(cls, name)) for name in LOCKED_METHODS if hasattr(cls, name)
            }
            namespace["_is_locked_class"] = True
            namespace["__module__"] = cls.__module__
            namespace["__doc__"] = f"{cls.__name__} whose public methods hold one lock."
            sub = type(f"Locked{cls.__name__}", (cls,), namespace)
            _cache[cls] = sub
        return sub


__all__ = ["LOCKED_METHODS", "locked_class"]
