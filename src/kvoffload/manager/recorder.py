"""Record live traffic as a trace ``kvoffload simulate`` replays: :class:`TraceRecorder`.

A manager given a recorder (``CPUOffloadingManager(..., recorder=r)``, ``set_recorder(r)``,
or the config key ``record_trace``) hands it each request's keys as it sees them (the loaded
prefix from ``prepare_load``, the offered rest from ``prepare_store``) and, when the request
finishes, its hints. The recorder writes one JSON line per request in the ``keys_hex``
format (``kvoffload.sim.traces.keys_hex``; the generic ``hash_ids`` list when a request's
keys differ in width)::

    {"keys_hex": "<key><key>...", "key_bytes": 12, "timestamp": 12.5, "input_length": 1800,
     "output_length": 120, "request_id": "r1", "session_id": "s1", "category": "chat"}

It stays off the hot path: the manager's side extends one list per request (the request's
only object here, kept in its context) and, when it finishes, appends a reference to it to a
bounded queue; a background thread does the rest in batches (one key-width check, join and
hex conversion per batch where every key has one width, each line's fields, one write per
batch). When the queue is full (the disk is slower than the traffic) the request is dropped
and counted (:attr:`dropped`), never waited for. Files rotate at ``max_bytes``:
``trace.jsonl``, then ``trace-1.jsonl``, ``trace-2.jsonl`` ...; with ``max_files`` the oldest
go.

Standard library only, so the manager layer can take it.
"""

from __future__ import annotations

import os
import threading
import time
from binascii import hexlify
from collections import deque
from collections.abc import Callable, Sequence
from itertools import chain, islice
from json.encoder import encode_basestring_ascii as _quote  # C where available; ASCII out
from operator import itemgetter
from pathlib import Path
from typing import BinaryIO

from kvoffload._checks import check_int, check_number
from kvoffload.context import ReqContext

_KEYS_HEX = b'{"keys_hex":"'
_HASH_IDS = b'{"hash_ids":["'
_Entry = tuple["_Recording", str, int | None, int | None, str | None, str | None]
_first = itemgetter(0)


class _Recording(list[bytes]):
    """One request's keys so far (the list itself: one object per request for the collector
    to track, not two) and when it was first seen; kept in its context until it finishes."""

    __slots__ = ("started",)

    started: float


