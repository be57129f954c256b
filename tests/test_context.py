"""ReqContext: key positions and per-type private state."""

from __future__ import annotations

import pytest

from kvoffload import ReqContext


def test_key_positions_are_recorded_and_read_only() -> None:
    ctx = ReqContext(req_id="r")
    ctx.set_key_positions([b"a", b"b"], 16)
    ctx.set_offload_key_position(b"c", 40)
    assert dict(ctx.key_positions) == {b"a": 16, b"b": 32, b"c": 40}
    assert ctx.get_offload_key_position(b"b") == 32
    assert ctx.block_index(b"c", 16) == 2
    assert ctx.get_offload_key_position(b"zz") is None
    with pytest.raises(TypeError):
        ctx.key_positions[b"a"] = 0  # type: ignore[index]


def test_state_is_kept_per_type() -> None:
    class Mine:
        pass

    ctx = ReqContext(req_id="r")
    assert ctx.get_state(Mine) is None
    mine = Mine()
    ctx.set_state(mine)
    assert ctx.get_state(Mine) is mine
