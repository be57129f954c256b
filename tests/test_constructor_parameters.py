"""One error rule for constructor, config and CLI parameters (issue 13, item 7).

For every parameter checked through :mod:`kvoffload._checks`: a wrong type is a ``TypeError``
and a wrong value a ``ValueError``, each naming the parameter. The cases marked "was ..." are
the ones whose error class (or acceptance) changed when the hand-rolled checks were replaced.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvoffload.cli.errors import UserError
from kvoffload.cli.inputs import workload_config
from kvoffload.layout import KVCacheLayout, KVTensorLayout, slots_for_budget
from kvoffload.manager import CPUOffloadingManager
from kvoffload.policies import create_cache_policy
from kvoffload.sim.traces import TraceReader
from kvoffload.spec import OffloadingConfig

LAYOUT = KVCacheLayout([KVTensorLayout("x", "kv_first", (2, 8, 16, 2, 4), "float16")])


def _tensor(**overrides: Any) -> KVTensorLayout:
    args: dict[str, Any] = {
        "name": "x",
        "kind": "kv_first",
        "shape": (2, 8, 16, 2, 4),
        "dtype": "float16",
    }
    args.update(overrides)
    return KVTensorLayout(**args)


def _reader(tmp: Path, **kwargs: Any) -> TraceReader:
    return TraceReader(tmp / "t.jsonl", **kwargs)


# (parameter, call taking the value, wrong-type value, wrong value)
CORE: list[tuple[str, Callable[[Any], object], Any, Any]] = [
    ("num_blocks", lambda v: CPUOffloadingManager(v), "8", -1),
    ("cache_capacity", lambda v: create_cache_policy("lru", v), 8.0, -1),
    ("group", lambda v: _tensor(group=v), "0", -1),  # was ValueError for "0"
    ("shape\\[1\\]", lambda v: _tensor(shape=(2, v, 16, 2, 4)), 8.0, 0),  # was ValueError
    ("block_size", LAYOUT.blocks_per_chunk_for_tokens, 16.0, 0),
    ("blocks_per_chunk", LAYOUT.slot_layout, 1.5, 0),
    ("group", LAYOUT.group_tensors, "0", 1),
    ("budget_bytes", lambda v: slots_for_budget(64, v), "1", None),
    ("slot_bytes", lambda v: slots_for_budget(v, 1024), 1.5, 0),  # 1.5 was accepted
    ("enable_kv_cache_events", lambda v: OffloadingConfig(1, enable_kv_cache_events=v), 1, None),
    ("pin_memory", lambda v: OffloadingConfig(1, pin_memory=v), "yes", None),
    ("eviction_policy", lambda v: OffloadingConfig(1, eviction_policy=v), 3, ""),  # "" was Type
    ("spec_module_path", lambda v: OffloadingConfig(1, spec_module_path=v), 3, ""),
]


@pytest.mark.parametrize(("name", "call", "wrong_type", "wrong_value"), CORE)
def test_core_parameters(
    name: str, call: Callable[[Any], object], wrong_type: Any, wrong_value: Any
) -> None:
    with pytest.raises(TypeError, match=name):
        call(wrong_type)
    if wrong_value is not None:
        with pytest.raises(ValueError, match=name):
            call(wrong_value)


def test_budget_bytes_that_holds_no_slot_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="a budget of -1 bytes holds no slot"):
        slots_for_budget(64, -1)


@pytest.mark.parametrize(
    ("name", "wrong_type", "wrong_value"),
    [
        ("block_tokens", "16", 0),  # "16" was an unnamed TypeError from `<`; 16.0 was accepted
        ("block_tokens", 16.0, -1),
        ("max_requests", "3", 0),  # same as block_tokens
        ("max_line_bytes", 1.0, 0),
    ],
)
def test_trace_reader_parameters(
    tmp_path: Path, name: str, wrong_type: Any, wrong_value: Any
) -> None:
    with pytest.raises(TypeError, match=f"^{name} must be an int >= 1"):
        _reader(tmp_path, **{name: wrong_type})
    with pytest.raises(ValueError, match=f"^{name} must be an int >= 1"):
        _reader(tmp_path, **{name: wrong_value})


def _workload(param: str) -> object:
    args = argparse.Namespace(
        workload_param=[param], seed=0, requests=None, arrival=None, block_tokens=None
    )
    return workload_config(args)


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("think_time_s=x", "workload think_time_s must be a finite number, got str 'x'"),
        ("think_time_s=true", "workload think_time_s must be a finite number, got bool True"),
        ("think_time_s=NaN", "workload think_time_s must be a finite number, got nan"),  # was ok
        ("activity_rate=Infinity", "workload activity_rate must be a finite number, got inf"),
        ("requests=2.5", "workload requests must be an int, got float 2.5"),
        ("arrival=1", "workload arrival must be a str, got 1"),
    ],
)
def test_workload_knobs(param: str, message: str) -> None:
    with pytest.raises(UserError, match=f"^{message}$"):
        _workload(param)


def test_workload_knobs_still_take_ints_for_floats() -> None:
    config: Any = _workload("think_time_s=5")
    assert config.think_time_s == 5.0 and type(config.think_time_s) is float


# ----------------------------------------------------------------- torch-side constructors
torch = pytest.importorskip("torch")

from kvoffload.offloader import KVOffloader  # noqa: E402
from kvoffload.transfer.cuda_worker import CudaTransferWorker  # noqa: E402
from kvoffload.transfer.host import HostBuffer  # noqa: E402


def _caches() -> list[Any]:
    return [torch.zeros(2, 8, 16, 2, 4, dtype=torch.float16)]


def _offloader(**kwargs: Any) -> KVOffloader:
    return KVOffloader(_caches(), 1 << 20, **kwargs)


@pytest.mark.parametrize(
    ("name", "call", "wrong_type", "wrong_value"),
    [
        ("slot_bytes", lambda v: HostBuffer(v, 2, pin=False), 16.0, 0),
        ("num_slots", lambda v: HostBuffer(16, v, pin=False), "2", 0),
        ("tier_wait_s", lambda v: _offloader(tier_wait_s=v), "2", -1),
        ("tier_wait_s", lambda v: _offloader(tier_wait_s=v), True, math.nan),  # nan was accepted
        ("tier_wait_s", lambda v: _offloader(tier_wait_s=v), None, -math.inf),
    ],
)
def test_torch_side_parameters(
    name: str, call: Callable[[Any], object], wrong_type: Any, wrong_value: Any
) -> None:
    with pytest.raises(TypeError, match=f"^{name} must be"):
        call(wrong_type)
    with pytest.raises(ValueError, match=f"^{name} must be"):
        call(wrong_value)


def test_tier_wait_s_still_takes_inf() -> None:
    with _offloader(tier_wait_s=math.inf) as off:
        assert off.tier_wait_s == math.inf


def test_lookup_group() -> None:
    with _offloader() as off:
        with pytest.raises(TypeError, match=r"^group must be an int in \[0, 0\]"):  # was Value
            off.lookup([b"h"], group="0")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"^group must be an int in \[0, 0\], got 1"):
            off.lookup([b"h"], group=1)


@pytest.mark.parametrize(
    ("wrong", "error"),
    [("1024", TypeError), (1024.0, TypeError), (0, ValueError), (-1, ValueError)],
)
def test_staging_bytes_is_checked_before_the_device(wrong: Any, error: type) -> None:
    # Checked first, as the config key is (>= 1), so even CPU tensors get the parameter's error.
    slots = LAYOUT.slot_layout(1)
    host = HostBuffer(slots.slot_bytes, 2, pin=False)
    with pytest.raises(error, match=r"^staging_bytes must be an int >= 1"):
        CudaTransferWorker(LAYOUT, slots, host, _caches(), staging_bytes=wrong)
