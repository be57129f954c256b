"""Secondary tiers from configuration: ``tiers: [...]`` entries checked, then built.

Why here and not in the spec: a tier's keys are its constructor's, so they are checked
against the tier class itself (did-you-mean on a typo, TypeError on a wrong type, naming the
key as ``tiers[i].key``) before anything is built, and every caller (the offloading spec, the
CLI, an engine integration) gets the same rules. Standard library only, like the rest of
:mod:`kvoffload.tiers`.

An entry is a mapping::

    {"type": "disk", "path": "/nvme/kv", "capacity_bytes": "200GiB",
     "write_policy": "write_through"}

``type`` is a registered tier (``disk``, ``redis``, ``memory``) or ``"module:Class"``; the
other keys are the tier's constructor keywords plus the manager's per-tier settings
(:class:`~kvoffload.tiers.manager.SecondaryTier`: ``write_policy``, ``fill``,
``max_inflight_bytes``, breaker settings, ...). vLLM's ``secondary_tiers`` shape is accepted
too: ``{"type": "fs", "root_dir": DIR}`` is the disk tier at ``DIR``, with vLLM's optional
``module_path`` (an out-of-tree class named by ``type``) and ``n_read_threads`` /
``n_write_threads`` (our ``io_threads``).
"""

from __future__ import annotations

import builtins
import contextlib
import difflib
import inspect
import logging
import os
import shutil
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvoffload._checks import check_int, redact
from kvoffload._sizes import format_size, parse_size
from kvoffload.tiers.base import SlotMemory, Tier
from kvoffload.tiers.registry import available_tiers, get_tier_cls
from kvoffload.tiers.settings import _SETTING_DEFAULTS, SecondaryTier, check_tier_settings

logger = logging.getLogger(__name__)

#: vLLM's tier type names that are ours under another name.
TYPE_ALIASES = {"fs": "disk", "file": "disk", "filesystem": "disk"}
#: vLLM keys renamed here (applied before checking).
KEY_ALIASES = {"root_dir": "path"}
#: vLLM keys this library does not take, with what to do instead.
REPLACED_KEYS = {
    "backpressure": "kvoffload bounds each tier's in-flight bytes with max_inflight_bytes",
    "locality": "tiers are asked in the order they are listed",
    "enable_kv_events": "the CPU tier's enable_kv_cache_events records the events",
}
#: Share of the free space a disk tier without ``capacity_bytes`` takes (vLLM's fs tier has
#: no bound at all, vllm #52784; we never run a disk full).
DEFAULT_DISK_SHARE = 0.5

_RESERVED = ("memory", "self")


def parse_bytes(name: str, value: Any) -> int:
    """An int of bytes, or a size string (``"2GiB"``, ``"500MB"``, ``"4096"``), as bytes
    (:func:`kvoffload._sizes.parse_size`, named as the config key ``name``)."""
    return parse_size(f"config '{name}'", value, low=None)  # each key checks its own range


def _simple_types(hint: Any) -> tuple[type, ...] | None:
    """The plain types a hint allows (``int | None`` -> (int, NoneType)); None: do not check."""
    plain = (int, float, str, bool, bytes, type(None))
    if hint in plain:
        return (hint,)
    args = typing.get_args(hint)
    if args and all(a in plain for a in args):
        return tuple(args)
    return None


def _check_type(where: str, value: Any, allowed: tuple[type, ...]) -> None:
    if value is None and type(None) in allowed:
        return
    if isinstance(value, bool) and bool not in allowed:
        ok = False
    elif isinstance(value, int) and not isinstance(value, bool) and float in allowed:
        ok = True  # an int where a float is taken
    elif isinstance(value, str) and bytes in allowed:
        ok = True  # text for bytes (secrets, namespaces) is encoded by the tier
    else:
        ok = isinstance(value, tuple(t for t in allowed if t is not type(None)))
    if not ok:
        names = " or ".join("None" if t is type(None) else t.__name__ for t in allowed)
        given = redact(where, value)
        raise TypeError(f"config '{where}' must be {names}, got {type(value).__name__} {given!r}")


