"""The ``Tier`` contract: an asynchronous store of KV blocks behind the CPU tier.

Why this shape (``reference/tiering.md`` §7.1, and the peers' holes it avoids):

* The CPU tier is the gateway. A secondary tier never touches device memory: it copies whole
  host slots (:class:`SlotMemory`) to its medium and back, so one record is one slot.
* Nothing blocks the scheduler. ``contains`` answers from memory (an index, or a bounded
  verdict cache); work is *submitted* as batched jobs and *polled*; ``drain`` has a deadline.
* Every job comes back from ``poll`` exactly once, with a per-key verdict: a failed key is a
  miss for the caller, never a retry loop (vLLM #49176), and a job's ``generation`` is echoed
  so completions from before a ``reset`` are recognised and ignored.
* A persistent or shared tier checks every record on read; torn, corrupt or foreign bytes are
  a failed key, never data (LMCache #1175, SGLang #27619).

The contract is standard-library only, so engines and the simulator can use it without torch.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol, runtime_checkable

from kvoffload._checks import check_int, check_number
from kvoffload.keys import OffloadKey


def check_seconds(name: str, value: object, *, positive: bool = False) -> float:
    """A duration in seconds (or another unit the name says): ``>= 0`` (``> 0`` if
    ``positive``), ``inf`` included (no bound); a :func:`~kvoffload._checks.check_number`
    otherwise, so NaN is a ``ValueError`` and a non-number a ``TypeError``."""
    if value == math.inf:
        return math.inf
    return check_number(name, value, 0, low_open=positive, why=" or inf")


class Presence(enum.Enum):
    """A tier's answer for one key in :meth:`Tier.contains`."""

    HIT = "hit"  # stored and readable now
    MISS = "miss"  # not stored (or not readable)
    UNKNOWN = "unknown"  # a remote check is in flight; asking again later resolves it
    # (a tier turns UNKNOWN into MISS once its lookup deadline passes, so callers never loop)


class JobKind(str, enum.Enum):
    PUT = "put"
    GET = "get"
    DELETE = "delete"


@dataclass(frozen=True)
class TierCapabilities:
    """What a tier declares about itself, so a manager can plan without special cases.

    Args:
        max_batch: most keys one job may carry (0: no limit).
        max_value_bytes: largest record the tier accepts (0: no limit); a tiering manager
            refuses a tier whose host slots are larger (every put would fail).
        supports_delete: ``submit_delete`` removes records (otherwise it reports failure;
            the conformance suite then leaves its delete check out).
    """

    max_batch: int = 0
    max_value_bytes: int = 0
    supports_delete: bool = True


@runtime_checkable
class SlotMemory(Protocol):
    """Host slots a tier reads from (puts) and writes into (gets): fixed-size byte regions.

    The CPU tier's ``HostBuffer`` provides one; :class:`BytearraySlotMemory` is a pure-Python
    one for tests and simulations. ``slot_view`` must return a writable, C-contiguous
    ``memoryview`` of exactly ``slot_bytes`` bytes, valid while the memory is alive.
    """

    @property
    def slot_bytes(self) -> int: ...

    @property
    def num_slots(self) -> int: ...

    def slot_view(self, slot: int) -> memoryview: ...


class MemoryviewSlotMemory:
    """Slots of ``slot_bytes`` bytes laid end to end in one flat byte ``memoryview``.

    The one slicing rule every ``SlotMemory`` over a plain buffer shares (a bytearray here, an
    engine's shared-memory region in the vLLM adapter).
    """

    def __init__(self, view: memoryview, slot_bytes: int) -> None:
        check_int("slot_bytes", slot_bytes, 1)
        self._view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        self._slot_bytes = slot_bytes
        self._num_slots = len(self._view) // slot_bytes

    @property
    def slot_bytes(self) -> int:
        return self._slot_bytes

    @property
    def num_slots(self) -> int:
        return self._num_slots

    def slot_view(self, slot: int) -> memoryview:
        if not 0 <= slot < self._num_slots:
            raise ValueError(f"slot must be in [0, {self._num_slots}), got {slot}")
        start = slot * self._slot_bytes
        return self._view[start : start + self._slot_bytes]

    def release(self) -> None:
        """Drop this object's export of the buffer (its owner may then free or unmap it)."""
        self._view.release()


