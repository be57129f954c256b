"""Objects named on the command line (``package.module:Name``), built where they are used.

Loading goes through :func:`kvoffload.registry.load_object`, the one ``module:Name`` loader.

A factory holds only the name and parameters, so it pickles into sweep worker processes and
each replay builds a fresh object (admission filters keep per-replay history).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvoffload.admission import AdmissionFilter
from kvoffload.registry import load_object


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
