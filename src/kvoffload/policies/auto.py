"""Deprecated alias of :mod:`kvoffload.selection.auto` (moved there with the rest of selection).

Names are looked up in the new module when asked for, with a ``DeprecationWarning``: the
policies' floor may not import selection, which sits above the manager. Import from
``kvoffload.selection.auto`` (or ``kvoffload.selection``) instead.
"""

from __future__ import annotations

import importlib
import warnings

_NEW = "kvoffload.selection.auto"


def __getattr__(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(name)
    warnings.warn(f"{__name__} moved to {_NEW}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(_NEW), name)
