"""Export and restore a policy's whole state (order, frequencies, ghosts), without pickle.

A restarted process that restores its policy's state resumes with the same decisions instead
of cold, LRU-like ones. The encoding is generic (it walks the policy's attributes, so every
built-in and ``auto`` work with no per-policy code) but restricted, so restoring untrusted
bytes cannot run code:

* JSON, versioned: ``{"format": FORMAT, "version": VERSION, "root": ..., "objects": [...]}``;
* values are ``None``, bools, ints, floats, strings, ``bytes`` (hex), tuples and frozensets
  inline, the clocks ``time.monotonic`` / ``time.time`` / ``time.perf_counter`` by name, and
  the bound ``get`` of a stored dict or object (a block ledger's getter) by its owner;
  lists, dicts, ``OrderedDict``\\ s, sets, deques, bytearrays, ``random.Random`` states and
  objects go in a flat ``objects`` table and are referenced by index, so shared objects stay
  shared and cycles and long linked chains (SIEVE's nodes) need no recursion;
* an object is restored only when its class is defined in a ``kvoffload.policies`` or
  ``kvoffload.selection`` module (``auto`` and its shadows; their miniatures' block ledgers
  and slot pools too), or one of ``allowed_modules``:
  the module is imported by name, the class looked up by its qualified name, created with
  ``__new__`` and its attributes set directly; no
  constructor, ``__setstate__`` or any other code of the data's choosing runs.

What the state holds is the policy's only: the manager's slot bookkeeping and in-flight jobs
are not in it. A restarted manager rebuilds its slots from the restored ``block_table`` and
calls :func:`settle_restored` first (in-flight loads and writes did not survive the restart).
"""

from __future__ import annotations

import importlib
import json
import random
import re
import time
import types
from collections import OrderedDict, deque
from collections.abc import Collection
from typing import Any

from kvoffload.context import LIVE_FIELDS, ReqContext
from kvoffload.policies.base import CachePolicy

FORMAT = "kvoffload.policy-state"
VERSION = 1
#: ``auto``'s shadows keep each miniature's blocks in a block ledger (its slot pool with it).
_TRUSTED = (
    "kvoffload.policies",
    "kvoffload.selection",
    "kvoffload.manager.ledger",
    "kvoffload.manager.pool",
)
#: Modules that moved, so states saved before the move restore: old name -> new name.
_MOVED = {
    "kvoffload.policies.auto": "kvoffload.selection.auto",
    "kvoffload.policies.shadow": "kvoffload.selection.shadow",
}
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_QUALNAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_MISSING = object()
#: The only functions a state may name (clocks a policy takes as a parameter).
_FUNCTIONS: dict[str, Any] = {
    "time.monotonic": time.monotonic,
    "time.time": time.time,
    "time.perf_counter": time.perf_counter,
}
_FUNCTION_NAMES = {id(fn): name for name, fn in _FUNCTIONS.items()}
#: A bound ``get`` (``{}.get``, a policy's ``get``): stored as its owner, bound again on restore.
_BOUND_METHODS = (types.BuiltinMethodType, types.MethodType)
#: The one class outside the policies a state may hold: request contexts a policy logged
#: (``auto``'s recent accesses). Their hints are kept; their per-request state and the
#: engine's transfer params are not (they belong to the live request, not to the policy).
_CONTEXT_CLASS = f"{ReqContext.__module__}:{ReqContext.__qualname__}"