class BytearraySlotMemory(MemoryviewSlotMemory):
    """``num_slots`` slots of ``slot_bytes`` bytes in one ``bytearray`` (no torch needed)."""

    def __init__(self, slot_bytes: int, num_slots: int) -> None:
        check_int("slot_bytes", slot_bytes, 1)
        check_int("num_slots", num_slots, 1)
        self.buffer = bytearray(slot_bytes * num_slots)
        super().__init__(memoryview(self.buffer), slot_bytes)


@dataclass(frozen=True)
class TierResult:
    """How one job ended, reported once by :meth:`Tier.poll`.

    ``ok[i]`` is the verdict for ``keys[i]``: for a put, the record is durable to the tier's
    declared level and readable; for a get, the slot holds the verified bytes; for a delete,
    the record is gone. ``reasons`` maps the index of each failed key to a short reason
    (``"missing"``, ``"corrupt"``, ``"io_error"``, ``"no_space"``, ``"too_large"``,
    ``"cancelled"``, ``"exists"``, ...). ``evicted`` lists records the tier dropped to make room
    for this put. ``nbytes`` / ``seconds`` are the payload bytes moved and the job's wall time.
    """

    job_id: int
    kind: JobKind
    keys: tuple[OffloadKey, ...]
    ok: tuple[bool, ...]
    generation: int
    nbytes: int = 0
    seconds: float = 0.0
    reasons: Mapping[int, str] = field(default_factory=dict)
    evicted: tuple[OffloadKey, ...] = ()

    @property
    def all_ok(self) -> bool:
        return all(self.ok)


@dataclass(frozen=True)
class TierHealth:
    """``ok`` is False when the tier cannot currently serve (``reason`` says why)."""

    ok: bool
    reason: str = ""


@dataclass(frozen=True)
class ScannedBlock:
    """One record found by :meth:`Tier.scan` (a restart's index rebuild)."""

    key: OffloadKey
    nbytes: int
    mtime: float


def _counter(doc: str) -> Any:
    return field(default=0.0, metadata={"doc": doc})


@dataclass(frozen=True)
class TierStats:
    """One vocabulary for every tier's figures; what only one medium knows goes in ``extra``.

    Counters count keys (not jobs) unless the name says bytes or seconds; gauges are read now.
    ``hits`` are keys a ``get`` read and verified (so a hit rate is ``hits / gets`` on every
    tier); ``lookups`` / ``lookup_hits`` count ``contains`` answers.
    """

    lookups: float = _counter("Keys asked about in contains.")
    lookup_hits: float = _counter("Keys contains answered HIT.")
    puts: float = _counter("Keys submitted to be stored.")
    stored: float = _counter("Records written.")
    gets: float = _counter("Keys submitted to be read.")
    hits: float = _counter("Keys read and verified.")
    deletes: float = _counter("Records deleted on request.")
    evictions: float = _counter("Records dropped to make room.")
    failed_keys: float = _counter("Keys of jobs that failed, for any reason.")
    bad_records: float = _counter(
        "Records found corrupt, torn or foreign and dropped (never served)."
    )
    bytes_written: float = _counter("Payload bytes stored.")
    bytes_read: float = _counter("Payload bytes read.")
    write_seconds: float = _counter("Seconds spent writing.")
    read_seconds: float = _counter("Seconds spent reading.")
    used_bytes: float = _counter("Bytes the tier holds now (gauge).")
    capacity_bytes: float = _counter("The tier's byte budget (gauge; 0: not bounded here).")
    records: float = _counter("Records the tier holds now (gauge; 0 when it cannot tell).")
    jobs_in_flight: float = _counter("Jobs submitted and not yet reported (gauge).")
    extra: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_mapping(cls, stats: Mapping[str, float]) -> TierStats:
        """Read a flat ``stats()`` mapping: the common names as fields, the rest as extra."""
        common = {k: float(v) for k, v in stats.items() if k in _STAT_NAMES}
        extra = {k: float(v) for k, v in stats.items() if k not in _STAT_NAMES}
        return cls(**common, extra=extra)

    def as_dict(self) -> dict[str, float]:
        """The flat mapping ``Tier.stats()`` returns: the common fields, then ``extra``."""
        out = {f.name: float(getattr(self, f.name)) for f in fields(self) if f.name != "extra"}
        for name, value in self.extra.items():
            out.setdefault(name, float(value))
        return out

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The common fields' names."""
        return tuple(f.name for f in fields(cls) if f.name != "extra")

    @classmethod
    def documentation(cls, name: str) -> str:
        """A common field's one-line description."""
        for f in fields(cls):
            if f.name == name:
                return str(f.metadata.get("doc", ""))
        raise ValueError(f"name must be one of {', '.join(cls.names())}, got {name!r}")


