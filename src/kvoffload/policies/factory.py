"""CachePolicyFactory: policies registered by name with lazy loaders, plus out-of-tree loading.

The factory is vLLM's public face over one :class:`kvoffload.registry.Registry` of
``CachePolicy`` subclasses (:data:`POLICY_REGISTRY`). Resolution order for
``get_cache_policy_cls(name, module_path)``:

1. ``module_path`` given: ``ClassName`` = ``name`` imported from that module (vLLM's
   ``cache_policy_module_path``; logs a warning that out-of-tree loading is experimental).
   The module must import; one without that class falls back to a registered name;
2. a registered name (``"lru"``);
3. ``"package.module:ClassName"`` in ``name`` itself (the same warning);
4. a registered policy's class name (``"LRUCachePolicy"``): after the module path, so a
   user's own ``ARCCachePolicy`` in ``module_path`` wins over ours, as in vLLM;
5. an installed distribution's entry point named ``name`` in the group
   ``kvoffload.cache_policies`` (loaded only now, never at import time);
6. otherwise ``ValueError`` with a case-insensitive did-you-mean and the known names.

Nothing is imported at registration. Errors are ``ValueError`` (unknown / duplicate name),
``ImportError`` (module or class cannot be loaded, naming the module, whatever the module
raised) or ``TypeError`` (a name or module path that is not a string; not a concrete
``CachePolicy``). A class written for another engine's policy API (vLLM's ``CachePolicy``) is
wrapped by the first adapter advertised under the entry-point group
``kvoffload.policy_adapters`` that recognises it (kvoffload's own adapter for vLLM is one);
adapters are loaded only then, and one that cannot be loaded is logged and skipped.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata

from kvoffload.policies.base import CachePolicy
from kvoffload.registry import Registry, subclass_check

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "kvoffload.cache_policies"
ADAPTER_ENTRY_POINT_GROUP = "kvoffload.policy_adapters"

PolicyLoader = Callable[[], type[CachePolicy]]


@dataclass(frozen=True)
class PolicyInfo:
    """What ``kvoffload policies`` shows for one resolvable policy."""

    name: str
    description: str
    source: str  # "built-in", "registered" or "entry point (<distribution>)"
    target: str  # "module:ClassName"


_is_concrete_policy = subclass_check("cache policy", CachePolicy)


def _adapt_foreign_class(obj: object) -> type[CachePolicy] | None:
    """Ask the installed policy adapters to wrap a class written for another engine's API."""
    if not inspect.isclass(obj):
        return None
    for entry_point in metadata.entry_points(group=ADAPTER_ENTRY_POINT_GROUP):
        try:
            adapter = entry_point.load()
        except Exception as exc:  # one broken adapter must not hide the others
            logger.warning(
                "Skipping cache policy adapter '%s' (%s): loading it raised %s: %s",
                entry_point.name,
                entry_point.value,
                type(exc).__name__,
                exc,
            )
            continue
        adapted = adapter(obj)
        if adapted is not None:
            return _is_concrete_policy(obj.__qualname__, adapted)
    return None


def _delegated_policy(obj: type) -> str | None:
    """The kvoffload policy a foreign class stands for (``kvoffload_policy = "s3fifo"``).

    kvoffload's vLLM classes (``kvoffload.integrations.vllm.S3FIFOCachePolicy``) declare the
    policy they wrap, so a vLLM config naming them resolves to that policy here instead of a
    vLLM wrapper adapted back; a class built with parameters or a module path is not plain.
    """
    name = getattr(obj, "kvoffload_policy", None)
    if not isinstance(name, str) or getattr(obj, "kvoffload_params", None):
        return None
    return name if getattr(obj, "kvoffload_module_path", None) is None else None


def _check_policy_class(policy_name: str, obj: object) -> type[CachePolicy]:
    if inspect.isclass(obj) and not issubclass(obj, CachePolicy):
        delegate = _delegated_policy(obj)
        if delegate is not None and delegate != policy_name:
            return POLICY_REGISTRY.resolve(delegate)
        adapted = _adapt_foreign_class(obj)
        if adapted is not None:
            return adapted
    return _is_concrete_policy(policy_name, obj)


def _entry_points() -> list[metadata.EntryPoint]:
    return list(metadata.entry_points(group=ENTRY_POINT_GROUP))


