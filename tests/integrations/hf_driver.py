"""A second engine process for the transformers tests: the tiny seeded model behind a
PrefixCache on a disk or Redis tier; prints one JSON line per prompt (hit tokens and the
logits' bytes as hex) so the parent can compare them bit for bit.

    python hf_driver.py [--disk DIR] [--redis URL --namespace NS]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hf_tiny import BLOCK, prompts, tiny_model

from kvoffload.integrations.transformers import PrefixCache


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--disk")
    parser.add_argument("--redis")
    parser.add_argument("--namespace", default="hf-test")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = tiny_model()
    tiers: list[tuple[str, dict[str, object]]] = []
    if args.disk:
        tiers.append(("disk", {"type": "disk", "path": args.disk, "capacity_bytes": "64MiB"}))
    if args.redis:
        # A key unanswered after lookup_deadline_ms is a miss: generous on a loaded CI host.
        redis = {"type": "redis", "url": args.redis, "namespace": args.namespace}
        tiers.append(("redis", {**redis, "lookup_deadline_ms": 5000}))
    for name, tier in tiers:  # one engine per tier, each starting with an empty CPU tier
        with PrefixCache(
            model, 8 << 20, block_tokens=BLOCK, max_tokens=512, tiers=[tier], tier_wait_s=10.0
        ) as pc:
            for tokens in prompts():
                result = pc.prefill(tokens)
                logits = result.logits.contiguous().view(torch.uint8).numpy().tobytes().hex()
                row = {"tier": name, "hit_tokens": result.hit_tokens, "logits": logits}
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
