"""Conformance suite for any :class:`~kvoffload.policies.base.CachePolicy` (ours or yours).

One line in your own pytest file runs it::

    from kvoffload.testing import check_policy_conformance
    def test_my_policy_conforms():
        check_policy_conformance(MyPolicy, my_param=3)

or subclass :class:`PolicyConformanceSuite` to get one pytest test per rule.

The suite drives the policy with random operation histories that follow the manager's
protocol (see :mod:`kvoffload.policies.base`), keeping its own model of which blocks are
stored, pending, pinned and protected, and raises :class:`ConformanceError` naming the rule,
the capacity, the seed and the step when the policy:

* evicts a protected, pinned (``ref_cnt > 0``) or pending (``ref_cnt == -1``) block, or a
  block it does not store, or returns fewer / more than ``n`` victims;
* refuses an eviction it could satisfy (unless ``allow_refusal=True``);
* changes any state in a failed ``evict`` (checked by replaying the same history into a twin
  instance, without the failed call, and comparing every later eviction choice);
* changes any state in ``get`` (same twin technique) or returns a wrong status from it;
* decides differently after ``insert_many`` / ``mark_evictable_many`` than after the same
  single calls (twin technique);
* accepts an ``insert`` of a stored key (or one key twice in an ``insert_many``) instead of
  raising ``ValueError``, or changes anything before raising (twin technique);
* decides differently when a hit is followed at once by a load's pin and unpin than when it
  is only touched: a pin is not an access (twin technique);
* keeps traces after ``remove`` / ``clear`` (a removed key returned later, state not back to a
  fresh instance's size, a cleared instance deciding differently from a fresh one);
* grows ghost or history state without bound as new keys stream through.
"""

from __future__ import annotations

import random
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvoffload.keys import OffloadKey
from kvoffload.policies.base import BlockStatus, CachePolicy

PolicyMaker = Callable[[int], CachePolicy]

DEFAULT_CAPACITIES = (1, 3, 8, 32)
DEFAULT_SEEDS = (0, 1, 2, 3)


class ConformanceError(AssertionError):
    """A policy broke a rule of the CachePolicy contract."""


def _key(i: int) -> OffloadKey:
    return OffloadKey(b"conf" + i.to_bytes(8, "big") + b"\x00\x00\x00\x00")


@dataclass
class _Instance:
    """One policy instance plus the suite's model of its blocks."""

    policy: CachePolicy
    status: dict[OffloadKey, BlockStatus] = field(default_factory=dict)


