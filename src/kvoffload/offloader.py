"""KVOffloader: a small synchronous facade for engines that are not vLLM.

It owns a spec, its manager and its transfer worker, and speaks in the engine's terms: the
prefix hashes of a sequence's device blocks and the device block ids holding them.

    offloader = KVOffloader(kv_caches, cpu_bytes=8 << 30, policy="arc")
    hit = offloader.lookup(hashes)                        # leading device blocks offloaded
    offloader.load(hashes[:hit], block_ids[:hit])         # copy them back into the device
    offloader.store(hashes, block_ids)                    # offload the sequence's blocks

With ``blocks_per_chunk = k`` a chunk is ``k`` device blocks and is keyed, as in vLLM, by the
hash of its last block (prefix hashes are chained, so that names the whole prefix); lengths
are in device blocks and a trailing partial chunk is never stored. Each call is one request
for the policy unless the caller brackets several with :meth:`begin_request` /
:meth:`end_request`. Not thread-safe: call it from one thread.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from kvoffload._checks import check_int, check_number
from kvoffload._sizes import parse_size
from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey, hash_token_blocks, make_offload_key, namespace_fingerprint
from kvoffload.layout import KVCacheLayout
from kvoffload.manager import LookupResult, OffloadingManager, OffloadingStats
from kvoffload.spec import OffloadingConfig, OffloadingSpec, OffloadingSpecFactory
from kvoffload.tiers.costs import CPU_TIER, LoadDecider, prefill_cost
from kvoffload.tiers.protocol import TieredManager
from kvoffload.transfer.worker import LOAD, STORE, TransferResult, TransferWorker, as_int_list

logger = logging.getLogger(__name__)

#: How long ``lookup`` waits before asking again a tier that answered "not known yet".
RETRY_BACKOFF_S = 0.001


class TransferError(RuntimeError):
    """A copy failed (a load, a waited-for store, or background stores failing in a row);
    the manager was left consistent (pins released, the failed chunks dropped)."""


@dataclass(frozen=True)
class OffloaderStats:
    """Data-plane counters since construction, next to the manager's own statistics."""

    lookup_blocks: int  # device blocks asked about by lookup
    hit_blocks: int  # of those, leading blocks found offloaded
    loaded_blocks: int
    loaded_bytes: int
    load_seconds: float
    stored_blocks: int
    stored_bytes: int
    store_seconds: float
    failed_loads: int
    failed_stores: int
    stores_without_room: int  # store calls the manager could not fit (nothing stored)
    manager: OffloadingStats | None

    @property
    def hit_ratio(self) -> float:
        """Hit blocks / looked-up blocks."""
        return self.hit_blocks / self.lookup_blocks if self.lookup_blocks else 0.0

    @property
    def load_gbps(self) -> float:
        """Loaded bytes / copy seconds, in GB/s (1e9 bytes)."""
        return self.loaded_bytes / self.load_seconds / 1e9 if self.load_seconds else 0.0

    @property
    def store_gbps(self) -> float:
        """Stored bytes / copy seconds, in GB/s (1e9 bytes)."""
        return self.stored_bytes / self.store_seconds / 1e9 if self.store_seconds else 0.0


