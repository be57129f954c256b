"""The checks on ``keys`` arguments, placed where they cost (next to) nothing.

* The collection: one ``type(keys) is list`` test per call; anything else is copied into a
  list once (generators are consumed exactly once), and a ``bytes``/``str`` value (a single
  key where a list is due, which would iterate into ints or characters) is a ``TypeError``.
* The elements: checked to be ``bytes`` only where keys enter the cache (the new keys of
  ``prepare_store``, and ``touch``): every other call finds its keys in the block table or
  takes its error path, where the type is checked before the message is built. So no
  ``str``/``int``/``None`` key is ever stored, and lookups pay nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvoffload.keys import OffloadKey

_SCALARS = (bytes, bytearray, memoryview, str)
_BYTES = frozenset({bytes})


def key_list(keys: Iterable[OffloadKey], method: str) -> list[OffloadKey]:
    """``keys`` as a list; ``TypeError`` for a single value or a non-iterable."""
    if isinstance(keys, list):
        return keys
    if isinstance(keys, _SCALARS):
        raise TypeError(
            f"{method}: keys must be a collection of keys (a list of bytes), not one "
            f"{type(keys).__name__} value; pass [key] for a single key"
        )
    try:
        return list(keys)
    except TypeError:
        raise TypeError(
            f"{method}: keys must be an iterable of keys (bytes), got {type(keys).__name__}"
        ) from None


def check_key_types(keys: list[OffloadKey], method: str) -> None:
    """``TypeError`` unless every key is ``bytes`` (a C-level pass over the keys' types)."""
    if not _BYTES.issuperset(map(type, keys)):
        for key in keys:
            error = wrong_key_type(key, method)  # subclasses of bytes are keys too
            if error is not None:
                raise error


def describe_key(key: object) -> str:
    """A key for an error message (hex for bytes, repr otherwise)."""
    return key.hex() if isinstance(key, bytes) else repr(key)


def wrong_key_type(key: object, method: str) -> TypeError | None:
    """The error for a key of the wrong type on an error path, or ``None`` for a bytes key."""
    if isinstance(key, bytes):
        return None
    return TypeError(
        f"{method}: every key must be bytes (an OffloadKey), got {type(key).__name__} {key!r:.60}"
    )


__all__ = ["check_key_types", "describe_key", "key_list", "wrong_key_type"]
