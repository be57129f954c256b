"""One generic name -> plug-in registry: policies, specs, trace formats and tiers all use it.

A :class:`Registry` maps names to *lazy loaders*: registering imports nothing, and a plug-in's
module is imported when its name is first resolved. Everything a plug-in registry needs is
here once, so each factory on top of it is a thin wrapper that keeps its own public names.

Building one::

    # a registry of classes with a base-class check (abstract classes are refused)
    TIERS: Registry[type[Tier]] = Registry.of_subclasses(
        "tier", Tier, entry_point_group="kvoffload.tiers", module_path_key="tier_module_path"
    )
    TIERS.register("disk", "kvoffload.tiers.disk:DiskTier", description="Files on a local disk.")
    TIERS.resolve("disk")                        # imports kvoffload.tiers.disk now
    TIERS.resolve("my_pkg.tiers:S3Tier")         # an out-of-tree class, no registration
    TIERS.resolve("S3Tier", "my_pkg.tiers")      # the same, vLLM's name + module-path style

    # a registry of anything: give the check that turns a loaded object into a T
    FORMATS: Registry[TraceFormat] = Registry("trace format", check=as_trace_format)

Resolution order of :meth:`Registry.resolve` (``name``, ``module_path``):

1. ``module_path`` given: that module is imported (an error if it cannot be) and its
   attribute ``name`` wins when it has one (logged as out-of-tree loading); a module without
   it falls back to a registered ``name`` (vLLM's behaviour) or is an ``ImportError`` listing
   what the module does hold;
2. a registered name;
3. ``"package.module:Attr"`` in ``name`` itself (logged as out-of-tree loading);
4. an alias given at registration (policies alias their class names: ``"LRUCachePolicy"``);
5. an installed distribution's entry point named ``name`` in ``entry_point_group``;
6. otherwise ``ValueError`` with a case-insensitive did-you-mean and the known names.

Errors: ``ValueError`` (unknown or duplicate name, malformed ``module:Attr``), ``TypeError``
(a name or module path that is not a string; a loaded object that fails the check, such as a
class that is not a subclass of the base, or is abstract), ``ImportError`` (a module that
cannot be imported, whatever it raised, ``sys.exit`` included, or lacks the attribute: the
message names the plug-in and the module). One broken plug-in never hides the others:
:meth:`Registry.describe` loads each entry on its own and reports a failure in that entry.

For tests, ``with registry.snapshot(): ...`` restores the registrations on exit.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import Any, Generic, TypeVar, cast

T = TypeVar("T")
B = TypeVar("B")

#: A zero-argument function returning the object to check (what ``register`` stores).
Loader = Callable[[], object]

_registry_logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegistryEntry:
    """One resolvable name as :meth:`Registry.describe` lists it.

    Attributes:
        name: the name to resolve.
        description: one line (given at registration, else the object's docstring), or
            ``"(cannot be loaded: ...)"`` when loading failed.
        source: ``"built-in"``, ``"registered"`` or ``"entry point (<distribution>)"``.
        target: ``"module:Attr"`` (``"<loader>"`` for a callable loader).
        error: why loading failed, or ``None``.
    """

    name: str
    description: str
    source: str
    target: str
    error: str | None = None


@dataclass(frozen=True)
class _Registration:
    target: str
    loader: Loader
    description: str | None
    source: str


def first_doc_line(obj: object) -> str:
    """The first non-blank line of ``obj``'s own docstring (``""`` without one).

    A class's docstring is not inherited here: a subclass without one describes as ``""``.
    """
    doc = obj.__doc__
    if not doc or not isinstance(doc, str):
        return ""
    for line in inspect.cleandoc(doc).splitlines():
        if line.strip():
            return line.strip()
    return ""


def import_plugin_module(kind: str, name: str, module_path: str) -> ModuleType:
    """Import ``module_path`` for plug-in ``name``; any failure is an ``ImportError`` naming both.

    A module that raises something other than ``ImportError`` while importing (a bug in a
    plug-in) or calls ``sys.exit`` is reported the same way, chained to what it raised, so a
    caller listing many plug-ins can isolate it. ``KeyboardInterrupt`` still propagates.
    """
    try:
        return importlib.import_module(module_path)
    except ImportError as exc:
        raise ImportError(
            f"Cannot load {kind} '{name}': importing module '{module_path}' failed: {exc}"
        ) from exc
    except SystemExit as exc:
        raise ImportError(
            f"Cannot load {kind} '{name}': module '{module_path}' called sys.exit({exc.code!r}) "
            "while being imported"
        ) from exc
    except Exception as exc:
        raise ImportError(
            f"Cannot load {kind} '{name}': importing module '{module_path}' raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def split_target(kind: str, target: str) -> tuple[str, str]:
    """``"package.module:Attr"`` -> ``("package.module", "Attr")``; ``ValueError`` if malformed."""
    module_path, sep, attr = target.partition(":")
    if not sep or not module_path or not attr:
        raise ValueError(
            f"{_capitalized(kind)} '{target}' looks like 'module:ClassName' but a part is empty."
        )
    return module_path, attr


def _capitalized(kind: str) -> str:
    return kind[:1].upper() + kind[1:]


def _error_text(exc: Exception) -> str:
    """The message of one of our errors; other exceptions also say what they are."""
    if isinstance(exc, (ImportError, TypeError, ValueError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _describe_object(obj: object) -> str:
    return obj.__qualname__ if inspect.isclass(obj) else type(obj).__name__ + " instance"


def subclass_check(kind: str, base: Callable[..., B]) -> Callable[[str, object], type[B]]:
    """A check accepting a concrete subclass of ``base``; ``TypeError`` for anything else.

    ``base`` is a class; it is typed as a callable only so that mypy accepts an abstract one.
    """
    base = _as_class(base)
    base_name = f"{base.__module__}.{base.__qualname__}"

    def check(name: str, obj: object) -> type[B]:
        if not (inspect.isclass(obj) and issubclass(obj, base)):
            raise TypeError(
                f"{_capitalized(kind)} '{name}' resolved to {_describe_object(obj)}, which is "
                f"not a subclass of {base_name}."
            )
        if obj is base or inspect.isabstract(obj):
            missing = sorted(getattr(obj, "__abstractmethods__", ()))
            detail = f" (abstract methods: {', '.join(missing)})" if missing else ""
            raise TypeError(
                f"{_capitalized(kind)} '{name}' resolved to {obj.__qualname__}, which is "
                f"abstract{detail}: name a concrete subclass of {base_name}."
            )
        return cast("type[B]", obj)

    return check


def _as_class(base: object) -> type[Any]:
    if not inspect.isclass(base):
        raise TypeError(f"base must be a class, got {type(base).__name__} {base!r}")
    return base


class Registry(Generic[T]):
    """Names -> lazily loaded plug-ins of one kind (thread-safe; see the module docstring).

    Args:
        kind: what the entries are, lower case (``"cache policy"``): it starts every message.
        check: turns a loaded object into a ``T`` or raises ``TypeError``.
        base: the base class, when entries are classes: a module lacking the asked-for
            attribute is reported with the subclasses it holds.
        entry_point_group: distributions advertise out-of-tree entries here (``None``: none).
        module_path_key: the setting that names a module (``"cache_policy_module_path"``),
            for the unknown-name hint.
        experimental_out_of_tree: log a warning (not info) that out-of-tree loading is
            experimental whenever a ``module:Attr`` or module path is loaded.
        logger: where those messages go (default: this module's logger).
        find_entry_points: overrides how entry points are listed (tests; default: the
            installed distributions' ``entry_point_group``).
    """

    def __init__(
        self,
        kind: str,
        check: Callable[[str, object], T],
        *,
        base: type | None = None,
        entry_point_group: str | None = None,
        module_path_key: str | None = None,
        experimental_out_of_tree: bool = False,
        logger: logging.Logger | None = None,
        find_entry_points: Callable[[], Iterable[metadata.EntryPoint]] | None = None,
    ) -> None:
        if not isinstance(kind, str) or not kind:
            raise TypeError(f"kind must be a non-empty string, got {kind!r}")
        self.kind = kind
        self.entry_point_group = entry_point_group
        self._check = check
        self._base = base
        self._module_path_key = module_path_key
        self._experimental = experimental_out_of_tree
        self._logger = logger or _registry_logger
        self._find_entry_points = find_entry_points
        self._entries: dict[str, _Registration] = {}
        self._aliases: dict[str, str] = {}
        self._lock = threading.RLock()
        self._warned: set[tuple[str, str]] = set()  # out-of-tree loads warned about

    @staticmethod
    def of_subclasses(
        kind: str,
        base: Callable[..., B],
        *,
        entry_point_group: str | None = None,
        module_path_key: str | None = None,
        experimental_out_of_tree: bool = False,
        logger: logging.Logger | None = None,
    ) -> Registry[type[B]]:
        """A registry of concrete subclasses of ``base`` (the usual case: policies, tiers).

        ``base`` is a class (typed as a callable only so that mypy accepts an abstract one).
        """
        return Registry(
            kind,
            subclass_check(kind, base),
            base=_as_class(base),
            entry_point_group=entry_point_group,
            module_path_key=module_path_key,
            experimental_out_of_tree=experimental_out_of_tree,
            logger=logger,
        )

    # ------------------------------------------------------------------ registration

    def register(
        self,
        name: str,
        target: str | Loader,
        *,
        description: str | None = None,
        aliases: Iterable[str] = (),
        source: str = "registered",
    ) -> None:
        """Register ``name`` -> ``target`` (``"module:Attr"`` or a zero-argument loader).

        Nothing is imported now. ``description`` (one line) lets :meth:`describe` skip the
        import. Each alias resolves to ``name`` unless an earlier registration claimed it.
        A name registered already is a ``ValueError``.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(
                f"{_capitalized(self.kind)} name must be a non-empty string, got {name!r}."
            )
        if isinstance(target, str):
            module_path, attr = split_target(self.kind, target)
            text = target

            def loader() -> object:
                return self._load_attr(name, module_path, attr)

        elif callable(target):
            text, loader = "<loader>", target
        else:
            raise TypeError(
                f"{self.kind} target must be a 'module:Attr' string or a loader, got "
                f"{type(target).__name__}"
            )
        alias_list = list(aliases)
        with self._lock:
            if name in self._entries:
                raise ValueError(f"{_capitalized(self.kind)} '{name}' is already registered.")
            self._entries[name] = _Registration(text, loader, description, source)
            for alias in alias_list:
                self._aliases.setdefault(alias, name)

    def unregister(self, name: str) -> None:
        """Remove ``name`` and the aliases pointing at it (tests, plug-in reloads)."""
        with self._lock:
            if self._entries.pop(name, None) is None:
                raise ValueError(f"{_capitalized(self.kind)} '{name}' is not registered.")
            for alias in [a for a, n in self._aliases.items() if n == name]:
                del self._aliases[alias]

    def names(self) -> list[str]:
        """Registered names, in registration order (entry points not included)."""
        with self._lock:
            return list(self._entries)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._entries

    def entry_point_names(self) -> list[str]:
        """Names advertised by installed distributions (nothing is loaded)."""
        return [ep.name for ep in self.entry_points()]

    def known_names(self) -> list[str]:
        """Registered and entry-point names, sorted."""
        return sorted(set(self.names()) | set(self.entry_point_names()))

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Restore the registrations and aliases to their current content on exit (tests)."""
        with self._lock:
            saved = dict(self._entries), dict(self._aliases)
        try:
            yield
        finally:
            with self._lock:
                self._entries.clear()
                self._entries.update(saved[0])
                self._aliases.clear()
                self._aliases.update(saved[1])

    # ------------------------------------------------------------------ resolution

    def resolve(self, name: str, module_path: str | None = None) -> T:
        """The plug-in ``name`` refers to (the order is in the module docstring)."""
        if not isinstance(name, str):
            raise TypeError(
                f"{self.kind} name must be a string, got {type(name).__name__} {name!r}"
            )
        if not name:
            raise ValueError(
                f"{_capitalized(self.kind)} name must be a non-empty string, got {name!r}."
            )
        if module_path is not None and not isinstance(module_path, str):
            raise TypeError(
                f"{self.kind} module path must be a module name string, got "
                f"{type(module_path).__name__} {module_path!r}"
            )
        if module_path:
            return self._resolve_in_module(name, module_path)
        registration = self._registration(name, with_aliases=False)
        if registration is not None:
            return self._check(name, registration.loader())
        if ":" in name:
            return self.load_target(name)
        registration = self._registration(name, with_aliases=True)
        if registration is not None:
            return self._check(name, registration.loader())
        entry_point = self._entry_point(name)
        if entry_point is not None:
            return self._check(name, self._load_entry_point(entry_point))
        raise ValueError(self.unknown_message(name))

    def load_target(self, target: str) -> T:
        """Load and check ``"package.module:Attr"`` (logged as out-of-tree loading)."""
        module_path, attr = split_target(self.kind, target)
        self._log_out_of_tree(attr, module_path)
        return self._check(target, self._load_attr(target, module_path, attr))

    def suggest(self, name: str) -> str | None:
        """The closest known name, case-insensitively (``"LRU"``, ``"lruu"`` -> ``"lru"``)."""
        with self._lock:
            candidates = list(self._entries) + list(self._aliases)
        candidates += [n for n in self.entry_point_names() if n not in candidates]
        by_fold: dict[str, str] = {}
        for candidate in candidates:
            by_fold.setdefault(candidate.casefold(), candidate)
        folded = name.casefold()
        if folded in by_fold:
            return by_fold[folded]
        close = difflib.get_close_matches(folded, list(by_fold), n=1, cutoff=0.6)
        return by_fold[close[0]] if close else None

    def unknown_message(self, name: str) -> str:
        """``Unknown <kind>: '<name>'. Did you mean ...? Supported: [...]. <how to load>``."""
        close = self.suggest(name)
        hint = f" Did you mean '{close}'?" if close is not None else ""
        short = self.kind.split()[-1]
        how = f"For an out-of-tree {short}, "
        how += f"also set {self._module_path_key} (or pass " if self._module_path_key else "pass "
        how += "'package.module:ClassName')." if self._module_path_key else "'package.module:Attr'."
        return f"Unknown {self.kind}: '{name}'.{hint} Supported: {self.known_names()}. {how}"

    def describe(self) -> list[RegistryEntry]:
        """Every registered and entry-point name, each loaded on its own (failures reported)."""
        with self._lock:
            registrations = list(self._entries.items())
        out: list[RegistryEntry] = []
        for name, reg in registrations:
            description, error = reg.description, None
            if description is None:
                try:
                    description = first_doc_line(self._check(name, reg.loader()))
                except Exception as exc:  # one broken entry must not hide the others
                    error = _error_text(exc)
                    description = f"(cannot be loaded: {error})"
            out.append(RegistryEntry(name, description, reg.source, reg.target, error))
        seen = {entry.name for entry in out}
        for ep in self.entry_points():
            if ep.name in seen:
                continue
            seen.add(ep.name)
            error = None
            try:
                description = first_doc_line(self._check(ep.name, self._load_entry_point(ep)))
            except Exception as exc:  # one broken entry must not hide the others
                error = _error_text(exc)
                description = f"(cannot be loaded: {error})"
            dist = getattr(getattr(ep, "dist", None), "name", None) or "unknown distribution"
            out.append(
                RegistryEntry(ep.name, description, f"entry point ({dist})", ep.value, error)
            )
        return out

    def entry_points(self) -> list[metadata.EntryPoint]:
        """The advertised entry points (a broken distribution's metadata is logged, skipped)."""
        if self._find_entry_points is not None:
            return list(self._find_entry_points())
        if self.entry_point_group is None:
            return []
        try:
            return list(metadata.entry_points(group=self.entry_point_group))
        except Exception as exc:  # bad installed metadata must not hide the rest
            self._logger.warning(
                "Cannot list entry points of group '%s': %s", self.entry_point_group, exc
            )
            return []

    # ------------------------------------------------------------------ internals

    def _registration(self, name: str, *, with_aliases: bool) -> _Registration | None:
        with self._lock:
            registration = self._entries.get(name)
            if registration is None and with_aliases:
                alias = self._aliases.get(name)
                registration = self._entries.get(alias) if alias is not None else None
            return registration

    def _resolve_in_module(self, name: str, module_path: str) -> T:
        module = import_plugin_module(self.kind, name, module_path)
        if hasattr(module, name):
            self._log_out_of_tree(name, module_path)
            return self._check(name, getattr(module, name))
        registration = self._registration(name, with_aliases=False)
        if registration is not None:
            return self._check(name, registration.loader())
        raise ImportError(self._missing_attr_message(name, module, module_path, name))

    def _load_attr(self, name: str, module_path: str, attr: str) -> object:
        module = import_plugin_module(self.kind, name, module_path)
        try:
            return getattr(module, attr)
        except AttributeError:
            raise ImportError(self._missing_attr_message(name, module, module_path, attr)) from None

    def _missing_attr_message(
        self, name: str, module: ModuleType, module_path: str, attr: str
    ) -> str:
        message = f"Cannot load {self.kind} '{name}': module '{module_path}' has no class '{attr}'."
        base = self._base
        if base is not None:
            found = sorted(
                key
                for key, value in vars(module).items()
                if inspect.isclass(value)
                and issubclass(value, base)
                and value is not base
                and not inspect.isabstract(value)
            )
            message += f" {base.__name__} subclasses in that module: {found or 'none'}."
        return message

    def _entry_point(self, name: str) -> metadata.EntryPoint | None:
        for ep in self.entry_points():
            if ep.name == name:
                return ep
        return None

    def _load_entry_point(self, ep: metadata.EntryPoint) -> object:
        try:
            return ep.load()
        except SystemExit as exc:
            raise ImportError(
                f"Cannot load {self.kind} '{ep.name}' from entry point '{ep.value}': it called "
                f"sys.exit({exc.code!r}) while being imported"
            ) from exc
        except ImportError as exc:
            raise ImportError(
                f"Cannot load {self.kind} '{ep.name}' from entry point '{ep.value}': {exc}"
            ) from exc
        except Exception as exc:
            raise ImportError(
                f"Cannot load {self.kind} '{ep.name}' from entry point '{ep.value}': loading "
                f"raised {type(exc).__name__}: {exc}"
            ) from exc

    def _log_out_of_tree(self, attr: str, module_path: str) -> None:
        # Once per class and process: a run builds the same plug-in once per replay or
        # engine, and the warning says nothing new the second time.
        with self._lock:
            if (attr, module_path) in self._warned:
                return
            self._warned.add((attr, module_path))
        if self._experimental:
            short = self.kind.split()[-1]
            self._logger.warning(
                "Loading out-of-tree %s '%s' from module '%s': out-of-tree %s loading is "
                "experimental.",
                self.kind,
                attr,
                module_path,
                short,
            )
        else:
            self._logger.info("Loading %s '%s' from '%s'", self.kind, attr, module_path)


def load_object(target: str, what: str) -> Any:
    """Import ``"package.module:Name"`` unchecked (one-off objects named on a command line).

    ``what`` names the object in errors (``"admission filter"``).
    """
    if not isinstance(target, str):
        raise TypeError(f"{what} must be a 'package.module:Name' string, got {target!r}")
    module_path, sep, attr = target.partition(":")
    if not sep or not module_path or not attr:
        raise ValueError(f"{what} '{target}' must look like 'package.module:ClassName'")
    module = import_plugin_module(what, target, module_path)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ImportError(f"Cannot load {what} '{target}': module has no '{attr}'") from None


__all__ = [
    "Registry",
    "RegistryEntry",
    "first_doc_line",
    "import_plugin_module",
    "load_object",
    "split_target",
    "subclass_check",
]