class KVOffloader:
    """Offload KV blocks of ``kv_caches`` to a CPU tier of ``cpu_bytes`` bytes.

    Args:
        kv_caches: the engine's KV tensors (a sequence, or a mapping name -> tensor).
        cpu_bytes: host memory for the tier, bytes or a size (``"8GiB"``); slots =
            ``cpu_bytes // slot bytes``.
        policy: eviction policy name (``"lru"``, ``"arc"``, ... or ``"module:Class"``).
        layout: the tensors' layout; default ``KVCacheLayout.from_tensors(kv_caches, kind,
            groups)``.
        kind / groups: passed to ``from_tensors`` when ``layout`` is not given.
        max_failed_stores: background stores (``wait=False``) failing one after another
            before the next call raises :class:`TransferError`: a worker that fails every
            job (a broken device, tensors it cannot write) is an error, not a log line.
        namespace: a model's identity (a ``model_id``, or a digest of its config and
            weights). It is mixed into every key, so the blocks of two models (two fine-tunes
            of one shape) never meet on any tier, the disk and a shared Redis included.
        tier_wait_s: with secondary tiers, how long ``lookup`` waits for a prefix's blocks to
            be promoted into the CPU tier (or for a remote tier's answer) before it counts
            what is readable by then. With the load-or-recompute decision on, the wait is also
            bounded by the plan's deadline plus :attr:`decision_margin` (see docs/tiers.md).
        prefill_tokens_per_s / decide: the tiering manager's load-or-recompute decision
            (:class:`~kvoffload.tiers.costs.LoadDecider`): the engine's prefill speed if known
            (else it is measured through :meth:`observe_prefill`), and ``True``/``False`` to
            force the decision on or off (``None``: on once the prefill speed is known).
        **config: any other :class:`~kvoffload.spec.OffloadingConfig` key
            (``blocks_per_chunk``, ``cache_policy_params``, ``store_threshold``, ``tiers``, ...).

    With ``tiers`` configured the manager is a ``TieringManager``: ``lookup`` walks the tiers
    through its ``lookup_prefix`` (blocks found on disk or in a shared store are promoted into
    CPU slots and then count as hits), and every call advances it (``step``), so tier reads
    and writes complete while the engine runs.
    """

    def __init__(
        self,
        kv_caches: Sequence[torch.Tensor] | Mapping[str, torch.Tensor],
        cpu_bytes: int | str,
        policy: str = "lru",
        *,
        layout: KVCacheLayout | None = None,
        kind: str | Sequence[str] = "kv_first",
        groups: Sequence[int] | None = None,
        tier_wait_s: float = 2.0,
        max_failed_stores: int = 3,
        namespace: str | bytes | None = None,
        prefill_tokens_per_s: float | None = None,
        decide: bool | None = None,
        **config: Any,
    ) -> None:
        if namespace is not None and not isinstance(namespace, (str, bytes)):
            raise TypeError(
                f"namespace must be a str or bytes (a model id) or None, got "
                f"{type(namespace).__name__}"
            )
        if namespace is not None and not namespace:
            raise ValueError("namespace must be a non-empty str or bytes (a model id) or None")
        #: Mixed into every key (so into every tier's records): two models never share one.
        self._namespace: bytes | None = (
            None if namespace is None else namespace_fingerprint(namespace=namespace)
        )
        check_int("max_failed_stores", max_failed_stores, 1)
        if decide is not None and not isinstance(decide, bool):
            raise TypeError(f"decide must be a bool or None, got {type(decide).__name__}")
        self.max_failed_stores = max_failed_stores
        self._failed_in_a_row = 0  # background stores failed since the last success
        self._last_store_error: str | None = None
        if tier_wait_s != math.inf:  # inf: wait for the tiers as long as they take
            check_number("tier_wait_s", tier_wait_s, 0, why=" (seconds) or inf")
        self.tier_wait_s = float(tier_wait_s)
        if isinstance(cpu_bytes, float) and math.isfinite(cpu_bytes) and cpu_bytes >= 1:
            cpu_bytes = int(cpu_bytes)  # floored, as the config's cpu_bytes_to_use is
        cpu_bytes = parse_size("cpu_bytes", cpu_bytes, 1)
        if layout is None:
            layout = KVCacheLayout.from_tensors(kv_caches, kind, groups)
        try:
            cfg = OffloadingConfig.from_extra_config(
                config, cpu_bytes_to_use=cpu_bytes, eviction_policy=policy
            )
            spec = OffloadingSpecFactory.create_spec(cfg, layout)
            self.spec: OffloadingSpec = spec
            self.manager: OffloadingManager = spec.get_manager()
            self.worker: TransferWorker = spec.get_worker(kv_caches)
        except ValueError as exc:
            # The config's key for the budget is cpu_bytes_to_use; the caller typed cpu_bytes.
            text = str(exc)
            if "cpu_bytes_to_use" not in text or "cpu_bytes_to_use" in config:
                raise
            raise ValueError(text.replace("config 'cpu_bytes_to_use'", "cpu_bytes")) from None
        self.blocks_per_chunk = spec.blocks_per_chunk
        #: The manager's tiered side, when it has secondary tiers (checked once, here).
        self._tiered: TieredManager | None = (
            self.manager if isinstance(self.manager, TieredManager) else None
        )
        self._costs: LoadDecider | None = None
        if self._tiered is not None:  # its blocks are this spec's chunks
            self._costs = self._tiered.costs
            self._costs.block_tokens = spec.tokens_per_chunk(0)
            self._costs.decide = decide
            if prefill_tokens_per_s is not None:
                self._costs.prefill = prefill_cost(prefill_tokens_per_s)
                self._costs.prefill_given = True
        self._job_ids = itertools.count(1)
        self._stores: dict[int, tuple[list[OffloadKey], ReqContext]] = {}
        self._loads: dict[int, TransferResult] = {}
        self._counts = dict.fromkeys(
            (
                "lookup_blocks",
                "hit_blocks",
                "loaded_blocks",
                "loaded_bytes",
                "stored_blocks",
                "stored_bytes",
                "failed_loads",
                "failed_stores",
                "stores_without_room",
            ),
            0,
        )
        self._seconds = {LOAD: 0.0, STORE: 0.0}
        self._closed = False

    # ------------------------------------------------------------------ requests
    def begin_request(self, req_id: str = "") -> ReqContext:
        """Start a request spanning several calls (each access then counts once per key)."""
        ctx = ReqContext(req_id=req_id)
        self.manager.on_new_request(ctx)
        return ctx

    def end_request(self, ctx: ReqContext) -> None:
        """The request makes no more calls (its pending stores may still complete)."""
        self.manager.on_request_finished(ctx)

    @contextmanager
    def _request(self, ctx: ReqContext | None) -> Iterator[ReqContext]:
        if ctx is not None:
            yield ctx
            return
        ctx = self.begin_request()
        try:
            yield ctx
        finally:
            self.end_request(ctx)

    # ------------------------------------------------------------------ the API
    def lookup(
        self,
        block_hashes: Sequence[bytes],
        group: int = 0,
        ctx: ReqContext | None = None,
        num_tokens: int | None = None,
    ) -> int:
        """How many leading device blocks are offloaded and readable now (whole chunks).

        With ``num_tokens`` (the prompt's length) the hit is capped so that at least the
        prompt's last token is left to compute: an engine needs its logits, so a prompt of
        exactly ``k`` blocks can hit at most the whole chunks of its first ``k*T - 1`` tokens.
        """
        self._check_open()
        self._reap()
        self._raise_if_failing()
        if num_tokens is not None:
            block_hashes = block_hashes[: self.max_hit_blocks(num_tokens, group)]
        keys = self._chunk_keys(block_hashes, group)
        if self._tiered is not None:
            if num_tokens is not None and ctx is not None:
                ctx.prompt_tokens = num_tokens  # what the plan weighs the reads against
            if num_tokens is not None and ctx is None:
                with self._request(None) as req:
                    req.prompt_tokens = num_tokens
                    hits = self._lookup_tiered(keys, req)
            else:
                hits = self._lookup_tiered(keys, ctx)
        else:
            hits = 0
            for key in keys:
                if self.manager.lookup(key, ctx) is not LookupResult.HIT:
                    break
                hits += 1
        self._counts["lookup_blocks"] += len(block_hashes)
        self._counts["hit_blocks"] += hits * self.blocks_per_chunk
        return hits * self.blocks_per_chunk

    def max_hit_blocks(self, num_tokens: int, group: int = 0) -> int:
        """The most device blocks a prompt of ``num_tokens`` tokens may load: whole chunks of
        its first ``num_tokens - 1`` tokens (the last token is always computed)."""
        check_int("num_tokens", num_tokens, 1, why=" (the prompt's length in tokens)")
        tokens = self.spec.tokens_per_chunk(self._check_group(group))
        return (num_tokens - 1) // tokens * self.blocks_per_chunk

    def hash_tokens(self, token_ids: Sequence[int], group: int = 0) -> list[bytes]:
        """Chained hashes of every full device block of ``token_ids`` (for lookup/load/store)."""
        return hash_token_blocks(token_ids, self.spec.layout.block_size(self._check_group(group)))

    def decision_margin(self, deadline_s: float) -> float:
        """How long past a plan's deadline ``lookup`` still waits for its reads: 2 ms plus
        10% (the reap and poll granularity and the estimate's noise)."""
        return 0.002 + 0.1 * deadline_s

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        """The engine's measured prefill of ``tokens`` tokens in ``seconds``: it feeds the
        load-or-recompute decision (a no-op without secondary tiers)."""
        if self._costs is not None:
            self._costs.observe_prefill(tokens, seconds)

    def _lookup_tiered(self, keys: list[OffloadKey], ctx: ReqContext | None) -> int:
        """Leading hits through a tiering manager: promote, wait (bounded), count.

        The wait ends at ``tier_wait_s`` or, when the manager planned the request, at the
        plan's deadline plus :meth:`decision_margin`: past it recomputing would have been
        sooner, so no request waits on a tier longer than recomputing takes (plus the margin).
        It blocks in the manager's :meth:`~kvoffload.tiers.protocol.TieredManager.wait` for
        the request's own reads first, then (a block another request promotes) for all tier
        work; a tier that answered "not known yet" (``RETRY``) is asked again
        :data:`RETRY_BACKOFF_S` later (the manager bounds how often).
        """
        tiered = self._tiered
        assert tiered is not None
        start = time.monotonic()
        deadline = start + self.tier_wait_s
        planned = bounded = settled = False
        scope = ctx  # whose reads to wait for: this request's first, then everyone's
        while True:
            results = tiered.lookup_prefix(keys, ctx)
            if not planned and ctx is not None:
                planned = True
                plan = tiered.request_plan(ctx)
                if plan is not None:
                    bounded = True
                    bound = plan.deadline_s + self.decision_margin(plan.deadline_s)
                    deadline = min(deadline, start + bound)
            hits = 0
            while hits < len(results) and results[hits] is LookupResult.HIT:
                hits += 1
            waiting = hits < len(results) and results[hits] in (
                LookupResult.HIT_PENDING,
                LookupResult.RETRY,
            )
            left = deadline - time.monotonic()
            if not waiting or settled or left <= 0:
                if waiting and bounded and ctx is not None:
                    tiered.note_overdue(ctx)  # the tier learns it was too slow
                return hits
            if results[hits] is LookupResult.RETRY:  # a remote tier's answer is on its way
                time.sleep(min(left, RETRY_BACKOFF_S))
                self._reap()
                continue
            if self._stores:  # HIT_PENDING: perhaps one of our own background stores
                self.worker.wait(list(self._stores))
                self._reap()
                continue
            # HIT_PENDING: a promotion is landing. Nothing left in flight at all (and still
            # pending) means no tier work will complete it: stop waiting.
            settled = tiered.wait(left, scope) and scope is None
            scope = None

    def load(
        self,
        block_hashes: Sequence[bytes],
        device_block_ids: Sequence[int],
        group: int = 0,
        ctx: ReqContext | None = None,
    ) -> int:
        """Copy offloaded blocks into ``device_block_ids``; return the blocks loaded.

        Every chunk must be a lookup hit. Raises :class:`TransferError` if the copy fails
        (the blocks stay offloaded and unpinned).
        """
        self._check_open()
        device_block_ids = self._check_pairs(block_hashes, device_block_ids)
        if len(block_hashes) % self.blocks_per_chunk:
            raise ValueError(
                f"load: {len(block_hashes)} blocks is not a whole number of chunks of "
                f"{self.blocks_per_chunk} blocks; load the length lookup returned"
            )
        keys = self._chunk_keys(block_hashes, group)
        if not keys:
            return 0
        with self._request(ctx) as req:
            spec = self.manager.prepare_load(keys, req)
            job_id = next(self._job_ids)
            try:
                self.worker.submit_load(
                    job_id, spec.block_ids, device_block_ids, self._groups(group, len(keys))
                )
                self.worker.wait([job_id])
                self._reap()
                result = self._loads.pop(job_id)
            finally:
                self.manager.complete_load(keys, req)
        if not result.success:
            self._counts["failed_loads"] += 1
            raise TransferError(f"load job {job_id} failed: {result.error}")
        self._counts["loaded_blocks"] += len(device_block_ids)
        self._counts["loaded_bytes"] += result.bytes
        if self._costs is not None:  # the CPU tier's measured cost (and what it served)
            self._costs.record_read(CPU_TIER, len(keys), result.bytes, result.seconds)
        self._seconds[LOAD] += result.seconds
        return len(device_block_ids)

    def store(
        self,
        block_hashes: Sequence[bytes],
        device_block_ids: Sequence[int],
        group: int = 0,
        ctx: ReqContext | None = None,
        wait: bool = True,
        first_block: int = 0,
    ) -> int:
        """Offload the blocks not offloaded yet; return how many device blocks are written.

        ``block_hashes[i]`` is block ``first_block + i`` of its sequence; chunks are cut from
        the sequence's start, so ``first_block`` must be a multiple of ``blocks_per_chunk``
        (passing the whole sequence is simplest: blocks offloaded already are skipped).

        A trailing partial chunk is skipped. 0 means nothing new was written: every chunk
        was offloaded already, or the tier could not make room (counted in
        ``stats().stores_without_room``). A failed copy raises :class:`TransferError` (the
        manager drops its chunks; ``stats().failed_stores`` counts it). With ``wait=False``
        the copy runs in the background and completes on a later call (or :meth:`flush`);
        until then its chunks are not lookup hits, and a failure is counted and logged, and
        after ``max_failed_stores`` failures in a row the next call raises.
        """
        self._check_open()
        device_block_ids = self._check_pairs(block_hashes, device_block_ids)
        check_int("first_block", first_block, 0)
        if first_block % self.blocks_per_chunk:
            raise ValueError(
                f"first_block {first_block} is not on a chunk boundary: a chunk is "
                f"{self.blocks_per_chunk} device blocks counted from the sequence's start, so "
                f"store from a multiple of {self.blocks_per_chunk} (or pass the whole sequence)"
            )
        self._reap()
        self._raise_if_failing()
        keys = self._chunk_keys(block_hashes, group)
        if not keys:
            return 0
        bpc = self.blocks_per_chunk
        with self._request(ctx) as req:
            out = self.manager.prepare_store(keys, req)
            if out is None and self._stores and self._holds_slots():
                # Slots of background stores from before a reset come back only when those
                # writes complete: wait for them, then try once more.
                self.flush()
                out = self.manager.prepare_store(keys, req)
            if out is None:
                self._counts["stores_without_room"] += 1
                return 0
            if not out.keys_to_store:
                return 0
            chunk_of = {key: i for i, key in reversed(list(enumerate(keys)))}
            blocks: list[int] = []
            for key in out.keys_to_store:
                i = chunk_of[key]
                blocks.extend(device_block_ids[i * bpc : (i + 1) * bpc])
            job_id = next(self._job_ids)
            try:
                self.worker.submit_store(
                    job_id,
                    blocks,
                    out.store_spec.block_ids,
                    self._groups(group, len(out.keys_to_store)),
                )
            except Exception:
                self.manager.complete_store(out.keys_to_store, req, success=False)
                raise
            self._stores[job_id] = (list(out.keys_to_store), req)
        if wait:
            self.worker.wait([job_id])
            finished = self._reap()
            result = finished[job_id]
            if not result.success:
                self._failed_in_a_row = 0  # raised here: not counted again as a background one
                raise TransferError(f"store job {job_id} failed: {result.error}")
        return len(blocks)

    def flush(self, tier_timeout_s: float = 30.0) -> None:
        """Wait for every background store and complete it; with tiers, also wait (up to
        ``tier_timeout_s``) until the tiers' reads and writes are done."""
        self.worker.wait(list(self._stores))
        self._reap()
        self._raise_if_failing()
        if self._tiered is not None:
            self._tiered.wait(tier_timeout_s)
            self._reap()

    def reset(self) -> None:
        """Drop every offloaded block. Background stores still finish: the manager keeps
        their slots out of use until their (stale) completion, which changes nothing else."""
        self._check_open()
        self.manager.reset_cache()

    def stats(self) -> OffloaderStats:
        """Counters of this facade plus the manager's statistics."""
        self._reap()
        c = self._counts
        return OffloaderStats(
            lookup_blocks=c["lookup_blocks"],
            hit_blocks=c["hit_blocks"],
            loaded_blocks=c["loaded_blocks"],
            loaded_bytes=c["loaded_bytes"],
            load_seconds=self._seconds[LOAD],
            stored_blocks=c["stored_blocks"],
            stored_bytes=c["stored_bytes"],
            store_seconds=self._seconds[STORE],
            failed_loads=c["failed_loads"],
            failed_stores=c["failed_stores"],
            stores_without_room=c["stores_without_room"],
            manager=self.manager.get_stats(),
        )

    def close(self) -> None:
        """Finish background stores, stop the worker and release the host memory."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self.worker.shutdown()
            self.manager.shutdown()  # drains the tiers, which read and write the host buffer
            self.worker.host.close()

    def __enter__(self) -> KVOffloader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals
    def _reap(self) -> dict[int, TransferResult]:
        """Complete the stores that finished; keep load results for their caller; advance a
        tiering manager (its tier jobs are submitted and reaped in ``step``)."""
        results = self.worker.get_finished()
        for result in results:
            if result.kind == LOAD:
                self._loads[result.job_id] = result
                continue
            keys, req = self._stores.pop(result.job_id)
            self.manager.complete_store(keys, req, success=result.success)
            if result.success:
                self._counts["stored_blocks"] += len(keys) * self.blocks_per_chunk
                self._counts["stored_bytes"] += result.bytes
                self._seconds[STORE] += result.seconds
                self._failed_in_a_row = 0
            else:
                self._counts["failed_stores"] += 1
                self._failed_in_a_row += 1
                self._last_store_error = f"store job {result.job_id} failed: {result.error}"
                logger.warning("%s", self._last_store_error)
        if self._tiered is not None:
            self._tiered.step()
        return {r.job_id: r for r in results}

    def _holds_slots(self) -> bool:
        stats = self.manager.get_stats()
        return stats is not None and stats.held_blocks > 0

    def _chunk_keys(self, block_hashes: Sequence[bytes], group: int) -> list[OffloadKey]:
        bpc = self.blocks_per_chunk
        if isinstance(block_hashes, (bytes, str)):
            raise TypeError("block_hashes must be a sequence of per-block hashes, not one value")
        num_groups = self.spec.layout.num_groups
        if isinstance(group, bool) or not isinstance(group, int) or not 0 <= group < num_groups:
            check_int("group", group, 0, num_groups - 1)  # raises; the valid path calls nothing
        last = range(bpc - 1, len(block_hashes), bpc)
        ns = self._namespace
        if ns is None:
            return [make_offload_key(block_hashes[i], group) for i in last]
        sha = hashlib.sha256
        return [make_offload_key(sha(ns + bytes(block_hashes[i])).digest(), group) for i in last]

    def _check_group(self, group: int) -> int:
        num_groups = self.spec.layout.num_groups
        return check_int("group", group, 0, num_groups - 1)

    def _groups(self, group: int, n: int) -> list[int] | None:
        return [group] * n if self.spec.layout.num_groups > 1 else None

    @staticmethod
    def _check_pairs(block_hashes: Sequence[bytes], device_block_ids: Sequence[int]) -> list[int]:
        blocks = as_int_list(device_block_ids, "device_block_ids")
        if len(block_hashes) != len(blocks):
            raise ValueError(
                f"block_hashes ({len(block_hashes)}) and device_block_ids ({len(blocks)}) "
                "must have the same length"
            )
        return blocks

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the KVOffloader is closed")

    def _raise_if_failing(self) -> None:
        """Raise once ``max_failed_stores`` background stores failed in a row."""
        if self._failed_in_a_row >= self.max_failed_stores:
            n, self._failed_in_a_row = self._failed_in_a_row, 0
            raise TransferError(
                f"the last {n} stores all failed, the last with: {self._last_store_error}"
            )


__all__ = ["KVOffloader", "OffloaderStats", "TransferError"]