class TraceRecorder:
    """Writes each finished request as a ``hash_ids`` JSON line (see the module docstring).

    Args:
        path: the first file; rotated files get ``-1``, ``-2`` ... before the suffix.
        block_tokens: tokens per block, to write ``input_length`` (a prompt length that does
            not fit the recorded blocks is left out: the replay takes every block as full).
        max_bytes: rotate when a file would grow past this.
        max_files: keep at most this many files, deleting the oldest (``None``: all).
        max_pending_keys: bound of the queue, in keys; a request that would pass it is
            dropped (:attr:`dropped`).
        clock: arrival times of requests whose context has no ``timestamp``.
        flush_interval_s: how often the writer thread wakes to write what is queued (it also
            wakes when half of ``max_pending_keys`` is queued): rare wake-ups keep its cost
            (thread switches, the lock of the serving thread's interpreter) off the hot path.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        block_tokens: int | None = None,
        max_bytes: int = 256 << 20,
        max_files: int | None = None,
        max_pending_keys: int = 1 << 20,
        clock: Callable[[], float] = time.time,
        flush_interval_s: float = 1.0,
    ) -> None:
        if block_tokens is not None:
            check_int("block_tokens", block_tokens, 1, or_none=True)
        check_int("max_bytes", max_bytes, 1)
        if max_files is not None:
            check_int("max_files", max_files, 1, or_none=True)
        check_int("max_pending_keys", max_pending_keys, 1)
        self.flush_interval_s = check_number(
            "flush_interval_s", flush_interval_s, 0.0, 3600.0, low_open=True
        )
        self._high_water = max(1, max_pending_keys // 2)
        self.path = Path(path)
        self.block_tokens = block_tokens
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.max_pending_keys = max_pending_keys
        self._clock = clock
        self._queue: deque[_Entry] = deque()
        self._pending_keys = 0  # changed by both threads: read as an estimate only
        self._taken_keys = 0
        self.recorded = 0  # requests queued
        self.dropped = 0  # requests dropped because the queue was full
        self.written = 0  # requests written
        self.files: list[Path] = []
        self._next_index = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._file = self._open()
        self._size = 0
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kvoffload-recorder", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------- the manager's side
    def add_keys(self, ctx: ReqContext, keys: Sequence[bytes]) -> None:
        """Note keys the request ``ctx`` accessed (in order; repeats are dropped at write)."""
        # The context's state dict directly, not get_state/set_state: this runs on every
        # prepare_load and prepare_store, and two calls fewer per request are most of its cost.
        states = ctx._state
        state: _Recording | None = states.get(_Recording)  # type: ignore[assignment]
        if state is None:
            state = states[_Recording] = _Recording(keys)
            state.started = self._clock() if ctx.timestamp is None else ctx.timestamp
        else:
            state += keys

    def finish(self, ctx: ReqContext) -> None:
        """Queue the finished request ``ctx`` for writing (or count it dropped)."""
        state: _Recording | None = ctx._state.pop(_Recording, None)  # type: ignore[assignment]
        if not state or self._closed:
            return
        pending = self._pending_keys - self._taken_keys + len(state)
        if pending > self.max_pending_keys:
            self.dropped += 1
            return
        self._pending_keys += len(state)
        if pending > self._high_water:
            self._wake.set()
        self._queue.append(
            (state, ctx.req_id, ctx.prompt_tokens, ctx.output_tokens, ctx.session_id, ctx.category)
        )
        self.recorded += 1

    # ----------------------------------------------------------- the writer thread
    def _name(self, index: int) -> Path:
        if index == 0:
            return self.path
        return self.path.with_name(f"{self.path.stem}-{index}{self.path.suffix}")

    def _open(self) -> BinaryIO:
        name = self._name(self._next_index)
        self._next_index += 1
        self.files.append(name)
        if self.max_files is not None and len(self.files) > self.max_files:
            oldest = self.files.pop(0)
            oldest.unlink(missing_ok=True)
        return name.open("wb")

    def _write_pending(self) -> None:
        # The batch is taken whole and its keys handled at once where they allow it (one
        # width check, one join, one hex conversion for every request); each line is then
        # built inline as pieces (its slice of the hex, a small tail) that the batch's one
        # join copies once. Per request, the writer's Python (calls, formatting steps) cost
        # more than its per-key work, so what can run once per batch does.
        queue = self._queue
        count = len(queue)
        # popleft in C, count times: the serving thread may append meanwhile.
        batch = list(islice(iter(queue.popleft, None), count))
        if batch:
            self._write_batch(batch)
        self._file.flush()

    def _write_batch(self, batch: list[_Entry]) -> None:
        out = self._file
        parts: list[bytes] = []
        append = parts.append
        written = 0
        size = self._size
        bt = self.block_tokens
        join = b"".join
        counts = list(map(len, map(_first, batch)))
        every = list(chain.from_iterable(map(_first, batch)))
        lengths = list(map(len, every))
        width = lengths[0]
        # Every key of the batch has one width (an engine's usual case): one hex string for
        # the batch, each request's line a slice of it; repeats are dropped when read (the
        # keys_hex format). Otherwise each request is looked at alone.
        same = lengths.count(width) == len(lengths)
        hexed = hexlify(join(every)) if same else b""
        del every, lengths
        step = 2 * width
        width_part = b'","key_bytes":%d' % width
        pos = 0
        # Names the loop uses, as locals: this function runs once per batch, too few times
        # for the interpreter to specialise its global look-ups.
        quote, hexlify_, divmod_, round_, len_, list_, map_ = (
            _quote,
            hexlify,
            divmod,
            round,
            len,
            list,
            map,
        )
        keys_hex, hash_ids = _KEYS_HEX, _HASH_IDS
        for (keys, req_id, prompt, output, session, category), n in zip(batch, counts, strict=True):
            if same:
                head = keys_hex
                end = pos + n * step
                body = hexed[pos:end]
                pos = end
                mid = width_part
            else:
                key_width = len_(keys[0])
                blob = join(keys)
                if len_(blob) == key_width * n and list_(map_(len_, keys)).count(key_width) == n:
                    head = keys_hex
                    body = hexlify_(blob)
                    mid = b'","key_bytes":%d' % key_width
                else:
                    unique = list_(dict.fromkeys(keys))
                    n = len_(unique)
                    head = hash_ids
                    body = b'","'.join(map_(hexlify_, unique))
                    mid = b'"]'
            # Microseconds in integer arithmetic: a float's shortest repr costs several
            # times more.
            whole, micros = divmod_(round_(keys.started * 1_000_000), 1_000_000)
            tail = b',"timestamp":%d.%06d' % (whole, micros)
            if prompt is not None and bt is not None and (n - 1) * bt < prompt <= n * bt:
                tail += b',"input_length":%d' % prompt
            if output:
                tail += b',"output_length":%d' % output
            if session is not None:
                tail += b',"session_id":%s' % quote(session).encode()
            if category is not None:
                tail += b',"category":%s' % quote(category).encode()
            tail += b',"request_id":%s}\n' % quote(req_id).encode()
            length = len_(head) + len_(body) + len_(mid) + len_(tail)
            if size and size + length > self.max_bytes:
                out.write(join(parts))
                self.written += written
                parts.clear()
                written = 0
                out.close()
                out = self._file = self._open()
                size = 0
            append(head)
            append(body)
            append(mid)
            append(tail)
            written += 1
            size += length
        self._size = size
        self._taken_keys += sum(counts)
        if parts:
            out.write(join(parts))
        self.written += written

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._write_pending()
                self._wake.wait(self.flush_interval_s)
                self._wake.clear()
            self._write_pending()
        except BaseException as exc:  # reported by close(); the manager never waits on it
            self._error = exc

    # ----------------------------------------------------------- the user's side
    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued request is written (False: not within ``timeout``)."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        while (
            self.written < self.recorded and time.monotonic() < deadline and self._thread.is_alive()
        ):
            time.sleep(0.005)
        return self.written >= self.recorded

    def close(self) -> None:
        """Write what is queued, stop the thread and close the file (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._wake.set()
        self._thread.join()
        self._file.close()
        if self._error is not None:
            raise OSError(f"trace recorder: writing {self.path} failed: {self._error}")

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> dict[str, int]:
        return {"recorded": self.recorded, "dropped": self.dropped, "written": self.written}


__all__ = ["TraceRecorder"]