#: The one registry behind :class:`CachePolicyFactory` (names -> lazily loaded classes).
POLICY_REGISTRY: Registry[type[CachePolicy]] = Registry(
    "cache policy",
    _check_policy_class,
    base=CachePolicy,
    entry_point_group=ENTRY_POINT_GROUP,
    module_path_key="cache_policy_module_path",
    experimental_out_of_tree=True,
    logger=logger,
    find_entry_points=lambda: _entry_points(),
)


class CachePolicyFactory:
    """Registry of cache policies: names -> lazy loaders (class-level, process-wide)."""

    registry = POLICY_REGISTRY

    @classmethod
    def register_cache_policy(
        cls,
        name: str,
        module_path: str,
        class_name: str,
        description: str | None = None,
        *,
        _source: str = "registered",
    ) -> None:
        """Register ``name`` -> ``module_path.class_name`` without importing anything.

        ``description`` (one line) lets listings skip the import; without it the class
        docstring's first line is used when someone asks. The class name becomes an alias.
        """
        for what, value in (("module_path", module_path), ("class_name", class_name)):
            if not isinstance(value, str) or not value:
                raise ValueError(f"Cache policy {what} must be a non-empty string, got {value!r}.")
        cls.registry.register(
            name,
            f"{module_path}:{class_name}",
            description=description,
            aliases=(class_name,),
            source=_source,
        )

    @classmethod
    def unregister_cache_policy(cls, name: str) -> None:
        """Remove ``name`` (mainly for tests and plugin reloads)."""
        cls.registry.unregister(name)

    @classmethod
    def registered_names(cls) -> list[str]:
        """Registered short names, in registration order."""
        return cls.registry.names()

    @classmethod
    def get_cache_policy_cls(cls, name: str, module_path: str | None = None) -> type[CachePolicy]:
        """Resolve ``name`` to a ``CachePolicy`` subclass (see the module docstring for order)."""
        return cls.registry.resolve(name, module_path)

    @classmethod
    def describe_cache_policies(cls) -> list[PolicyInfo]:
        """Every resolvable-by-name policy with a one-line description and its origin.

        Each entry is loaded on its own: one that cannot be loaded says why in its
        description and never hides the others.
        """
        return [
            PolicyInfo(e.name, e.description, e.source, e.target) for e in cls.registry.describe()
        ]

    @classmethod
    def available_cache_policies(cls) -> dict[str, str]:
        """Name -> one-line description for every policy resolvable by name."""
        return {info.name: info.description for info in cls.describe_cache_policies()}

    @classmethod
    @contextmanager
    def registry_snapshot(cls) -> Iterator[None]:
        """Restore the registry to its current content on exit (for tests)."""
        with cls.registry.snapshot():
            yield


def get_cache_policy_cls(name: str, module_path: str | None = None) -> type[CachePolicy]:
    """Shortcut for :meth:`CachePolicyFactory.get_cache_policy_cls`."""
    return CachePolicyFactory.get_cache_policy_cls(name, module_path)


def available_cache_policies() -> dict[str, str]:
    """Shortcut for :meth:`CachePolicyFactory.available_cache_policies`."""
    return CachePolicyFactory.available_cache_policies()


def create_cache_policy(
    name: str,
    cache_capacity: int,
    module_path: str | None = None,
    params: dict[str, object] | None = None,
) -> CachePolicy:
    """Resolve ``name`` and build it, turning a bad parameter into a clear ``ValueError``."""
    policy_cls = CachePolicyFactory.get_cache_policy_cls(name, module_path)
    params = dict(params or {})
    try:
        inspect.signature(policy_cls).bind(cache_capacity=cache_capacity, **params)
    except TypeError as exc:
        accepted = [
            p.name
            for p in inspect.signature(policy_cls).parameters.values()
            if p.name != "cache_capacity" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        raise ValueError(
            f"Bad cache_policy_params for policy '{name}': {exc}. "
            f"Accepted parameters: {accepted or 'none'}."
        ) from None
    return policy_cls(cache_capacity=cache_capacity, **params)


__all__ = [
    "ENTRY_POINT_GROUP",
    "POLICY_REGISTRY",
    "CachePolicyFactory",
    "PolicyInfo",
    "available_cache_policies",
    "create_cache_policy",
    "get_cache_policy_cls",
]
