"""SAE, session-aware eviction, after vLLM's open proposal (PR #50422).

A conversation's blocks are only useful as a prefix chain, so SAE groups blocks into
*sessions*, scores each session and evicts the weakest sessions whole, tail first, so that
shared prefixes outlive their suffixes. As in the proposal:

* each session keeps its blocks in insertion order and ``hits``, ``last_touch`` and
  ``prefix_depth``; its score is ``last_touch + hits * touch_weight + depth_bonus / (1 +
  prefix_depth / depth_half_life)``, lower is worse. Time is logical: one tick per ``touch``;
* ``touch`` adds to every touched key's ghost score ``1 / log2(position + 2)`` times
  ``ghost_hit_weight`` (stored and ready) or ``ghost_miss_weight``; every session owning a
  touched block gets ``hits += 1`` and ``last_touch = now``. Ghost scores outlive eviction;
* a request continuing a cached session (its deepest stored key touched, "last hit wins")
  appends to it; otherwise its first insert opens a session with ``prefix_depth`` = the
  request's cached prefix length, and each of its inserts adds the key's ghost score
  ``/ ghost_norm`` to the new session's ``hits``;
* every ``decay_interval`` touches, session hits and ghost scores are multiplied by
  ``decay_factor``, and ghosts below ``ghost_prune_threshold`` are forgotten;
* eviction takes sessions worst first, and from each its idle, unprotected blocks from the tail.

Deviations (to fit this library's contract and cost rules):

1. **No admission gate inside evict.** ``evict`` returns ``n`` victims whenever ``n`` are
   evictable. The proposal's gate (a new session must score at least the worst resident
   session) is :class:`SAEAdmissionGate`, an optional store admission filter, off by default.
2. **No ``record_lookup`` / ``open_session`` / ``close_session``.** Lookups are pure here, so
   the "continue this session" pointer comes from the keys the request touches (hits are
   touched on load and on store). A request opens or joins its session at its first insert
   and keeps it for all its later stores (the proposal opens a new session per store call
   unless a lookup hit one). ``ReqContext.session_id``, when given, names the session.
   Without a ``ReqContext``, sessions are implicit, as in the proposal's first revision:
   the first insert after a touch opens one, the next touch closes it.
3. **Per-request state lives in the ReqContext** (no ``pending_merge_pointers`` map);
   ``on_request_finished`` drops it. Key positions count the request's touched keys (the
   manager touches a request's keys over several calls), capped by the proposal's 1024-entry
   weight table.
4. **Ranking without sorting.** Sessions sit in a min-heap of ``(score, session id)`` instead
   of being sorted per eviction. Between decays a score can only grow, so an entry is a lower
   bound and is refreshed only when it reaches the top (a touch costs no heap work); ties go
   to the older session. A decay re-ranks everything, so it rebuilds the heap (O(sessions)
   once per ``decay_interval`` touches).
5. **Ghost decay by one scale factor** instead of rewriting every score; a ghost below the
   prune threshold reads as 0 and is dropped when next seen, and the table of ghosts of
   blocks no longer stored keeps at most ``ghost_capacity`` (default: the cache capacity)
   entries, least recently updated dropped first: decay alone does not bound it.
6. A failed store (``remove``) leaves no ghost; a session with no blocks left is dropped.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import islice

from kvoffload._checks import check_int, check_number
from kvoffload.context import ReqContext
from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy
from kvoffload.policies.victims import protected_disjoint

_INSTANCE_IDS = itertools.count()
_POSITION_WEIGHTS = tuple(1.0 / math.log2(position + 2) for position in range(1024))
_RESCALE_BELOW = 1e-150  # renormalise ghost scores before the scale factor underflows


class _Session:
    """A group of blocks evicted together, tail first."""

    __slots__ = (
        "alive",
        "busy",
        "evictable",
        "hits",
        "in_heap",
        "keys",
        "last_touch",
        "name",
        "prefix_depth",
        "sid",
    )

    def __init__(self, sid: int, name: str | None, last_touch: int, prefix_depth: int) -> None:
        self.sid = sid
        self.name = name
        # Its blocks in insertion order (the tail is last), each with its scaled ghost score.
        self.keys: dict[OffloadKey, float] = {}
        self.busy: set[OffloadKey] = set()  # its blocks that are not evictable (ref_cnt != 0)
        self.hits = 0.0
        self.last_touch = last_touch
        self.prefix_depth = prefix_depth
        self.evictable = 0  # blocks with ref_cnt 0: len(keys) - len(busy)
        self.in_heap = False  # the session has its (one) heap entry
        self.alive = True


class _Request:
    """One request's view: its session, the session it continues, what it touched."""

    __slots__ = ("epoch", "fresh", "pointer", "position", "resident", "session")

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.session: _Session | None = None  # the session its inserts go to
        self.fresh = False  # that session was opened by this request
        self.pointer: _Session | None = None  # session of the deepest stored key it touched
        self.resident = 0  # stored keys it touched
        self.position = 0  # keys it touched (the next key's position)