class _Driver:
    """Generates a random protocol-following history and applies it to 1 or 2 instances.

    The history is generated from the model (shared by construction: every instance receives
    the same operations), so a twin that diverged from the primary is detected as soon as
    they choose different victims.
    """

    def __init__(
        self, make: PolicyMaker, capacity: int, seed: int, name: str, allow_refusal: bool
    ) -> None:
        self.make = make
        self.capacity = capacity
        self.seed = seed
        self.name = name
        self.allow_refusal = allow_refusal
        self.rng = random.Random(seed)
        self.instances: list[_Instance] = [_Instance(make(capacity))]
        self.free_slots = list(range(capacity))
        self.next_id = 0
        self.evicted: list[OffloadKey] = []  # recently evicted keys: re-inserting them hits ghosts
        self.step = 0
        #: the rule blamed when a twin diverges (set by the check that adds the twin)
        self.divergence_rule = "evict/get change nothing on failure"
        #: give the primary insert_many / mark_evictable_many where the twin gets single calls
        self.batch_primary = False

    # ----------------------------------------------------------------- helpers
    @property
    def primary(self) -> _Instance:
        return self.instances[0]

    def fail(self, rule: str, detail: str) -> ConformanceError:
        return ConformanceError(
            f"{self.name} breaks the rule '{rule}' (capacity={self.capacity}, seed={self.seed}, "
            f"step={self.step}): {detail}"
        )

    def add_twin(self) -> None:
        """Start a twin that receives the same history from now on (primary must be fresh)."""
        self.instances.append(_Instance(self.make(self.capacity)))

    def model(self) -> dict[OffloadKey, BlockStatus]:
        return self.primary.status

    def keys_with(self, predicate: Callable[[BlockStatus], bool]) -> list[OffloadKey]:
        return [k for k, s in self.model().items() if predicate(s)]

    def new_keys(self, count: int) -> list[OffloadKey]:
        keys: list[OffloadKey] = []
        while len(keys) < count:
            if self.evicted and self.rng.random() < 0.4:
                key = self.evicted.pop(self.rng.randrange(len(self.evicted)))
                if key in self.model() or key in keys:
                    continue
            else:
                key = _key(self.next_id)
                self.next_id += 1
            keys.append(key)
        return keys

    # -------------------------------------------------------------- operations
    def touch(self, keys: list[OffloadKey]) -> None:
        for inst in self.instances:
            inst.policy.touch(list(keys))

    def evict(self, n: int, protected: set[OffloadKey]) -> list[OffloadKey] | None:
        """Evict on every instance, check each result, require the instances to agree."""
        results = []
        for inst in self.instances:
            victims = inst.policy.evict(n, set(protected))
            results.append(self.check_victims(inst, n, protected, victims))
        for other in results[1:]:
            if other != results[0]:
                raise self.fail(
                    self.divergence_rule,
                    f"a twin that skipped the extra calls chose {other}, the instance that made "
                    f"them chose {results[0]}: an earlier call changed the policy's state",
                )
        chosen = results[0]
        if chosen is not None:
            for key in chosen:
                for inst in self.instances:
                    status = inst.status.pop(key)
                    self.free_slot(inst, status)
                self.evicted.append(key)
            if len(self.evicted) > 4 * self.capacity + 8:
                del self.evicted[0]
        return chosen

    def free_slot(self, inst: _Instance, status: BlockStatus) -> None:
        if inst is self.primary:
            self.free_slots.append(status.block_id)

    def check_victims(
        self,
        inst: _Instance,
        n: int,
        protected: set[OffloadKey],
        victims: list[tuple[OffloadKey, BlockStatus]] | None,
    ) -> list[OffloadKey] | None:
        eligible = [k for k, s in inst.status.items() if s.ref_cnt == 0 and k not in protected]
        if victims is None:
            if len(eligible) >= n and not self.allow_refusal:
                raise self.fail(
                    "evict succeeds when it can",
                    f"evict({n}) returned None although {len(eligible)} blocks were evictable",
                )
            return None
        if not isinstance(victims, list):
            raise self.fail("evict returns a list or None", f"got {type(victims).__name__}")
        if len(victims) != n:
            raise self.fail("evict returns exactly n", f"evict({n}) returned {len(victims)}")
        keys = [k for k, _ in victims]
        if len(set(keys)) != len(keys):
            raise self.fail("evict returns distinct victims", f"duplicates in {keys}")
        for key, status in victims:
            model_status = inst.status.get(key)
            if model_status is None:
                raise self.fail(
                    "evict only stored blocks", f"victim {key!r} is not stored (removed or evicted)"
                )
            if status is not model_status:
                raise self.fail("evict returns the stored status", f"wrong status for {key!r}")
            if key in protected:
                raise self.fail("never evict protected", f"victim {key!r} was protected")
            if model_status.ref_cnt == -1:
                raise self.fail("never evict pending", f"victim {key!r} is being written")
            if model_status.ref_cnt > 0:
                raise self.fail("never evict pinned", f"victim {key!r} has ref_cnt > 0")
            if inst.policy.get(key) is not None:
                raise self.fail("evicted blocks are gone", f"get({key!r}) after its eviction")
        return keys

    def store(self, count: int) -> None:
        keys = self.new_keys(count)
        self.touch(keys)
        protected = set(keys)
        resident = list(self.model())
        if resident:
            protected.update(self.rng.sample(resident, self.rng.randint(0, min(2, len(resident)))))
        need = len(self.model()) + len(keys) - self.capacity
        if need > 0 and self.evict(need, protected) is None:
            return
        slots = [self.free_slots.pop() for _ in keys]
        for inst in self.instances:
            statuses = [BlockStatus(slot, -1) for slot in slots]
            inst.status.update(zip(keys, statuses, strict=True))
            if self.batch_primary and inst is self.primary:
                inst.policy.insert_many(keys, statuses)
            else:
                for key, status in zip(keys, statuses, strict=True):
                    inst.policy.insert(key, status)

    def complete(self, success: bool) -> None:
        pending = self.keys_with(lambda s: s.ref_cnt == -1)
        if not pending:
            return
        if success and self.batch_primary:
            batch = self.rng.sample(pending, self.rng.randint(1, min(3, len(pending))))
            if len(batch) > 1 and self.rng.random() < 0.25:
                batch.append(batch[0])  # a key given twice: its later mark counts, as singly
            for inst in self.instances:
                for key in batch:
                    inst.status[key].ref_cnt = 0
                if inst is self.primary:
                    inst.policy.mark_evictable_many(batch)
                else:
                    for key in batch:
                        inst.policy.mark_evictable(key)
            return
        key = self.rng.choice(pending)
        for inst in self.instances:
            if success:
                inst.status[key].ref_cnt = 0
                inst.policy.mark_evictable(key)
            else:
                status = inst.status.pop(key)
                inst.policy.remove(key)
                self.free_slot(inst, status)
                if inst.policy.get(key) is not None:
                    raise self.fail("remove leaves no trace", f"get({key!r}) after remove")

    def pin(self) -> None:
        ready = self.keys_with(lambda s: s.ref_cnt >= 0)
        if not ready:
            return
        key = self.rng.choice(ready)
        for inst in self.instances:
            status = inst.status[key]
            status.ref_cnt += 1
            if status.ref_cnt == 1:
                inst.policy.mark_non_evictable(key)

    def unpin(self) -> None:
        pinned = self.keys_with(lambda s: s.ref_cnt > 0)
        if not pinned:
            return
        key = self.rng.choice(pinned)
        for inst in self.instances:
            status = inst.status[key]
            status.ref_cnt -= 1
            if status.ref_cnt == 0:
                inst.policy.mark_evictable(key)

    def hit(self) -> None:
        model = self.model()
        if not model:
            return
        keys = self.rng.sample(list(model), self.rng.randint(1, min(3, len(model))))
        self.touch(keys)

    def hit_and_load(self) -> None:
        """Blocks-mode hits: each key touched alone, then (primary only) pinned and unpinned
        at once, as a load that starts and ends; the twin sees the touches alone."""
        ready = self.keys_with(lambda s: s.ref_cnt == 0)
        if not ready:
            return
        for key in self.rng.sample(ready, self.rng.randint(1, min(3, len(ready)))):
            for inst in self.instances:
                inst.policy.touch([key])
            status = self.primary.status[key]
            status.ref_cnt = 1
            self.primary.policy.mark_non_evictable(key)
            status.ref_cnt = 0
            self.primary.policy.mark_evictable(key)

    def primary_double_insert(self) -> None:
        """Inserting stored keys on the primary only: each call must raise ``ValueError``."""
        model = self.model()
        if not model:
            return
        key = self.rng.choice(list(model))
        policy = self.primary.policy
        fresh = _key(10**9 + self.step)
        for call, args in (
            ("insert", (key, BlockStatus(10**6, -1))),
            ("insert_many", ([fresh, key], [BlockStatus(10**6, -1), BlockStatus(10**6 + 1, -1)])),
            ("insert_many", ([fresh, fresh], [BlockStatus(10**6, -1), BlockStatus(10**6 + 1, -1)])),
        ):
            try:
                getattr(policy, call)(*args)
            except ValueError:
                pass
            else:
                raise self.fail(
                    "inserting a stored key raises ValueError", f"{call}{args[0]!r} did not raise"
                )
            if policy.get(key) is not model[key] or policy.get(fresh) is not None:
                raise self.fail(
                    "a refused insert changes nothing", f"{call} changed the table before raising"
                )

    def random_evict(self) -> None:
        model = self.model()
        protected = set(self.rng.sample(list(model), self.rng.randint(0, len(model) // 2)))
        self.evict(self.rng.randint(0, 3), protected)

    def random_step(self) -> None:
        self.step += 1
        roll = self.rng.random()
        if roll < 0.35:
            self.store(self.rng.randint(1, max(1, min(3, self.capacity))))
        elif roll < 0.55:
            self.complete(success=self.rng.random() < 0.85)
        elif roll < 0.70:
            self.hit()
        elif roll < 0.78:
            self.pin()
        elif roll < 0.88:
            self.unpin()
        else:
            self.random_evict()
        self.check_get()

    def check_get(self) -> None:
        """The same ``get`` calls on every instance, so a twin check is not perturbed by them."""
        model = self.model()
        stored = self.rng.sample(list(model), min(2, len(model)))
        gone = [self.rng.choice(self.evicted)] if self.evicted else []
        for inst in self.instances:
            for key in stored:
                if inst.policy.get(key) is not inst.status[key]:
                    raise self.fail("get returns the stored status", f"get({key!r}) is wrong")
            table = inst.policy.block_table
            if table is not None and (
                len(table) != len(inst.status)
                or any(table.get(key) is not inst.status[key] for key in stored)
            ):
                raise self.fail(
                    "block_table agrees with get",
                    f"it holds {len(table)} blocks, {len(inst.status)} are stored",
                )
            for key in gone:
                if key not in model and inst.policy.get(key) is not None:
                    raise self.fail("evicted blocks are gone", f"get({key!r}) is not None")

    # ------------------------------------------------------------ perturbations
    def primary_gets(self) -> None:
        """Extra ``get`` calls on the primary only (stored, evicted and unknown keys)."""
        policy = self.primary.policy
        candidates = list(self.model())[:3] + self.evicted[-3:] + [_key(10**9 + self.step)]
        for key in candidates:
            policy.get(key)

    def primary_failed_evict(self) -> None:
        """An ``evict`` on the primary only that cannot succeed; it must return None."""
        model = self.model()
        protected = set(self.rng.sample(list(model), self.rng.randint(0, len(model))))
        eligible = sum(1 for k, s in model.items() if s.ref_cnt == 0 and k not in protected)
        victims = self.primary.policy.evict(eligible + 1, protected)
        if victims is not None:
            self.check_victims(self.primary, eligible + 1, protected, victims)
            raise self.fail("evict returns exactly n", "an impossible eviction returned victims")


def _deep_len(root: object) -> int:
    """Total number of elements in all containers reachable from ``root``'s attributes."""
    seen: set[int] = set()
    stack: list[object] = [root]
    total = 0
    atoms = (str, bytes, int, float, complex, bool, type(None), random.Random)
    code = (types.FunctionType, types.MethodType, types.BuiltinFunctionType, types.ModuleType, type)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (*atoms, *code)):
            continue
        seen.add(id(obj))
        if isinstance(obj, Mapping):
            total += len(obj)
            stack.extend(obj.values())
            stack.extend(k for k in obj if not isinstance(k, atoms))
        elif isinstance(obj, (bytearray, memoryview)):
            total += len(obj)
        elif isinstance(obj, Iterable) and hasattr(obj, "__len__"):
            items = list(obj)
            total += len(items)
            stack.extend(items)
        else:
            attrs: list[object] = list(getattr(obj, "__dict__", {}).values())
            for cls in type(obj).__mro__:
                for slot in getattr(cls, "__slots__", ()):
                    if hasattr(obj, slot):
                        attrs.append(getattr(obj, slot))
            stack.extend(attrs)
    return total


# ---------------------------------------------------------------------- the checks
def _maker(policy_cls: type[CachePolicy], params: Mapping[str, Any]) -> PolicyMaker:
    return lambda capacity: policy_cls(cache_capacity=capacity, **params)


def check_evict_contract(
    make: PolicyMaker, name: str, capacity: int, seed: int, steps: int, allow_refusal: bool
) -> None:
    """Victims are exactly n, stored, ready, unpinned, unprotected; no spurious refusals."""
    driver = _Driver(make, capacity, seed, name, allow_refusal)
    for _ in range(steps):
        driver.random_step()
    if driver.primary.policy.evict(0, set()) != []:
        raise driver.fail("evict(0) returns []", "it did not")


def check_failed_evict_is_atomic(
    make: PolicyMaker, name: str, capacity: int, seed: int, steps: int, allow_refusal: bool
) -> None:
    """A failed evict changes nothing: a twin that never saw it decides identically."""
    driver = _Driver(make, capacity, seed, name, allow_refusal)
    driver.add_twin()
    driver.divergence_rule = "a failed evict changes nothing"
    for _ in range(steps):
        if driver.rng.random() < 0.3:
            driver.primary_failed_evict()
        driver.random_step()


def check_get_is_pure(
    make: PolicyMaker, name: str, capacity: int, seed: int, steps: int, allow_refusal: bool
) -> None:
    """``get`` changes nothing: a twin that never saw the gets decides identically."""
    driver = _Driver(make, capacity, seed, name, allow_refusal)
    driver.add_twin()
    driver.divergence_rule = "get is pure"
    for _ in range(steps):
        driver.primary_gets()
        driver.random_step()


def check_batches_match_singles(
    make: PolicyMaker, name: str, capacity: int, seed: int, steps: int, allow_refusal: bool
) -> None:
    """``insert_many`` / ``mark_evictable_many`` decide exactly like the single calls."""
    driver = _Driver(make, capacity, seed, name, allow_refusal)
    driver.add_twin()
    driver.batch_primary = True
    driver.divergence_rule = "batched calls behave like single calls"
    for _ in range(steps):
        driver.random_step()


def check_double_insert_raises(
    make: PolicyMaker, name: str, capacity: int, seed: int, steps: int, allow_refusal: bool
) -> None:
    """Inserting a stored key (or one key twice in a batch) raises ``ValueError`` and changes
    nothing: a twin that never saw the refused calls decides identically."""
    driver = _Driver(make, capacity, seed, name, allow_refusal)
    driver.add_twin()
    driver.divergence_rule = "a refused insert changes nothing"
    for _ in range(steps):
        if driver.rng.random() < 0.3:
            driver.primary_double_insert()
        driver.random_step()


def check_pin_is_not_an_access(
    make: PolicyMaker, name: str, capacity: int, seed: int, steps: int, allow_refusal: bool
) -> None:
    """A load's pin and unpin right after its hit change nothing: a twin that only touched
    decides identically (so blocks mode through a manager equals the policy driven alone)."""
    driver = _Driver(make, capacity, seed, name, allow_refusal)
    driver.add_twin()
    driver.divergence_rule = "a pin is not an access (pin + unpin after a hit changed a decision)"
    for _ in range(steps):
        if driver.rng.random() < 0.3:
            driver.hit_and_load()
        driver.random_step()


def check_clear_resets(
    make: PolicyMaker, name: str, capacity: int, seed: int, steps: int, allow_refusal: bool
) -> None:
    """After ``clear`` the policy is as good as new: same size, same later decisions."""
    driver = _Driver(make, capacity, seed, name, allow_refusal)
    for _ in range(steps):
        driver.random_step()
    policy = driver.primary.policy
    policy.clear()
    fresh_len = _deep_len(make(capacity))
    if _deep_len(policy) != fresh_len:
        raise driver.fail(
            "clear resets everything",
            f"{_deep_len(policy)} container elements remain after clear, a fresh instance has "
            f"{fresh_len}",
        )
    if driver.evicted:
        driver.evicted.clear()
    driver.primary.status.clear()
    driver.free_slots = list(range(capacity))
    driver.instances.append(_Instance(make(capacity)))
    driver.divergence_rule = "clear resets everything (a cleared and a fresh instance differ)"
    for _ in range(steps):
        driver.random_step()


def check_remove_leaves_no_trace(
    make: PolicyMaker, name: str, capacity: int, seed: int, steps: int, allow_refusal: bool
) -> None:
    """Inserting then removing blocks returns a fresh policy to its fresh size."""
    driver = _Driver(make, capacity, seed, name, allow_refusal)
    policy = driver.primary.policy
    fresh_len = _deep_len(make(capacity))
    keys = driver.new_keys(max(1, capacity))
    policy.touch(keys)
    for slot, key in enumerate(keys):
        policy.insert(key, BlockStatus(slot, -1))
    for key in keys:
        policy.remove(key)
        if policy.get(key) is not None:
            raise driver.fail("remove leaves no trace", f"get({key!r}) after remove")
    remaining = _deep_len(policy)
    if remaining != fresh_len:
        raise driver.fail(
            "remove leaves no trace",
            f"{remaining} container elements after inserting and removing {len(keys)} blocks, "
            f"a fresh instance has {fresh_len}",
        )
    if policy.evict(1, set()) is not None:
        raise driver.fail("evict only stored blocks", "evict(1) succeeded on an empty policy")


def check_history_is_bounded(
    make: PolicyMaker, name: str, capacity: int, seed: int, steps: int, allow_refusal: bool
) -> None:
    """Ghost / history state stays O(capacity) while new keys keep streaming through."""
    driver = _Driver(make, capacity, seed, name, allow_refusal)
    policy = driver.primary.policy

    def stream(rounds: int) -> None:
        for _ in range(rounds):
            driver.step += 1
            driver.store(1)
            driver.complete(success=True)
            if driver.rng.random() < 0.3:
                driver.hit()

    stream(40 * capacity + 50)
    middle = _deep_len(policy)
    stream(160 * capacity + 200)
    final = _deep_len(policy)
    limit = int(1.25 * middle) + 64
    if final > limit or final > 64 * capacity + 4096:
        raise driver.fail(
            "history stays bounded",
            f"state grew from {middle} to {final} container elements while new keys streamed "
            f"through a capacity-{capacity} cache",
        )


ALL_CHECKS = (
    check_evict_contract,
    check_failed_evict_is_atomic,
    check_get_is_pure,
    check_batches_match_singles,
    check_double_insert_raises,
    check_pin_is_not_an_access,
    check_clear_resets,
    check_remove_leaves_no_trace,
    check_history_is_bounded,
)


def check_policy_conformance(
    policy_cls: type[CachePolicy],
    *,
    capacities: Iterable[int] = DEFAULT_CAPACITIES,
    seeds: Iterable[int] = DEFAULT_SEEDS,
    steps: int = 300,
    allow_refusal: bool = False,
    **params: Any,
) -> None:
    """Run every check on ``policy_cls(cache_capacity=c, **params)``; raise on the first failure.

    ``allow_refusal=True`` accepts ``evict`` returning ``None`` although victims exist (for
    policies that deliberately refuse stores, e.g. admission-gated ones).
    """
    make = _maker(policy_cls, params)
    name = policy_cls.__name__
    for check in ALL_CHECKS:
        for capacity in capacities:
            for seed in seeds:
                check(make, name, capacity, seed, steps, allow_refusal)


class PolicyConformanceSuite:
    """Subclass as ``class TestMine(PolicyConformanceSuite): policy_cls = Mine`` in pytest."""

    policy_cls: type[CachePolicy]
    policy_params: Mapping[str, Any] = {}
    capacities: tuple[int, ...] = DEFAULT_CAPACITIES
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    steps = 300
    allow_refusal = False

    def _run(self, check: Callable[..., None]) -> None:
        make = _maker(self.policy_cls, self.policy_params)
        for capacity in self.capacities:
            for seed in self.seeds:
                check(
                    make, self.policy_cls.__name__, capacity, seed, self.steps, self.allow_refusal
                )

    def test_evict_contract(self) -> None:
        self._run(check_evict_contract)

    def test_failed_evict_is_atomic(self) -> None:
        self._run(check_failed_evict_is_atomic)

    def test_get_is_pure(self) -> None:
        self._run(check_get_is_pure)

    def test_batches_match_singles(self) -> None:
        self._run(check_batches_match_singles)

    def test_double_insert_raises(self) -> None:
        self._run(check_double_insert_raises)

    def test_pin_is_not_an_access(self) -> None:
        self._run(check_pin_is_not_an_access)

    def test_clear_resets(self) -> None:
        self._run(check_clear_resets)

    def test_remove_leaves_no_trace(self) -> None:
        self._run(check_remove_leaves_no_trace)

    def test_history_is_bounded(self) -> None:
        self._run(check_history_is_bounded)


__all__ = [
    "ALL_CHECKS",
    "ConformanceError",
    "PolicyConformanceSuite",
    "check_batches_match_singles",
    "check_clear_resets",
    "check_double_insert_raises",
    "check_evict_contract",
    "check_failed_evict_is_atomic",
    "check_get_is_pure",
    "check_history_is_bounded",
    "check_pin_is_not_an_access",
    "check_policy_conformance",
    "check_remove_leaves_no_trace",
]
