"""Why ``sae`` trails LRU on our traces: its reuse term outweighs recency (design, not a bug).

A session's score is ``last_touch + hits * touch_weight + depth bonus`` with one tick per
``touch`` call (a manager makes about two per request). The default ``touch_weight`` (1500)
makes every past hit worth 1500 ticks of recency, i.e. hundreds of requests, so a session hit
a few times long ago outlives fresher ones; on our traces most blocks are reused at most 1-3
times, minutes apart, so those old sessions are pollution. With ``touch_weight=0`` (and no
depth bonus) SAE ranks sessions by recency and matches LRU (shared trace at 5%: 0.1564 vs
LRU 0.1566, against 0.1298 with the defaults: prefix-mode ``kvoffload.sim.replay.replay`` at
2,196 blocks with ``PolicySpec.of("sae", params={"touch_weight": 0.0, "depth_bonus": 0.0})``).
"""

from __future__ import annotations

from kvoffload.context import ReqContext
from kvoffload.policies import BlockStatus, create_cache_policy
from kvoffload.testing.drive import int_key


def _victim_after_idle(**params: float) -> int:
    sae = create_cache_policy("sae", 2, None, dict(params))
    old = ReqContext(req_id="old", session_id="old")
    sae.touch([int_key(1)], old)
    status = BlockStatus(0, -1)
    sae.insert(int_key(1), status, old)
    status.ref_cnt = 0
    sae.mark_evictable(int_key(1))
    for _ in range(3):  # three later uses of the old session
        sae.touch([int_key(1)], ReqContext(req_id="again", session_id="old"))
    for i in range(2000):  # a long idle stretch: other traffic, one tick per touch call
        sae.touch([int_key(10_000 + i)])
    fresh = ReqContext(req_id="fresh", session_id="fresh")
    sae.touch([int_key(2)], fresh)
    status = BlockStatus(1, -1)
    sae.insert(int_key(2), status, fresh)
    status.ref_cnt = 0
    sae.mark_evictable(int_key(2))
    victims = sae.evict(1, ())
    assert victims is not None
    return int.from_bytes(victims[0][0][:8], "big")


def test_default_weights_keep_an_old_reused_session_over_a_fresh_one() -> None:
    assert _victim_after_idle() == 2  # 3 hits x 1500 outweigh 2000 ticks of idleness


def test_without_the_reuse_weight_recency_decides() -> None:
    assert _victim_after_idle(touch_weight=0.0) == 1