def _slot_names(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        slots = vars(klass).get("__slots__", ())
        if isinstance(slots, str):
            slots = (slots,)
        names.extend(name for name in slots if name not in ("__dict__", "__weakref__"))
    return names


def _trusted(module: str, allowed: Collection[str]) -> bool:
    return any(module == root or module.startswith(root + ".") for root in allowed)


class _Encoder:
    def __init__(self, allowed: Collection[str]) -> None:
        self.allowed = allowed
        self.memo: dict[int, int] = {}
        self.objects: list[Any] = []
        self.todo: list[tuple[int, object]] = []
        self.keep: list[object] = []  # keeps ids stable while encoding

    def ref(self, obj: object) -> dict[str, int]:
        index = self.memo.get(id(obj))
        if index is None:
            index = len(self.objects)
            self.memo[id(obj)] = index
            self.objects.append(None)
            self.todo.append((index, obj))
            self.keep.append(obj)
        return {"r": index}

    def value(self, v: object) -> Any:
        if v is None or isinstance(v, (bool, str)):
            return v
        kind = type(v)
        if kind is int or kind is float:
            return v
        if kind is bytes:
            return {"b": v.hex()}  # type: ignore[attr-defined]
        if kind is tuple:
            return {"t": [self.value(x) for x in v]}  # type: ignore[attr-defined]
        if kind is frozenset:
            return {"fs": [self.value(x) for x in v]}  # type: ignore[attr-defined]
        if kind in (list, dict, OrderedDict, set, deque, bytearray, random.Random):
            return self.ref(v)
        function = _FUNCTION_NAMES.get(id(v))
        if function is not None:
            return {"fn": function}
        if getattr(v, "__name__", None) == "get" and kind in _BOUND_METHODS:
            return {"get": self.value(v.__self__)}  # type: ignore[attr-defined]
        module = getattr(kind, "__module__", "")
        if kind is ReqContext or (_trusted(module, self.allowed) and "<" not in kind.__qualname__):
            return self.ref(v)
        raise TypeError(
            f"cannot encode a {module}.{kind.__qualname__} in a policy state (only built-in "
            f"values and classes of {sorted(self.allowed)} modules)"
        )

    def shallow(self, obj: object) -> Any:
        kind = type(obj)
        if kind is list:
            return {"l": [self.value(x) for x in obj]}  # type: ignore[attr-defined]
        if kind is dict or kind is OrderedDict:
            pairs = [[self.value(k), self.value(x)] for k, x in obj.items()]  # type: ignore[attr-defined]
            return {"od" if kind is OrderedDict else "d": pairs}
        if kind is set:
            return {"s": [self.value(x) for x in obj]}  # type: ignore[attr-defined]
        if isinstance(obj, bytearray):
            return {"ba": obj.hex()}
        if isinstance(obj, deque):
            return {"dq": [self.value(x) for x in obj], "maxlen": obj.maxlen}
        if isinstance(obj, random.Random) and kind is random.Random:
            return {"rng": self.value(obj.getstate())}
        attrs: dict[str, Any] = {}
        for name in _slot_names(kind):
            value = getattr(obj, name, _MISSING)
            if value is not _MISSING:
                attrs[name] = self.value(value)
        for name, value in getattr(obj, "__dict__", {}).items():
            if kind is ReqContext and name in LIVE_FIELDS:
                continue
            attrs[name] = self.value(value)
        return {"o": f"{kind.__module__}:{kind.__qualname__}", "a": attrs}

    def run(self, root: object) -> dict[str, Any]:
        top = self.value(root)
        while self.todo:
            index, obj = self.todo.pop()
            self.objects[index] = self.shallow(obj)
        return {"format": FORMAT, "version": VERSION, "root": top, "objects": self.objects}


def export_policy_state(policy: CachePolicy, allowed_modules: Collection[str] = _TRUSTED) -> bytes:
    """The policy's whole state as versioned JSON bytes (see the module docstring)."""
    if not isinstance(policy, CachePolicy):
        raise TypeError(f"policy must be a CachePolicy, got {type(policy).__name__}")
    doc = _Encoder(tuple(allowed_modules)).run(policy)
    return json.dumps(doc, separators=(",", ":")).encode()


class _Decoder:
    def __init__(self, objects: list[Any], allowed: Collection[str]) -> None:
        if not isinstance(objects, list):
            raise ValueError("policy state: 'objects' must be a list")
        self.raw = objects
        self.allowed = allowed
        self.made: list[Any] = [self.create(entry) for entry in objects]

    def resolve_class(self, target: object) -> type:
        if not isinstance(target, str) or target.count(":") != 1:
            raise ValueError(f"policy state: bad class name {target!r}")
        if target == _CONTEXT_CLASS:
            return ReqContext
        module, qualname = target.split(":")
        module = _MOVED.get(module, module)
        if not _MODULE_NAME.match(module) or not _QUALNAME.match(qualname):
            raise ValueError(f"policy state: bad class name {target!r}")
        if not _trusted(module, self.allowed):
            raise ValueError(
                f"policy state: class {target} is outside the trusted modules "
                f"{sorted(self.allowed)}"
            )
        obj: Any = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
        if not isinstance(obj, type) or obj.__module__ != module:
            raise ValueError(f"policy state: {target} is not a class defined in {module}")
        return obj

    def create(self, entry: object) -> Any:
        if not isinstance(entry, dict):
            raise ValueError("policy state: every object entry must be a JSON object")
        if "l" in entry:
            return []
        if "d" in entry:
            return {}
        if "od" in entry:
            return OrderedDict()
        if "s" in entry:
            return set()
        if "dq" in entry:
            maxlen = entry.get("maxlen")
            if maxlen is not None and (type(maxlen) is not int or maxlen < 0):
                raise ValueError("policy state: a deque's maxlen must be an int >= 0")
            return deque(maxlen=maxlen)
        if "rng" in entry:
            return random.Random()
        if "ba" in entry:
            if not isinstance(entry["ba"], str):
                raise ValueError("policy state: a bytearray must be a hex string")
            return bytearray.fromhex(entry["ba"])
        if "o" in entry:
            cls = self.resolve_class(entry["o"])
            return object.__new__(cls)
        raise ValueError(f"policy state: unknown object entry with keys {sorted(entry)}")

    def value(self, v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, dict) and len(v) == 1:
            ((tag, payload),) = v.items()
            if tag == "r":
                if type(payload) is not int or not 0 <= payload < len(self.made):
                    raise ValueError(f"policy state: bad reference {payload!r}")
                return self.made[payload]
            if tag == "b" and isinstance(payload, str):
                return bytes.fromhex(payload)
            if tag == "t" and isinstance(payload, list):
                return tuple(self.value(x) for x in payload)
            if tag == "fs" and isinstance(payload, list):
                return frozenset(self.value(x) for x in payload)
            if tag == "fn" and payload in _FUNCTIONS:
                return _FUNCTIONS[payload]
            if tag == "get":
                owner = self.value(payload)
                if isinstance(owner, dict) or _trusted(type(owner).__module__, self.allowed):
                    return owner.get
        raise ValueError(f"policy state: cannot decode value {str(v)[:80]!r}")

    def fill(self) -> None:
        for entry, obj in zip(self.raw, self.made, strict=True):
            if "l" in entry:
                obj.extend(self.value(x) for x in entry["l"])
            elif "d" in entry or "od" in entry:
                for pair in entry["d"] if "d" in entry else entry["od"]:
                    if not isinstance(pair, list) or len(pair) != 2:
                        raise ValueError("policy state: a mapping entry must be a [key, value]")
                    obj[self.value(pair[0])] = self.value(pair[1])
            elif "s" in entry:
                obj.update(self.value(x) for x in entry["s"])
            elif "dq" in entry:
                obj.extend(self.value(x) for x in entry["dq"])
            elif "ba" in entry:
                continue  # filled when created
            elif "rng" in entry:
                try:
                    obj.setstate(self.value(entry["rng"]))
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"policy state: bad random state: {exc}") from None
            else:
                attrs = entry.get("a")
                if not isinstance(attrs, dict):
                    raise ValueError("policy state: an object entry needs an 'a' mapping")
                for name, value in attrs.items():
                    object.__setattr__(obj, name, self.value(value))
                if type(obj) is ReqContext:
                    fresh = ReqContext()
                    for name in LIVE_FIELDS:
                        if name in attrs:
                            raise ValueError(f"policy state: a context may not carry {name}")
                        object.__setattr__(obj, name, getattr(fresh, name))


