"""A real (tiny, seeded) Llama served through ``PrefixCache`` with a trace recorder: the
recorded trace, replayed by the simulator with the same policy and capacity, gives the
live run's prefix hits.

Exact for prompts that do not end on a block boundary, in a cache that holds them all. A
prompt that ends on a block boundary and is stored whole is where the semantics part: the
engine recomputes its last block (the last token needs a forward, so
``lookup(num_tokens=...)`` caps the hit), the replay counts that block a hit. Under
eviction they part too: ``PrefixCache`` completes a request's loads before it stores its
new blocks, where the replay (as vLLM) keeps the loaded prefix pinned through the store.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers", minversion="5.25")  # cache= (see the module)
torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from hf_tiny import BLOCK, prompts, tiny_model  # noqa: E402

from kvoffload.integrations.transformers import PrefixCache  # noqa: E402
from kvoffload.manager import TraceRecorder  # noqa: E402
from kvoffload.sim.replay import ReplayOptions, replay  # noqa: E402
from kvoffload.sim.traces import load_trace  # noqa: E402

MiB = 1 << 20


@pytest.fixture(scope="module")
def model() -> Any:
    torch.set_num_threads(1)
    return tiny_model()


@pytest.mark.parametrize("how", ["recorder", "config key"])
def test_a_recorded_run_replays_to_the_same_hits(model: Any, tmp_path: Path, how: str) -> None:
    path = tmp_path / "live.jsonl"
    extra: dict[str, Any] = (
        {"recorder": TraceRecorder(path, block_tokens=BLOCK)}
        if how == "recorder"
        else {"record_trace": str(path)}
    )
    # Every prompt twice (the second round hits what the first stored), none ending on a
    # block boundary (see the module docstring).
    work = [[*t, 7] if len(t) % BLOCK == 0 else t for t in prompts()] * 2
    with PrefixCache(
        model, 8 * MiB, block_tokens=BLOCK, max_tokens=512, model_id="t", **extra
    ) as pc:
        hits = [pc.prefill(tokens).hit_tokens for tokens in work]
        capacity = pc.offloader.manager.num_blocks  # type: ignore[attr-defined]
        recorder = pc.recorder
        assert recorder is not None
    assert recorder.stats() == {"recorded": len(work), "dropped": 0, "written": len(work)}
    assert sum(hits) > 0
    trace = load_trace(path, block_tokens=BLOCK)
    assert len(trace.requests) == len(work)
    assert [len(r.block_ids) for r in trace.requests] == [len(t) // BLOCK for t in work]
    replayed = replay(trace, capacity, "lru", ReplayOptions(mode="prefix"))
    assert replayed.prefix_hit_blocks * BLOCK == sum(hits)
