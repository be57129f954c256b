"""Objects named on the command line (``package.module:Name``), built where they are used.

A factory holds only the name and parameters, so it pickles into sweep worker processes and
each replay builds a fresh object (admission filters keep per-replay history).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from kvoffload.admission import AdmissionFilter


def load_object(target: str, what: str) -> Any:
    """Import ``package.module:Name``; errors say which part failed."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{what} '{target}' must look like 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"cannot load {what} '{target}': {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"cannot load {what} '{target}': module has no '{attr}'") from None


@dataclass(frozen=True)
class AdmissionFactory:
    """Builds an admission filter ``target(**params)`` for each replay."""

    target: str
    params: tuple[tuple[str, Any], ...] = ()

    def __call__(self) -> AdmissionFilter:
        cls = load_object(self.target, "admission filter")
        try:
            instance = cls(**dict(self.params))
        except TypeError as exc:
            raise ValueError(
                f"bad parameters for admission filter '{self.target}': {exc}"
            ) from None
        if not isinstance(instance, AdmissionFilter):
            raise TypeError(
                f"'{self.target}' is not an admission filter: it needs admit(keys, ctx) and reset()"
            )
        return instance


__all__ = ["AdmissionFactory", "load_object"]