@dataclass(frozen=True, repr=False)
class TierConfig:
    """One checked ``tiers`` entry: the tier class, its constructor keywords, its manager keys.

    Attributes:
        type: the name as configured (after vLLM aliases: ``fs`` -> ``disk``).
        cls: the tier class it resolves to.
        params: constructor keywords (sizes already in bytes).
        manager: :class:`SecondaryTier` keywords (``write_policy``, ``fill``, ...).
        index: position in the list (for messages and default labels).
    """

    type: str
    cls: builtins.type[Tier]
    params: Mapping[str, Any] = field(default_factory=dict)
    manager: Mapping[str, Any] = field(default_factory=dict)
    index: int = 0

    @property
    def where(self) -> str:
        return f"tiers[{self.index}]"

    def __repr__(self) -> str:
        """Passwords, secrets and URL credentials as ``***``: configs get logged."""
        return (
            f"TierConfig(type={self.type!r}, cls={self.cls.__module__}.{self.cls.__qualname__}, "
            f"params={redact('params', dict(self.params))!r}, "
            f"manager={redact('manager', dict(self.manager))!r}, index={self.index})"
        )

    def build(self, memory: SlotMemory, **defaults: Any) -> SecondaryTier:
        """The tier over ``memory`` wrapped for the manager; ``defaults`` fill unset params
        the constructor takes (the spec passes ``namespace``)."""
        accepted = _constructor_params(self.cls)
        params = {**{k: v for k, v in defaults.items() if k in accepted}, **self.params}
        if self.cls.__name__ == "DiskTier":
            path = os.fspath(params.get("path", "."))
            _make_disk_dir(self.where, path)
            if "capacity_bytes" not in params:
                params["capacity_bytes"] = _default_disk_capacity(path)
            else:
                _warn_past_free_space(self.where, path, params["capacity_bytes"])
        try:
            tier = self.cls(memory, **params)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"config '{self.where}' ({self.type}): {exc}") from exc
        return SecondaryTier(tier, **self.manager)