def restore_policy_state(
    data: bytes | str, allowed_modules: Collection[str] = _TRUSTED
) -> CachePolicy:
    """A new policy object with the state :func:`export_policy_state` wrote.

    ``ValueError`` for data that is not such a state (wrong format or version, a class outside
    the trusted modules, a malformed entry); nothing is imported beyond trusted modules.
    """
    if not isinstance(data, (bytes, str)):
        raise TypeError(f"data must be bytes or str, got {type(data).__name__}")
    try:
        doc = json.loads(data)
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        raise ValueError(f"policy state is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not a policy state (format must be {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise ValueError(
            f"policy state version {doc.get('version')!r} is not supported (this is {VERSION})"
        )
    objects = doc.get("objects")
    if not isinstance(objects, list):
        raise ValueError("policy state: 'objects' must be a list")
    decoder = _Decoder(objects, tuple(allowed_modules))
    decoder.fill()
    policy = decoder.value(doc.get("root"))
    if not isinstance(policy, CachePolicy):
        raise ValueError("policy state: the root object is not a CachePolicy")
    return policy


def settle_restored(policy: CachePolicy) -> int:
    """After a restart: drop blocks that were being written, unpin blocks that were being read.

    Needs the policy's ``block_table``. Returns how many pending blocks were removed.
    """
    table = policy.block_table
    if table is None:
        raise ValueError(f"{type(policy).__name__} keeps no block_table to settle")
    removed = 0
    for key, status in list(table.items()):
        if status.ref_cnt < 0:
            policy.remove(key)
            removed += 1
        elif status.ref_cnt > 0:
            status.ref_cnt = 0
            policy.mark_evictable(key)
    return removed


__all__ = ["FORMAT", "VERSION", "export_policy_state", "restore_policy_state", "settle_restored"]
