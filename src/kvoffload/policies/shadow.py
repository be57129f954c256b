"""Deprecated alias of :mod:`kvoffload.selection.shadow` (moved there with the rest of selection).

Import from ``kvoffload.selection.shadow`` (or ``kvoffload.selection``) instead: the policies'
floor may not import selection, which sits above the manager, so the names are looked up
there when asked for, with a ``DeprecationWarning``.
"""

from __future__ import annotations

from kvoffload._moved import moved_names

__getattr__ = moved_names(__name__, "kvoffload.selection.shadow")