#: The :class:`TierStats` fields that are gauges (read now); the others are counters.
STAT_GAUGES = frozenset({"used_bytes", "capacity_bytes", "records", "jobs_in_flight"})
_STAT_NAMES = frozenset(TierStats.names())


class Tier(ABC):
    """An asynchronous, batched, byte-bounded store of host slots.

    A tier owns its index, its byte budget and its eviction policy (any policy of the
    registry); it never evicts a record that a job in flight reads or writes. All methods but
    :meth:`drain` and :meth:`close` return without waiting on I/O.
    """

    #: Registry name (``"disk"``, ``"redis"``, ...), also the ``tier`` label in metrics.
    name: str = "tier"

    def __init__(self, memory: SlotMemory) -> None:
        if not isinstance(memory, SlotMemory):
            raise TypeError(
                "memory must provide slot_bytes, num_slots and slot_view(slot) "
                f"(a SlotMemory), got {type(memory).__name__}"
            )
        self.memory = memory

    @property
    @abstractmethod
    def capabilities(self) -> TierCapabilities:
        """What this tier declares (see :class:`TierCapabilities`)."""

    @abstractmethod
    def contains(self, keys: Sequence[OffloadKey]) -> list[Presence]:
        """Each key's presence, from memory only (never waits on the medium)."""

    @abstractmethod
    def submit_put(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        """Write the bytes of host ``slots`` as the records of ``keys``; returns the job id.

        The slots must stay unchanged until the job is polled. A key already stored is a
        success without a write (records are immutable: a key names its content).
        """

    @abstractmethod
    def submit_get(
        self, keys: Sequence[OffloadKey], slots: Sequence[int], generation: int = 0
    ) -> int:
        """Read the records of ``keys`` into host ``slots``, verified; returns the job id."""

    @abstractmethod
    def submit_delete(self, keys: Sequence[OffloadKey], generation: int = 0) -> int:
        """Remove the records of ``keys``; returns the job id."""

    @abstractmethod
    def poll(self) -> list[TierResult]:
        """Every job that finished since the last call, each exactly once."""

    @abstractmethod
    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every submitted job; True when none is left."""

    def health(self) -> TierHealth:
        """Whether the tier can serve now (a manager's circuit breaker also watches results)."""
        return TierHealth(ok=True)

    def stats(self) -> dict[str, float]:
        """Counters and gauges, flat: :meth:`tier_stats` as a mapping."""
        if type(self).tier_stats is Tier.tier_stats:
            return {}
        return self.tier_stats().as_dict()

    def tier_stats(self) -> TierStats:
        """Counters and gauges in the one schema every tier shares (what only this tier
        knows in ``extra``). A tier that overrides only :meth:`stats` is read through
        :meth:`TierStats.from_mapping`."""
        if type(self).stats is Tier.stats:
            return TierStats()
        return TierStats.from_mapping(self.stats())

    def scan(self) -> Iterator[ScannedBlock]:
        """The records present on the medium (empty for a tier that keeps nothing)."""
        return iter(())

    def close(self) -> None:  # noqa: B027
        """Release files, connections and threads; jobs still in flight are cancelled."""
