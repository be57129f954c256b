"""Hypothesis state machine: the manager with every built-in policy against a reference model.

Offered and loaded keys may repeat within a call (a repeated store offer counts once, at its
first place; each repeated load is one more pin), and resets come while jobs are in flight:
their slots stay held (never handed out) until their stale completions arrive or
``release_stale_slots`` says they are done. ``switch_policy`` to any built-in comes at any
step: the model does not change (no block, slot, pin or pending write is lost), and every
later eviction is checked against it as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvoffload import CPUOffloadingManager, LookupResult, ReqContext
from kvoffload.keys import OffloadKey, make_offload_key
from kvoffload.policies import CachePolicyFactory

KEY_POOL = 14
POLICIES = CachePolicyFactory.registered_names()


def k(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(8, "big"), 0)


@dataclass
class Block:
    slot: int
    pending: bool = True
    pins: int = 0


@dataclass
class Job:
    ctx: ReqContext
    keys: list[OffloadKey]
    generation: int


@dataclass
class Held:
    """A slot whose block was being written or read when its generation ended."""

    slot: int
    jobs: int  # completions still due


def make_machine(policy: str) -> type[RuleBasedStateMachine]:
    class ManagerMachine(RuleBasedStateMachine):
        @initialize(capacity=st.integers(1, 6), partial=st.booleans())
        def setup(self, capacity: int, partial: bool) -> None:
            self.capacity = capacity
            self.partial = partial
            self.m = CPUOffloadingManager(capacity, cache_policy=policy, partial_store=partial)
            self.blocks: dict[OffloadKey, Block] = {}
            self.stores: list[Job] = []
            self.loads: list[Job] = []
            self.generation = 0
            self.n = 0
            # generation that ended -> key -> held slot. With a block table each slot comes
            # back with its own last job; without one, all of a generation's come back together.
            self.held: dict[int, dict[OffloadKey, Held]] = {}
            # Whether each ended generation's slots come back one by one (set at the reset:
            # the policy then may differ from the one now, after a switch).
            self.precise: dict[int, bool] = {}
            self.switches = 0

        def held_slots(self) -> set[int]:
            return {h.slot for by_key in self.held.values() for h in by_key.values()}

        def stale_job_done(self, generation: int, key: OffloadKey) -> None:
            by_key = self.held.get(generation)
            if by_key is None:
                return
            if self.precise[generation]:
                held = by_key.get(key)
                if held is not None:
                    held.jobs -= 1
                    if held.jobs == 0:
                        del by_key[key]
            else:
                first = next(iter(by_key.values()))
                first.jobs -= 1  # the generation's count, kept on any one entry
                if sum(h.jobs for h in by_key.values()) == 0:
                    by_key.clear()
            if not by_key:
                del self.held[generation]

        def ctx(self) -> ReqContext:
            self.n += 1
            return ReqContext(req_id=f"r{self.n}")

        @rule(ids=st.lists(st.integers(0, KEY_POOL - 1), min_size=1, max_size=5))
        def prepare_store(self, ids: list[int]) -> None:
            offered = list(dict.fromkeys(k(i) for i in ids))  # a repeat counts once
            absent = [key for key in offered if key not in self.blocks]
            evictable = [
                key
                for key, b in self.blocks.items()
                if not b.pending and b.pins == 0 and key not in offered
            ]
            free = self.capacity - len(self.blocks) - len(self.held_slots())
            fits = len(absent) - free <= len(evictable)
            c = self.ctx()
            out = self.m.prepare_store([k(i) for i in ids], c)
            if not fits and not (self.partial and free + len(evictable) > 0):
                assert out is None
                return
            assert out is not None, "the store fits but the manager refused it"
            expected = absent if fits else absent[: free + len(evictable)]
            assert out.keys_to_store == expected
            assert len(out.store_spec.block_ids) == len(expected)
            for victim in out.evicted_keys:
                assert victim in evictable, "evicted a pinned, pending, protected or absent block"
                del self.blocks[victim]
            assert len(out.evicted_keys) == max(0, len(expected) - free)
            held = self.held_slots()
            for key, slot in zip(out.keys_to_store, out.store_spec.block_ids, strict=True):
                assert slot not in held, "handed out a slot a job from before a reset still uses"
                self.blocks[key] = Block(slot)
            if out.keys_to_store:
                self.stores.append(Job(c, list(out.keys_to_store), self.generation))

        @precondition(lambda self: bool(self.stores))
        @rule(data=st.data(), success=st.booleans())
        def complete_store(self, data: st.DataObject, success: bool) -> None:
            job = self.stores.pop(data.draw(st.integers(0, len(self.stores) - 1)))
            self.m.complete_store(job.keys, job.ctx, success=success)
            if job.generation != self.generation:  # stale: only its slots come back
                for key in job.keys:
                    self.stale_job_done(job.generation, key)
                return
            for key in job.keys:
                if success:
                    self.blocks[key].pending = False
                else:
                    del self.blocks[key]

        @precondition(lambda self: any(not b.pending for b in self.blocks.values()))
        @rule(data=st.data())
        def prepare_load(self, data: st.DataObject) -> None:
            ready = sorted(key for key, b in self.blocks.items() if not b.pending)
            chosen = data.draw(st.lists(st.sampled_from(ready), min_size=1, max_size=3))
            c = self.ctx()
            spec = self.m.prepare_load(chosen, c)
            assert spec.block_ids == [self.blocks[key].slot for key in chosen]
            for key in chosen:
                self.blocks[key].pins += 1
            self.loads.append(Job(c, chosen, self.generation))

        @precondition(lambda self: bool(self.loads))
        @rule(data=st.data())
        def complete_load(self, data: st.DataObject) -> None:
            job = self.loads.pop(data.draw(st.integers(0, len(self.loads) - 1)))
            self.m.complete_load(job.keys, job.ctx)
            for key in job.keys:
                if job.generation == self.generation:
                    self.blocks[key].pins -= 1
                else:
                    self.stale_job_done(job.generation, key)

        @rule()
        def reset(self) -> None:
            self.m.reset_cache()
            in_flight = {
                key: Held(b.slot, 1 if b.pending else b.pins)
                for key, b in self.blocks.items()
                if b.pending or b.pins
            }
            if in_flight:
                self.held[self.generation] = in_flight
                self.precise[self.generation] = self.m.policy.block_table is not None
            self.generation += 1
            self.blocks.clear()

        @precondition(lambda self: bool(self.held))
        @rule()
        def release_stale_slots(self) -> None:
            assert self.m.release_stale_slots() == len(self.held_slots())
            self.held.clear()

        @rule(new_policy=st.sampled_from(POLICIES))
        def switch_policy(self, new_policy: str) -> None:
            if self.m.policy.block_table is None:  # the stored keys are unknown: refused
                old = self.m.policy
                with pytest.raises(ValueError, match="block_table"):
                    self.m.switch_policy(new_policy)
                assert self.m.policy is old
                return
            report = self.m.switch_policy(new_policy)
            self.switches += 1
            assert report.moved == len(self.blocks)
            assert report.pending == sum(b.pending for b in self.blocks.values())
            assert report.pinned == sum(b.pins > 0 for b in self.blocks.values())
            assert self.m.get_stats().policy_switches == self.switches

        @rule(i=st.integers(0, KEY_POOL - 1))
        def lookup(self, i: int) -> None:
            block = self.blocks.get(k(i))
            expected = (
                LookupResult.MISS
                if block is None
                else LookupResult.HIT_PENDING
                if block.pending
                else LookupResult.HIT
            )
            assert self.m.lookup(k(i), self.ctx()) == expected

        @invariant()
        def bookkeeping_matches_model(self) -> None:
            if not hasattr(self, "m"):
                return
            slots = [b.slot for b in self.blocks.values()]
            assert len(set(slots)) == len(slots), "a slot is owned twice"
            assert all(0 <= s < self.capacity for s in slots)
            assert not self.held_slots() & set(slots), "a held slot also holds a block"
            stats = self.m.get_stats()
            assert stats.held_blocks == len(self.held_slots())
            assert stats.stored_blocks == len(self.blocks)
            assert stats.pending_blocks == sum(b.pending for b in self.blocks.values())
            assert stats.pinned_blocks == sum(b.pins > 0 for b in self.blocks.values())
            assert stats.evictable_blocks == sum(
                not b.pending and b.pins == 0 for b in self.blocks.values()
            )
            for key, block in self.blocks.items():
                status = self.m.policy.get(key)
                assert status is not None and status.block_id == block.slot
                assert status.ref_cnt == (-1 if block.pending else block.pins)
            busy = any(b.pending or b.pins for b in self.blocks.values()) or bool(self.held)
            assert self.m.has_pending_work() is busy

    ManagerMachine.__name__ = f"ManagerMachine_{policy}"
    return ManagerMachine


@pytest.mark.parametrize("policy", CachePolicyFactory.registered_names())
def test_manager_against_reference_model(policy: str) -> None:
    machine = make_machine(policy)
    machine.TestCase.settings = settings(
        max_examples=40, stateful_step_count=30, deadline=None, derandomize=True
    )
    machine.TestCase().runTest()
