"""The Redis tier's record I/O: a job's puts, gets and deletes as commands and verdicts.

Records are encoded from and verified into host slots (``records``), sent as pipelined
``SET NX`` / ``PEXPIRE`` + ``GETRANGE`` or straight over a pooled socket (``wire``), in pieces
of at most ``max_pipeline_bytes``; each answer becomes a per-key verdict and a cached
presence.
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kvoffload.keys import OffloadKey
from kvoffload.tiers.base import Presence, SlotMemory
from kvoffload.tiers.redis.records import RecordCodec, RecordError
from kvoffload.tiers.redis.transport import RedisTransport, _reason_of

logger = logging.getLogger(__name__)

try:
    from redis.exceptions import ConnectionError as RedisConnectionError

    from kvoffload.tiers.redis import wire
except ImportError:  # pragma: no cover - only without the [redis] extra
    pass

#: A job's outcome: whether each key succeeded, the reasons of those that failed, bytes moved.
Outcome = tuple[list[bool], dict[int, str], int]


class RedisRecordIO(RedisTransport):
    """A job's records on the server (a base of ``RedisTier``)."""

    _local: threading.local
    _verdicts: collections.OrderedDict[bytes, tuple[Presence, float]]
    codec: RecordCodec
    max_pipeline_bytes: int
    memory: SlotMemory
    negative_ttl_s: float
    verdict_cache_entries: int
    verdict_ttl_s: float

    def _name(self, key: bytes) -> bytes:
        return self._key_prefix + key.hex().encode()

    def _remember(
        self, key: bytes, presence: Presence, now: float, ttl: float | None = None
    ) -> None:
        """Cache a verdict (lock held), for ``ttl`` seconds (default: by its kind)."""
        if ttl is None:
            ttl = self.verdict_ttl_s if presence is Presence.HIT else self.negative_ttl_s
        self._verdicts[key] = (presence, now + ttl)
        self._verdicts.move_to_end(key)
        while len(self._verdicts) > self.verdict_cache_entries:
            self._verdicts.popitem(last=False)

    def _exchanges(
        self,
        keys: Sequence[OffloadKey],
        slots: Sequence[int],
        direct: Callable[[list[bytes], list[OffloadKey], list[int], Any], list[Any]],
        piped: Callable[[list[bytes], list[OffloadKey], list[int]], list[Any]],
    ) -> Iterator[tuple[range, list[Any]]]:
        """The job in pieces of about ``max_pipeline_bytes``, each with its answers:
        ``direct(names, keys, slots, conn)`` on a pooled socket where records go over one
        (see :mod:`wire`), else ``piped(names, keys, slots)``."""
        step = max(1, self.max_pipeline_bytes // max(self.memory.slot_bytes, 1))
        for start in range(0, len(keys), step):
            piece = range(start, min(len(keys), start + step))
            names = [self._name(keys[i]) for i in piece]
            piece_keys = [keys[i] for i in piece]
            piece_slots = [slots[i] for i in piece]
            if self._direct is None:
                yield piece, piped(names, piece_keys, piece_slots)
            else:
                talk = functools.partial(direct, names, piece_keys, piece_slots)
                yield piece, self._direct_exchange(len(piece), talk)

    def _run_put(self, keys: Sequence[OffloadKey], slots: Sequence[int]) -> Outcome:
        ok = [False] * len(keys)
        reasons: dict[int, str] = {}
        written = 0
        for piece, answers in self._exchanges(keys, slots, self._send_records, self._set_piped):
            taken = [
                i
                for i, answer in zip(piece, answers, strict=True)
                if not answer and not isinstance(answer, BaseException)
            ]
            unreadable = self._check_taken([keys[i] for i in taken])
            now = time.monotonic()
            with self._lock:
                for i, answer in zip(piece, answers, strict=True):
                    if isinstance(answer, BaseException):
                        reasons[i] = _reason_of(answer)
                        continue
                    if answer:
                        ok[i] = True
                        written += self.memory.slot_bytes
                        self._stats["stored"] += 1
                        self._remember(keys[i], Presence.HIT, now)
                    elif keys[i] in unreadable:  # NX found a name we cannot read back
                        reasons[i] = unreadable[keys[i]]
                        ttl = self.verdict_ttl_s if reasons[i] == "name_taken" else None
                        self._remember(keys[i], Presence.MISS, now, ttl)  # EXISTS says HIT
                    else:  # NX: another writer (or an earlier put) stored it already
                        ok[i] = True
                        self._stats["records_existing"] += 1
                        self._remember(keys[i], Presence.HIT, now)
        return ok, reasons, written

    def _check_taken(self, keys: list[OffloadKey]) -> dict[OffloadKey, str]:
        """Of ``keys`` whose ``SET NX`` found the name taken, those we could not read back,
        each with its reason: ``name_taken`` (another value type, another secret's or
        namespace's record, junk, another slot size, gone since) or why the check failed.

        Why read it: ``NX`` says only that the name exists. A put is a success when what sits
        there is a record this tier would serve (the same block, from another writer); the
        check costs one bounded read, and only for puts that found their name taken.
        """
        if not keys:
            return {}
        answers = self._read_piped([self._name(key) for key in keys], keys, px=0)
        out: dict[OffloadKey, str] = {}
        for key, answer in zip(keys, answers, strict=True):
            if isinstance(answer, BaseException) and "WRONGTYPE" not in str(answer):
                out[key] = _reason_of(answer)
                continue
            try:
                if isinstance(answer, BaseException):
                    raise RecordError("name_taken", "a value of another type")
                if not answer:
                    raise RecordError("name_taken", "gone since the put found it")
                if len(answer) > self._record_bytes(key):
                    raise RecordError("name_taken", "a value longer than our record")
                payload = self.codec.payload_of(key, answer)
                if len(payload) != self.memory.slot_bytes:
                    raise RecordError("name_taken", f"a {len(payload)}-byte payload")
            except RecordError as error:
                out[key] = "name_taken"
                logger.warning("redis tier: put of %s found its name taken (%s)", key.hex(), error)
        return out

    def _send_records(
        self, names: list[bytes], keys: list[OffloadKey], slots: list[int], conn: Any
    ) -> list[Any]:
        """``SET name record NX [PX ttl]`` for each record on ``conn``; one answer per record.

        Each record's header is built (and its payload hashed) just before it is sent, so the
        next one is hashed while the kernel and the server move this one; the payload is sent
        from its slot, never copied (the slot stays unchanged until the job is polled).
        """
        px = self.ttl_ms or None
        tail = b""
        for n, (name, key, slot) in enumerate(zip(names, keys, slots, strict=True)):
            payload = self.memory.slot_view(slot)
            header = self.codec.header(key, payload)
            head = tail + wire.set_head(name, len(header) + len(payload), px is not None)
            conn.send_packed_command([head + header, payload], check_health=n == 0)
            tail = wire.set_tail(px)
        conn.send_packed_command([tail], check_health=False)
        replies = wire.Replies(conn._sock)
        answers = [replies.reply() for _ in names]
        if replies.buffered:
            raise RedisConnectionError("Protocol error: data after the last reply")
        return answers

    def _fetch_records(
        self, names: list[bytes], keys: list[OffloadKey], slots: list[int], conn: Any
    ) -> list[Any]:
        """``PEXPIRE name ttl`` (none without a TTL) and ``GETRANGE name 0 <record bytes>``
        for each name on ``conn``: one outcome per record (see :meth:`_outcome`), each verified
        and copied as soon as it has arrived. No reply is received beyond one byte over the
        record's size: a longer bulk length is a protocol error, before its bytes are read."""
        px = self.ttl_ms
        limits = [self._record_bytes(key) for key in keys]
        conn.send_packed_command(
            [
                b"".join(
                    wire.get_command(name, px, limit)
                    for name, limit in zip(names, limits, strict=True)
                )
            ]
        )
        replies = wire.Replies(conn._sock)
        # a record buffer of this thread: a tier sending records directly never encodes into one
        buffer = memoryview(self._record_buffers(1)[0])
        allowed = 0

        def buffer_for(size: int) -> memoryview:
            if size > allowed:
                raise RedisConnectionError(
                    f"Protocol error: {size} bytes for a GETRANGE of at most {allowed}"
                )
            return buffer[:size] if size <= len(buffer) else memoryview(bytearray(size))

        outcomes: list[Any] = []
        for key, slot, limit in zip(keys, slots, limits, strict=True):
            refreshed = replies.reply() if px else None
            allowed = limit + 1
            answer = replies.reply(buffer_for)
            if isinstance(refreshed, Exception):  # the command failed (its range is moot)
                answer = refreshed
            elif not (answer is None or isinstance(answer, (memoryview, Exception))):
                raise RedisConnectionError(f"Protocol error: {type(answer).__name__} for GETRANGE")
            outcomes.append(self._outcome(key, slot, answer))
        if replies.buffered:
            raise RedisConnectionError("Protocol error: data after the last reply")
        return outcomes

    def _set_piped(self, names: list[bytes], keys: list[OffloadKey], slots: list[int]) -> list[Any]:
        """``SET name record NX [PX ttl]`` for each record in a pipeline: never overwrite."""
        buffers = self._record_buffers(len(names))
        records = {
            name: self.codec.encode_into(buf, key, self.memory.slot_view(slot))
            for name, key, slot, buf in zip(names, keys, slots, buffers, strict=True)
        }
        px = self.ttl_ms or None
        return self._pipelined(
            names, lambda pipe, name: pipe.set(name, records[name], nx=True, px=px)
        )

    def _get_piped(self, names: list[bytes], keys: list[OffloadKey], slots: list[int]) -> list[Any]:
        """What :meth:`_fetch_records` does, in a pipeline: one outcome per record."""
        answers = self._read_piped(names, keys, self.ttl_ms)
        return [self._outcome(*args) for args in zip(keys, slots, answers, strict=True)]

    def _read_piped(self, names: list[bytes], keys: Sequence[OffloadKey], px: int) -> list[Any]:
        """``[PEXPIRE name px]`` and ``GETRANGE name 0 <record bytes>`` for each name in a
        pipeline: one answer per name."""
        limits = {name: self._record_bytes(key) for name, key in zip(names, keys, strict=True)}

        def fetch(pipe: Any, name: bytes) -> object:
            if px:
                pipe.pexpire(name, px)
            return pipe.getrange(name, 0, limits[name])

        return self._pipelined(names, fetch, 2 if px else 1)

    def _record_bytes(self, key: bytes) -> int:
        """The size of ``key``'s record: no value under its name is received past one byte
        more (see :func:`wire.get_command`)."""
        return self.codec.header_bytes(key) + self.memory.slot_bytes

    def _outcome(self, key: OffloadKey, slot: int, answer: Any) -> Any:
        """What a ``GETRANGE`` answer means: ``True`` (verified, copied into ``slot``), ``None``
        (missing: the empty string of an absent name), the :class:`RecordError` that says why
        it must not be served (the slot is untouched), or the exception object of a failed
        command."""
        if answer is None or isinstance(answer, BaseException):
            return answer
        if not isinstance(answer, (bytes, bytearray, memoryview)):
            return RecordError("corrupt", f"a {type(answer).__name__} reply to GETRANGE")
        if not answer:
            return None
        try:
            if len(answer) > self._record_bytes(key):  # a range cut at one byte over
                self.codec.check_header(key, memoryview(answer))
                raise RecordError(  # ours but for another slot size: some other reader's
                    "oversized", f"a value longer than the {self._record_bytes(key)}-byte record"
                )
            payload = self.codec.payload_of(key, memoryview(answer))
            view = self.memory.slot_view(slot)
            if len(payload) != len(view):
                raise RecordError(
                    "foreign", f"{len(payload)} payload bytes for a {len(view)}-byte slot"
                )
            view[:] = payload
        except RecordError as exc:
            return exc
        return True

    def _record_buffers(self, count: int) -> list[bytearray]:
        """This thread's reusable buffers, each one record of the longest key (no 2 MiB
        allocation and free per record)."""
        buffers: list[bytearray] | None = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = []
        size = self._record_bytes(bytes(64))
        while len(buffers) < count:
            buffers.append(bytearray(size))
        return buffers[:count]

    def _run_get(self, keys: Sequence[OffloadKey], slots: Sequence[int]) -> Outcome:
        ok = [False] * len(keys)
        reasons: dict[int, str] = {}
        read = 0
        bad: list[bytes] = []
        for piece, outcomes in self._exchanges(keys, slots, self._fetch_records, self._get_piped):
            now = time.monotonic()
            dropped: list[tuple[OffloadKey, RecordError]] = []
            with self._lock:  # one acquisition a piece, not one a record
                for i, outcome in zip(piece, outcomes, strict=True):
                    if outcome is True:
                        ok[i] = True
                        read += self.memory.slot_bytes
                        self._stats["hits"] += 1
                        self._remember(keys[i], Presence.HIT, now)
                    elif isinstance(outcome, RecordError):
                        reasons[i] = outcome.reason
                        dropped.append((keys[i], outcome))
                        self._stats[f"rejected_{outcome.reason}"] += 1
                        if outcome.garbage:
                            bad.append(keys[i])
                            self._remember(keys[i], Presence.MISS, now)
                        else:  # another secret's or slot size's: left alone, and trusted to
                            # stay unreadable for as long as a hit is (EXISTS would say HIT
                            # and the next get would move the same record again)
                            self._remember(keys[i], Presence.MISS, now, self.verdict_ttl_s)
                    elif outcome is None:  # expired or evicted since the lookup: a miss, no retry
                        reasons[i] = "missing"
                        self._stats["misses"] += 1
                        self._remember(keys[i], Presence.MISS, now)
                    else:  # an exception object: the command failed
                        reasons[i] = _reason_of(outcome)
            for key, error in dropped:
                logger.warning("redis tier: dropped record %s (%s)", key.hex(), error)
        if bad:
            answers = self._pipelined([self._name(k) for k in bad], lambda p, n: p.delete(n))
            with self._lock:
                self._stats["records_deleted_bad"] += sum(a == 1 for a in answers)
        return ok, reasons, read

    def _run_delete(self, keys: Sequence[OffloadKey]) -> Outcome:
        ok = [False] * len(keys)
        reasons: dict[int, str] = {}
        answers = self._pipelined([self._name(k) for k in keys], lambda p, n: p.delete(n))
        now = time.monotonic()
        with self._lock:
            for i, answer in enumerate(answers):
                if isinstance(answer, BaseException):
                    reasons[i] = _reason_of(answer)
                    continue
                ok[i] = bool(answer)
                if answer:
                    self._stats["deletes"] += 1
                else:
                    reasons[i] = "missing"
                self._remember(keys[i], Presence.MISS, now)
        return ok, reasons, 0


__all__ = ["Outcome", "RedisRecordIO"]
