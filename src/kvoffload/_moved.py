"""Deprecated aliases of names that moved to another module.

:func:`moved_names` makes the old module's ``__getattr__``: a name asked for there is looked
up in its new module, with one ``DeprecationWarning`` naming where it went. The new module is
imported by name when first asked for, so a floor can alias a module above it (the policies'
floor keeps aliases of selection's modules) without importing it.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Collection


def moved_names(
    old: str, new: str, names: Collection[str] | None = None
) -> Callable[[str], object]:
    """A ``__getattr__`` for module ``old`` that finds ``names`` (every public name when
    ``None``) in module ``new``, with a warning; any other name is an ``AttributeError``."""

    def __getattr__(name: str) -> object:
        if name.startswith("__") or (names is not None and name not in names):
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(f"{old}.{name} moved to {new}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)

    return __getattr__


__all__ = ["moved_names"]
