"""Which policy to build: a name (or ``module:Class``), a module, and its parameters.

One type for "a policy and its parameters" wherever one is named: a replay's policy
(``kvoffload.sim.replay``), ``auto``'s candidates, a shadow. Why at this floor: the
simulator above and the policies that pick among others (``auto``) both need it, and the
policies may not import the simulator. The short spellings of a candidate that callers pass (a name,
or a ``(name, params)`` pair) are read once, by :meth:`PolicySpec.parse`, where they enter
(``auto``, the shadows); :attr:`PolicySpec.label` is every printed and recorded name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PolicySpec:
    """A registered name (or ``module:Class``), an optional module, params as sorted pairs."""

    name: str
    module_path: str | None = None
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(
        cls, name: str, module_path: str | None = None, params: Mapping[str, Any] | None = None
    ) -> PolicySpec:
        """Build a spec from a params mapping (kept as sorted pairs so the spec is hashable)."""
        return cls(name, module_path, tuple(sorted((params or {}).items())))

    @classmethod
    def parse(cls, spec: object) -> PolicySpec:
        """A spec, a policy name, or a ``(name, params mapping)`` pair; ``TypeError`` else."""
        if isinstance(spec, PolicySpec):
            return spec
        if isinstance(spec, str) and spec:
            return cls(spec)
        if (
            isinstance(spec, (tuple, list))
            and len(spec) == 2
            and isinstance(spec[0], str)
            and isinstance(spec[1], Mapping)
        ):
            return cls.of(spec[0], None, spec[1])
        raise TypeError(
            f"a candidate must be a policy name or a (name, params mapping) pair, got {spec!r}"
        )

    @classmethod
    def parse_list(cls, specs: object, what: str = "candidates") -> list[PolicySpec]:
        """A comma-separated string of names, or a sequence of what :meth:`parse` reads."""
        if isinstance(specs, str):
            names = [name.strip() for name in specs.split(",") if name.strip()]
            if not names:
                raise ValueError(f"{what} must name at least one policy, got an empty string")
            return [cls(name) for name in names]
        if not isinstance(specs, (list, tuple)):
            raise TypeError(
                f"{what} must be a comma-separated string or a sequence of policy names / "
                f"(name, params) pairs, got {type(specs).__name__}"
            )
        out = [cls.parse(spec) for spec in specs]
        if not out:
            raise ValueError(f"{what} must name at least one policy")
        return out

    @property
    def label(self) -> str:
        """Short display name: the policy name plus its parameters (``arc(p=1)``)."""
        if not self.params:
            return self.name
        return f"{self.name}({', '.join(f'{k}={v}' for k, v in self.params)})"

    @property
    def param_dict(self) -> dict[str, Any]:
        """The parameters as keyword arguments."""
        return dict(self.params)

    def as_candidate(self) -> str | tuple[str, dict[str, Any]]:
        """The short spelling :meth:`parse` reads back: the name, or ``(name, params)``."""
        return (self.name, self.param_dict) if self.params else self.name


__all__ = ["PolicySpec"]