def _constructor_params(cls: type[Tier]) -> dict[str, inspect.Parameter]:
    signature = inspect.signature(cls.__init__)
    return {
        name: p
        for name, p in signature.parameters.items()
        if name not in _RESERVED and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def _nearest_existing(path: str) -> str:
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return probe


def _check_disk_path(where: str, path: object) -> None:
    """A disk tier's ``path`` is a directory, or can become one: fail now, naming the key,
    rather than with an OS error about a folder inside it."""
    if not isinstance(path, (str, os.PathLike)):
        return  # the type check names it
    text = os.fspath(path)
    existing = _nearest_existing(str(text))
    if not os.path.isdir(existing):
        what = (
            "is a file" if existing == os.path.abspath(text) else f"is under the file '{existing}'"
        )
        raise ValueError(
            f"config '{where}.path' must be a directory (made if missing), got '{text}', which "
            f"{what}"
        )


def _make_disk_dir(where: str, path: str) -> None:
    """Create the disk tier's directory now, so a place it cannot be is one line naming it."""
    _check_disk_path(where, path)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        why = f": {exc.strerror or exc}"
    else:
        why = "" if os.access(path, os.W_OK | os.X_OK) else ", which is not writable"
    if why:
        raise ValueError(
            f"config '{where}.path' must be a directory this process can create and write, "
            f"got '{path}'{why}"
        )


def _bytes_under(path: str) -> int:
    """Disk bytes the files under ``path`` take (a tier's own records count as room)."""
    used = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                used += os.stat(os.path.join(root, name)).st_blocks * 512
    return used


def _warn_past_free_space(where: str, path: str, capacity: object) -> None:
    """One WARNING when ``capacity_bytes`` is more than the disk can give the tier: it is
    accepted (space may be freed later; the tier keeps within what is free), but a budget
    the disk cannot hold is usually a typo in a unit."""
    if not isinstance(capacity, int):
        return
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return
    held = _bytes_under(path)
    if capacity > free + held:
        logger.warning(
            "config '%s.capacity_bytes' is %d bytes (%s), more than the %s free at %s "
            "(plus %s of files already there); the tier stores until the disk is full",
            where,
            capacity,
            format_size(capacity),
            format_size(free),
            path,
            format_size(held),
        )


def _default_disk_capacity(path: str) -> int:
    free = shutil.disk_usage(_nearest_existing(path)).free
    capacity = int(free * DEFAULT_DISK_SHARE)
    logger.info(
        "disk tier at %s has no capacity_bytes: using %.0f%% of the free space, %d bytes",
        path,
        DEFAULT_DISK_SHARE * 100,
        capacity,
    )
    return capacity


def _resolve_type(where: str, raw: Mapping[str, Any]) -> tuple[str, type[Tier]]:
    if "type" not in raw:
        raise ValueError(
            f"config '{where}' needs a 'type': one of {available_tiers()} or 'module:Class'"
        )
    name = raw["type"]
    if not isinstance(name, str) or not name:
        raise TypeError(f"config '{where}.type' must be a non-empty string, got {name!r}")
    if name == "cpu":
        raise ValueError(
            f"config '{where}.type': the CPU tier is always first (cpu_bytes_to_use); "
            "list only the tiers behind it"
        )
    module_path = raw.get("module_path")
    if module_path is not None:
        if not isinstance(module_path, str) or not module_path:
            raise TypeError(f"config '{where}.module_path' must be a non-empty string")
        name = f"{module_path}:{name}"
    name = TYPE_ALIASES.get(name, name)
    try:
        return name, get_tier_cls(name)
    except ValueError as exc:
        message = str(exc).rstrip(".")
        close = difflib.get_close_matches(name, available_tiers(), n=1)
        hint = f" Did you mean '{close[0]}'?" if close and "Did you mean" not in message else ""
        raise ValueError(f"config '{where}.type': {message}.{hint}") from None
    except (ImportError, TypeError) as exc:  # an out-of-tree tier that does not load
        raise type(exc)(f"config '{where}.type': {exc}") from exc


def parse_tier(raw: Mapping[str, Any], index: int = 0) -> TierConfig:
    """Check one entry against its tier class (see the module docstring)."""
    where = f"tiers[{index}]"
    if isinstance(raw, TierConfig):
        return raw
    if isinstance(raw, str):  # "disk" alone: a tier with every default
        raw = {"type": raw}
    if not isinstance(raw, Mapping):
        raise TypeError(f"config '{where}' must be a mapping with a 'type', got {raw!r}")
    name, cls = _resolve_type(where, raw)
    accepted = _constructor_params(cls)
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # an annotation that does not resolve here: check only the names
        hints = {}
    params: dict[str, Any] = {}
    manager: dict[str, Any] = {}
    threads: list[int] = []
    for key, value in raw.items():
        if not isinstance(key, str):
            raise TypeError(f"config '{where}' keys must be strings, got {key!r}")
        if key in ("type", "module_path"):
            continue
        if key in ("n_read_threads", "n_write_threads") and "io_threads" in accepted:
            threads.append(check_int(f"config '{where}.{key}'", value))
            key = "io_threads"
            value = max(threads)
        key = KEY_ALIASES.get(key, key)
        if key in REPLACED_KEYS:
            raise ValueError(f"config '{where}.{key}' is not accepted: {REPLACED_KEYS[key]}")
        if key in _SETTING_DEFAULTS:
            manager[key] = value
            continue
        if key not in accepted:
            options = sorted(set(accepted) | set(_SETTING_DEFAULTS))
            close = difflib.get_close_matches(key, options, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ValueError(
                f"unknown key '{where}.{key}' for tier '{name}'.{hint} "
                f"Accepted keys: {', '.join(options)}"
            )
        if key.endswith("_bytes"):
            value = check_int(f"config '{where}.{key}'", parse_bytes(f"{where}.{key}", value), 0)
        if key == "path" and cls.__name__ == "DiskTier":
            _check_disk_path(where, value)
        allowed = _simple_types(hints.get(key))
        if allowed is not None:
            _check_type(f"{where}.{key}", value, allowed)
        params[key] = value
    for pname, p in accepted.items():
        if p.default is inspect.Parameter.empty and pname not in params:
            if pname == "capacity_bytes" and cls.__name__ == "DiskTier":
                continue  # defaults to a share of the free space at build time
            raise ValueError(f"config '{where}' ({name}) needs '{pname}'")
    if "max_inflight_bytes" in manager:
        manager["max_inflight_bytes"] = parse_bytes(
            f"{where}.max_inflight_bytes", manager["max_inflight_bytes"]
        )
    manager.setdefault("label", None)
    try:  # the dataclass's own rules, without a tier
        check_tier_settings(manager)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"config '{where}': {exc}") from None
    return TierConfig(name, cls, params, manager, index)


def parse_tiers(raw: Any) -> tuple[TierConfig, ...]:
    """Check a whole ``tiers`` (or vLLM ``secondary_tiers``) list, nearest tier first."""
    if raw is None:
        return ()
    if isinstance(raw, (str, bytes, Mapping)) or not isinstance(raw, Sequence):
        raise TypeError(
            "config 'tiers' must be a list of tier mappings (each with a 'type'), got "
            f"{type(raw).__name__}"
        )
    return tuple(parse_tier(item, i) for i, item in enumerate(raw))


def build_tiers(
    configs: Sequence[TierConfig], memory: SlotMemory, **defaults: Any
) -> list[SecondaryTier]:
    """Build every configured tier over ``memory``; closes the ones built if one fails."""
    built: list[SecondaryTier] = []
    try:
        for config in configs:
            built.append(config.build(memory, **defaults))
    except BaseException:
        for secondary in built:
            secondary.tier.close()
        raise
    return built


__all__ = [
    "DEFAULT_DISK_SHARE",
    "TierConfig",
    "build_tiers",
    "parse_bytes",
    "parse_tier",
    "parse_tiers",
]