class _Requests(dict[int, _Request]):
    """Per-request state kept in the ``ReqContext``, one per policy instance."""


class SAECachePolicy(CachePolicy):
    """Session-aware eviction (vLLM PR #50422): evicts the weakest sessions, tail first."""

    name = "sae"

    def __init__(
        self,
        cache_capacity: int,
        *,
        decay_interval: int = 500,
        decay_factor: float = 0.9,
        ghost_hit_weight: float = 12.0,
        ghost_miss_weight: float = 1.0,
        ghost_norm: float = 12.0,
        touch_weight: float = 1500.0,
        depth_bonus: float = 30000.0,
        depth_half_life: float = 8.0,
        ghost_prune_threshold: float = 0.01,
        ghost_capacity: int | None = None,
    ) -> None:
        super().__init__(cache_capacity)
        self.decay_interval = check_int("decay_interval", decay_interval, 1)
        self.decay_factor = check_number("decay_factor", decay_factor, 0, 1, low_open=True)
        self.ghost_hit_weight = check_number("ghost_hit_weight", ghost_hit_weight, 0)
        self.ghost_miss_weight = check_number("ghost_miss_weight", ghost_miss_weight, 0)
        self.ghost_norm = check_number("ghost_norm", ghost_norm, 0, low_open=True)
        self.touch_weight = check_number("touch_weight", touch_weight, 0)
        self.depth_bonus = check_number("depth_bonus", depth_bonus, 0)
        self.depth_half_life = check_number("depth_half_life", depth_half_life, 0, low_open=True)
        self.ghost_prune_threshold = check_number("ghost_prune_threshold", ghost_prune_threshold, 0)
        self.ghost_capacity = (
            cache_capacity
            if ghost_capacity is None
            else check_int("ghost_capacity", ghost_capacity, 0, or_none=True)
        )

        self._id = next(_INSTANCE_IDS)
        self._epoch = 0  # bumped by clear: older per-request state is ignored
        self._next_sid = 0  # never reset, so a stale session id cannot alias a new session
        # Stored blocks, one dict per field: status, owning session (the scaled ghost score, and
        # whether a block is evictable, are kept in its session: ``keys``, ``busy``).
        self._session_of: dict[OffloadKey, _Session] = {}
        self._sessions: dict[int, _Session] = {}
        self._named: dict[str, _Session] = {}
        self._heap: list[tuple[float, int]] = []  # (score lower bound, sid)
        self._ghosts: OrderedDict[OffloadKey, float] = OrderedDict()  # not stored, scaled
        self._scale = 1.0  # a ghost's score is its stored value times this
        self._time = 0
        self._touches_since_decay = 0
        self._num_evictable = 0
        self._anonymous = _Request(self._epoch)

    # ------------------------------------------------------------------ sessions and scores
    def session_score(self, session: _Session) -> float:
        """The proposal's score: recency + reuse + a bonus for sessions with a short prefix."""
        return (
            session.last_touch
            + session.hits * self.touch_weight
            + self.depth_bonus / (1.0 + session.prefix_depth / self.depth_half_life)
        )

    def _queue(self, session: _Session) -> None:
        """Give a session with evictable blocks its heap entry (scores may only grow after)."""
        if session.in_heap or session.evictable == 0:
            return
        session.in_heap = True
        heapq.heappush(self._heap, (self.session_score(session), session.sid))
        if len(self._heap) > 2 * len(self._sessions) + 16:  # entries of dropped sessions
            self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        self._heap = []
        for session in self._sessions.values():
            session.in_heap = False
            self._queue(session)

    def _pop_worst(self) -> _Session | None:
        """Take the worst session with evictable blocks off the heap (``None`` if none).

        Entries are lower bounds of their scores: one that is behind is refreshed and pushed
        back, so the session returned has the least (score, id). The caller queues it again.
        """
        heap = self._heap
        while heap:
            score, sid = heapq.heappop(heap)
            session = self._sessions.get(sid)
            if session is None:  # dropped; ids are never reused
                continue
            if session.evictable == 0:
                session.in_heap = False
                continue
            current = self.session_score(session)
            if current != score:
                heapq.heappush(heap, (current, sid))
                continue
            session.in_heap = False
            return session
        return None

    def _drop_session(self, session: _Session) -> None:
        session.alive = False
        del self._sessions[session.sid]
        if session.name is not None:
            del self._named[session.name]

    def _request(self, req_context: ReqContext | None) -> _Request:
        if req_context is None:
            if self._anonymous.epoch != self._epoch:
                self._anonymous = _Request(self._epoch)
            return self._anonymous
        states = req_context.get_state(_Requests)
        if states is None:
            states = _Requests()
            req_context.set_state(states)
        state = states.get(self._id)
        if state is None or state.epoch != self._epoch:
            state = states[self._id] = _Request(self._epoch)
        return state

    def _prefix_depth(self, state: _Request, req_context: ReqContext | None) -> int:
        hinted = req_context.prefix_hit_blocks if req_context is not None else 0
        return max(hinted, state.resident)

    def _continued_session(
        self, state: _Request, req_context: ReqContext | None
    ) -> _Session | None:
        """The live session this request continues, if any (named first, then its pointer)."""
        name = req_context.session_id if req_context is not None else None
        if name is not None:
            return self._named.get(name)
        pointer = state.pointer
        return pointer if pointer is not None and pointer.alive else None

    def _session_for_insert(self, state: _Request, req_context: ReqContext | None) -> _Session:
        """Open or join the session of a request's first insert (or once its session died)."""
        session = self._continued_session(state, req_context)
        if session is not None:
            session.last_touch = self._time
            state.fresh = False
        else:
            name = req_context.session_id if req_context is not None else None
            session = _Session(
                self._next_sid, name, self._time, self._prefix_depth(state, req_context)
            )
            self._next_sid += 1
            self._sessions[session.sid] = session
            if name is not None:
                self._named[name] = session
            state.fresh = True
        state.session = session
        return session

    # ------------------------------------------------------------------ ghosts
    def _ghost_value(self, stored: float) -> float:
        """A scaled ghost's true score, 0 once it fell below the prune threshold."""
        value = stored * self._scale
        return value if value >= self.ghost_prune_threshold else 0.0

    def _remember_ghost(self, key: OffloadKey, stored: float) -> None:
        """Record a ghost for a key not in the table (it lands at the most recent end)."""
        ghosts = self._ghosts
        ghosts[key] = stored
        if len(ghosts) > self.ghost_capacity:
            ghosts.popitem(last=False)

    def ghost_score(self, key: OffloadKey) -> float:
        """``key``'s current ghost score (stored or not), 0 if it has none."""
        session = self._session_of.get(key)
        stored = session.keys[key] if session is not None else self._ghosts.get(key, 0.0)
        return self._ghost_value(stored)

    def _decay(self) -> None:
        self._touches_since_decay = 0
        self._scale *= self.decay_factor
        if self._scale < _RESCALE_BELOW:
            scale = self._scale
            for session in self._sessions.values():
                ghost_of = session.keys
                for key in ghost_of:
                    ghost_of[key] *= scale
            for key in self._ghosts:
                self._ghosts[key] *= scale
            self._scale = 1.0
        for session in self._sessions.values():
            session.hits *= self.decay_factor
        self._rebuild_heap()

    # ------------------------------------------------------------------ the contract
    def on_insert(
        self, key: OffloadKey, block: BlockStatus, req_context: ReqContext | None
    ) -> None:
        state = self._request(req_context)
        session = state.session
        if session is None or not session.alive:
            session = self._session_for_insert(state, req_context)
        stored_ghost = self._ghosts.pop(key, 0.0)
        ghost = self._ghost_value(stored_ghost)
        self._session_of[key] = session
        session.keys[key] = stored_ghost if ghost else 0.0
        if state.fresh and ghost:
            session.hits += ghost / self.ghost_norm  # a growing score needs no heap work
        if block.ref_cnt:
            session.busy.add(key)
        else:  # evictable at once
            session.evictable += 1
            self._num_evictable += 1
            self._queue(session)

    def on_insert_many(
        self,
        keys: Sequence[OffloadKey],
        blocks: Sequence[BlockStatus],
        req_context: ReqContext | None,
    ) -> None:
        # on_insert for each key, with the request's state and session looked up once;
        # ghost_of: the session's ghosts.
        session_of, ghosts = self._session_of, self._ghosts
        scale, threshold, norm = self._scale, self.ghost_prune_threshold, self.ghost_norm
        state = self._request(req_context)
        session: _Session | None = None
        for key, block in zip(keys, blocks, strict=True):
            if session is None:
                session = state.session
                if session is None or not session.alive:
                    session = self._session_for_insert(state, req_context)
                ghost_of, busy, fresh = session.keys, session.busy, state.fresh
            session_of[key] = session
            stored_ghost = ghosts.pop(key, 0.0)
            ghost = stored_ghost * scale  # _ghost_value, inlined: 0 below the threshold
            if ghost >= threshold and ghost:
                ghost_of[key] = stored_ghost
                if fresh:
                    session.hits += ghost / norm  # a growing score needs no heap work
            else:
                ghost_of[key] = 0.0
            if block.ref_cnt:
                busy.add(key)
            else:  # evictable at once
                session.evictable += 1
                self._num_evictable += 1
                self._queue(session)

    def on_remove(self, key: OffloadKey, block: BlockStatus) -> None:
        session = self._session_of.pop(key)
        del session.keys[key]
        if key in session.busy:
            session.busy.remove(key)
        else:
            session.evictable -= 1
            self._num_evictable -= 1
        if not session.keys:
            self._drop_session(session)

    def touch(self, keys: Iterable[OffloadKey], req_context: ReqContext | None = None) -> None:
        if req_context is None:  # implicit sessions: a touch closes the open one
            self._anonymous = _Request(self._epoch)
        state = self._request(req_context)
        self._time += 1
        now = self._time
        session_of, statuses = self._session_of, self._blocks
        ghosts, scale = self._ghosts, self._scale
        hit_weight, miss_weight = self.ghost_hit_weight, self.ghost_miss_weight
        threshold, capacity = self.ghost_prune_threshold, self.ghost_capacity
        weights, last = _POSITION_WEIGHTS, len(_POSITION_WEIGHTS) - 1
        touched: dict[int, _Session] = {}
        position = state.position
        size = len(ghosts)
        for key in keys:
            weight = weights[position if position < last else last]
            position += 1
            if key not in session_of:
                # _remember_ghost, inlined (one at a time: a later key may be a dropped one)
                if key in ghosts:
                    stored = ghosts.pop(key)
                    value = stored * scale  # _ghost_value, inlined: 0 below the threshold
                    if not (value >= threshold and value):
                        stored = 0.0
                    ghosts[key] = stored + weight * miss_weight / scale
                else:
                    ghosts[key] = weight * miss_weight / scale  # (0.0 + it is it)
                    size += 1
                if size > capacity:
                    ghosts.popitem(False)
                    size -= 1
                continue
            session = session_of[key]
            ready = statuses[key].ref_cnt >= 0
            session.keys[key] += weight * (hit_weight if ready else miss_weight) / scale
            touched[session.sid] = session
            state.pointer = session
            state.resident += 1
        state.position = position
        for session in touched.values():
            session.hits += 1.0
            session.last_touch = now
        self._touches_since_decay += 1
        if self._touches_since_decay >= self.decay_interval:
            self._decay()

    def evict_keys(self, n: int, protected: Collection[OffloadKey]) -> list[OffloadKey] | None:
        if n > self._num_evictable:
            return None
        popped: list[_Session] = []
        taken: list[tuple[_Session, list[OffloadKey]]] = []  # each session's victims, in order
        need = n
        while need:
            session = self._pop_worst()
            if session is None:
                break
            popped.append(session)
            blocks = session.keys
            left = session.evictable
            if left == len(blocks):  # all idle: its tail, unless a key is protected
                tail = list(islice(reversed(blocks), need))
                if not protected or protected_disjoint(protected, tail):
                    taken.append((session, tail))
                    need -= len(tail)
                    continue
            mine: list[OffloadKey] = []
            busy = session.busy
            for key in reversed(blocks):
                if key in busy:
                    continue
                left -= 1
                if key not in protected:
                    mine.append(key)
                    if len(mine) == need:
                        break
                if left == 0:
                    break
            if mine:
                taken.append((session, mine))
                need -= len(mine)
        if need:
            for session in popped:
                self._queue(session)
            return None
        victims = self._evict_chosen(taken)
        self._num_evictable -= n
        for session in popped:
            if session.alive:
                self._queue(session)
        return victims

    def _evict_chosen(self, taken: list[tuple[_Session, list[OffloadKey]]]) -> list[OffloadKey]:
        """Drop the chosen (evictable) blocks, remembering their ghosts; the victims' keys.

        ``taken`` holds each session with its chosen blocks, in order: a session's counters
        change once for all of them (and a session left without blocks is dropped).
        """
        session_of, ghosts = self._session_of, self._ghosts
        remember = self.ghost_capacity > 0
        victims: list[OffloadKey] = []
        for session, keys in taken:
            pop_ghost = session.keys.pop
            for key in keys:
                del session_of[key]
                ghost = pop_ghost(key)
                if ghost and remember:
                    ghosts[key] = ghost  # _remember_ghost; a victim is never a ghost already
            victims += keys
            session.evictable -= len(keys)
            if not session.keys:
                self._drop_session(session)
        for _ in range(len(ghosts) - self.ghost_capacity):  # the table's bound, once at the end
            ghosts.popitem(False)
        return victims

    def on_clear(self) -> None:
        self._epoch += 1
        self._session_of.clear()
        self._sessions.clear()
        self._named.clear()
        self._heap.clear()
        self._ghosts.clear()
        self._scale = 1.0
        self._time = 0
        self._touches_since_decay = 0
        self._num_evictable = 0
        self._anonymous = _Request(self._epoch)

    def mark_evictable(self, key: OffloadKey) -> None:
        session = self._session_of.get(key)
        if session is None or key not in session.busy:
            return
        session.busy.remove(key)
        session.evictable += 1
        self._num_evictable += 1
        self._queue(session)

    def mark_evictable_many(self, keys: Sequence[OffloadKey]) -> None:
        session_of = self._session_of
        if not keys:
            return
        # Usually all keys are busy blocks of one session (a store's, or a load's prefix): one
        # set operation flips them all (the heap entry comes as at the first flip).
        session = session_of.get(keys[0])
        if session is not None and session.busy.issuperset(keys):
            busy = session.busy
            before = len(busy)
            busy.difference_update(keys)
            count = before - len(busy)  # a repeated key counts once
            session.evictable += count
            self._num_evictable += count
            self._queue(session)
            return
        count = 0
        for key in keys:
            session = session_of.get(key)
            if session is None or key not in session.busy:
                continue
            session.busy.remove(key)
            session.evictable += 1
            count += 1
            if not session.in_heap:
                self._queue(session)
        self._num_evictable += count

    def mark_non_evictable(self, key: OffloadKey) -> None:
        session = self._session_of.get(key)
        if session is None or key in session.busy:
            return
        session.busy.add(key)
        session.evictable -= 1
        self._num_evictable -= 1

    def on_request_finished(self, req_context: ReqContext) -> None:
        states = req_context.get_state(_Requests)
        if states is not None:
            states.pop(self._id, None)

    # ------------------------------------------------------------------ the admission gate
    def admits_new_session(self, num_new_blocks: int, req_context: ReqContext | None) -> bool:
        """The proposal's gate: would a store of ``num_new_blocks`` be worth its evictions?

        Yes when no eviction is needed, when the request continues a live session, or when a
        new session's score (``now + depth bonus``) is at least the worst resident session's.
        """
        if len(self._blocks) + num_new_blocks <= self.cache_capacity:
            return True
        state = self._request(req_context)
        if state.session is not None and state.session.alive:
            return True
        if self._continued_session(state, req_context) is not None:
            return True
        worst = self._pop_worst()
        if worst is None:
            return True
        self._queue(worst)
        depth = self._prefix_depth(state, req_context)
        candidate = self._time + self.depth_bonus / (1.0 + depth / self.depth_half_life)
        return candidate >= self.session_score(worst)

    def session_info(self, key: OffloadKey) -> dict[str, float] | None:
        """The session holding ``key``: its id, score and score terms, or ``None``."""
        session = self._session_of.get(key)
        if session is None:
            return None
        return {
            "session": session.sid,
            "score": self.session_score(session),
            "hits": session.hits,
            "last_touch": session.last_touch,
            "prefix_depth": session.prefix_depth,
            "blocks": len(session.keys),
        }

    def stats(self) -> Mapping[str, float]:
        return {
            "blocks": len(self._blocks),
            "evictable": self._num_evictable,
            "sessions": len(self._sessions),
            "ghosts": len(self._ghosts),
            "logical_time": self._time,
        }


class SAEAdmissionGate:
    """Optional store admission from the SAE proposal: new sessions must beat the worst one.

    Pass it to the manager with the policy instance it asks, e.g.
    ``policy = SAECachePolicy(n); CPUOffloadingManager(n, cache_policy=policy,
    admission=SAEAdmissionGate(policy))``. A store is admitted or rejected whole, as in the
    proposal; rejections are counted by the manager as admission rejects, never as "no room".
    """

    def __init__(self, policy: SAECachePolicy) -> None:
        if not isinstance(policy, SAECachePolicy):
            raise ValueError(
                f"SAEAdmissionGate needs the SAECachePolicy it guards, got {type(policy).__name__}"
            )
        self.policy = policy
        self.rejected_stores = 0

    def admit(self, keys: Sequence[OffloadKey], ctx: ReqContext | None) -> list[OffloadKey]:
        if not keys or self.policy.admits_new_session(len(keys), ctx):
            return list(keys)
        self.rejected_stores += 1
        return []

    def reset(self) -> None:
        self.rejected_stores = 0


__all__ = ["SAEAdmissionGate", "SAECachePolicy"]
