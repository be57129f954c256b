"""``kvoffload demo --engine hf``: a real (seeded, randomly initialised) Llama on this CPU,
multi-turn conversations, cold prefill against :class:`PrefixCache` reuse.

Each conversation shares one system prompt; turn ``t``'s prompt is the system prompt plus
every earlier user message and answer plus the new user message (answers are random tokens:
only the first token of each answer is timed, so generating them would measure nothing). A
request's time to first token (TTFT) is measured twice: cold (transformers' own
``DynamicCache``, prefill cut at the same block boundaries) and warm (through kvoffload).
Warm logits must equal cold logits bit for bit.

One torch thread by default: on a shared 2-core machine two intra-op threads stalled
prefill 2-10x whenever the other core was busy, which drowns the comparison in noise.
CPU seconds (``time.process_time``) are reported beside wall seconds for the same reason.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from kvoffload.integrations.transformers import PrefixCache

THREADS_WHY = (
    "one torch thread: on a shared 2-core machine two threads stalled prefill 2-10x "
    "whenever the other core was busy (--threads to change)"
)


def demo_model(args: argparse.Namespace) -> LlamaForCausalLM:
    """A seeded Llama built from a config (no download): by default 6 layers, hidden 512,
    8 heads, 2 KV heads, head_dim 64, vocabulary 32,000, fp32."""
    config = LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        max_position_embeddings=args.max_tokens,
    )
    torch.manual_seed(args.seed)
    return LlamaForCausalLM(config).eval()


@dataclass
class Request:
    conversation: int
    turn: int
    tokens: list[int]


def conversations(args: argparse.Namespace) -> list[Request]:
    """Turn-major order (every conversation's turn 1, then turn 2, ...), as a server sees
    several users at once."""
    gen = torch.Generator().manual_seed(args.seed + 1)

    def rand(low: int, high: int) -> list[int]:
        n = int(torch.randint(low, high + 1, (1,), generator=gen))
        return torch.randint(0, args.vocab, (n,), generator=gen).tolist()

    system = rand(args.system_tokens, args.system_tokens)
    history = [list(system) for _ in range(args.conversations)]
    requests = []
    for turn in range(1, args.turns + 1):
        for c in range(args.conversations):
            history[c] += rand(args.user_tokens[0], args.user_tokens[1])
            requests.append(Request(c, turn, list(history[c])))
            history[c] += rand(args.answer_tokens[0], args.answer_tokens[1])
    return requests


def cold_prefill(model: Any, tokens: list[int], cut: int) -> tuple[torch.Tensor, float, float]:
    """Last-token logits of a cold prefill (transformers' DynamicCache, cut every ``cut``
    tokens, as the warm path cuts), and its wall and CPU seconds."""
    wall, cpu = time.perf_counter(), time.process_time()
    cache = DynamicCache(config=model.config)
    ids = torch.tensor([tokens])
    start, logits = 0, None
    with torch.inference_mode():
        while start < len(tokens):
            stop = min(len(tokens), (start // cut + 1) * cut)
            out = model(ids[:, start:stop], cache=cache, use_cache=True, logits_to_keep=1)
            logits, start = out.logits[0, -1], stop
    assert logits is not None
    return logits, time.perf_counter() - wall, time.process_time() - cpu


def _tier_reads(pc: PrefixCache) -> dict[str, int]:
    stats = pc.offloader.stats().manager
    tiers = getattr(stats, "tiers", None) or {}
    return {name: int(row.get("promotions", 0)) for name, row in tiers.items()}


def tier_config(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The ``tiers`` of the demo's options (as the toy engine reads them): disk, then Redis."""
    tiers: list[dict[str, Any]] = []
    write_policy = getattr(args, "write_policy", "write_through")
    if args.disk:
        tiers.append(
            {
                "type": "disk",
                "path": args.disk,
                "capacity_bytes": args.disk_bytes,
                "policy": getattr(args, "disk_policy", "lru"),
                "durability": getattr(args, "durability", "rename"),
                "write_policy": write_policy,
            }
        )
    if args.redis:
        tiers.append(
            {
                "type": "redis",
                "url": args.redis,
                "namespace": args.redis_namespace,
                "prefix": "kvoffload-demo",
                "ttl_ms": 3600 * 1000,  # the demo's records leave the server within an hour
                # A key unanswered after this deadline is a miss: generous on a busy host.
                "lookup_deadline_ms": 5000,
                "write_policy": write_policy,
            }
        )
    return tiers


def warm_pass(
    pc: PrefixCache, requests: list[Request], cold_logits: list[torch.Tensor] | None
) -> list[dict[str, Any]]:
    """Every request through the prefix cache: TTFT, reuse, where the hits came from,
    and whether the logits equal the cold ones bit for bit."""
    rows = []
    for i, req in enumerate(requests):
        before = _tier_reads(pc)
        wall, cpu = time.perf_counter(), time.process_time()
        result = pc.prefill(req.tokens)
        ttft_wall, ttft_cpu = time.perf_counter() - wall, time.process_time() - cpu
        after = _tier_reads(pc)
        source = [name for name in after if after[name] > before.get(name, 0)]
        where = ("+".join(source) or "cpu") if result.hit_tokens else "none"
        exact = None if cold_logits is None else bool(torch.equal(result.logits, cold_logits[i]))
        rows.append(
            {
                "conversation": req.conversation,
                "turn": req.turn,
                "prompt_tokens": len(req.tokens),
                "hit_tokens": result.hit_tokens,
                "computed_tokens": result.computed_tokens,
                "ttft_wall_s": ttft_wall,
                "ttft_cpu_s": ttft_cpu,
                "restore_wall_s": result.restore_seconds,
                "restore_cpu_s": result.restore_cpu_seconds,
                "store_wait_s": result.store_wait_seconds,
                "hit_from": where,
                "bit_identical": exact,
            }
        )
    return rows


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def summarize(
    cold: list[dict[str, Any]], warm: list[dict[str, Any]], pc: PrefixCache
) -> dict[str, Any]:
    """The demo's figures: TTFT cold vs warm, reuse, restore cost per tier, exactness, bytes."""
    out: dict[str, Any] = {"requests": len(warm)}
    for key in ("ttft_wall_s", "ttft_cpu_s"):
        c = [r[key] for r in cold]
        w = [r[key] for r in warm]
        out[key] = {
            "cold_median": statistics.median(c) if c else None,
            "cold_p90": _pct(c, 0.9) if c else None,
            "warm_median": statistics.median(w),
            "warm_p90": _pct(w, 0.9),
        }
        if c:
            out[key]["median_ratio"] = statistics.median(c) / statistics.median(w)
            out[key]["median_of_ratios"] = statistics.median(
                a / b for a, b in zip(c, w, strict=True)
            )
    turns: dict[int, dict[str, Any]] = {}
    for i, r in enumerate(warm):
        t = turns.setdefault(r["turn"], {"cold_cpu": [], "warm_cpu": [], "hit": 0, "tokens": 0})
        t["warm_cpu"].append(r["ttft_cpu_s"])
        if cold:
            t["cold_cpu"].append(cold[i]["ttft_cpu_s"])
        t["hit"] += r["hit_tokens"]
        t["tokens"] += r["prompt_tokens"]
    out["by_turn"] = {
        turn: {
            "cold_cpu_median_s": statistics.median(t["cold_cpu"]) if t["cold_cpu"] else None,
            "warm_cpu_median_s": statistics.median(t["warm_cpu"]),
            "reused_fraction": t["hit"] / t["tokens"],
        }
        for turn, t in sorted(turns.items())
    }
    out["tokens_computed"] = sum(r["computed_tokens"] for r in warm)
    out["tokens_reused"] = sum(r["hit_tokens"] for r in warm)
    out["tokens_cold"] = sum(r["prompt_tokens"] for r in warm)
    per_tier: dict[str, dict[str, float]] = {}
    for r in warm:
        if r["hit_tokens"]:
            row = per_tier.setdefault(r["hit_from"], {"tokens": 0, "wall": 0.0, "cpu": 0.0})
            row["tokens"] += r["hit_tokens"]
            row["wall"] += r["restore_wall_s"]
            row["cpu"] += r["restore_cpu_s"]
    out["restore_ms_per_1k_tokens"] = {
        name: {
            "wall": 1e6 * row["wall"] / row["tokens"],
            "cpu": 1e6 * row["cpu"] / row["tokens"],
            "requests": sum(1 for r in warm if r["hit_from"] == name),
        }
        for name, row in per_tier.items()
    }
    # kvoffload's own time inside TTFT: the restore, plus any wait for the last request's
    # background store (it reads the buffers this request overwrites).
    restore = sum(r["restore_wall_s"] + r.get("store_wait_s", 0.0) for r in warm)
    out["store_wait_s"] = sum(r.get("store_wait_s", 0.0) for r in warm)
    out["kvoffload_share_of_warm_ttft"] = restore / sum(r["ttft_wall_s"] for r in warm)
    out["kvoffload_cpu_share_of_warm_ttft"] = sum(r["restore_cpu_s"] for r in warm) / sum(
        r["ttft_cpu_s"] for r in warm
    )
    checked = [r["bit_identical"] for r in warm if r["bit_identical"] is not None]
    out["exactness"] = {"checked": len(checked), "bit_identical": sum(checked)}
    stats = pc.offloader.stats()
    tiers = getattr(stats.manager, "tiers", None) or {}
    out["bytes"] = {
        "cpu": {"stored": stats.stored_bytes, "loaded": stats.loaded_bytes},
        **{
            name: {
                "written": int(row.get("bytes_written", 0)),
                "read": int(row.get("bytes_read", 0)),
            }
            for name, row in tiers.items()
        },
    }
    out["failed_stores"] = stats.failed_stores
    out["benefit"] = benefit(stats.manager)
    return out


_BENEFIT_KEYS = (
    "tokens_served",
    "prefill_seconds_saved",
    "load_seconds",
    "net_seconds_saved",
    "blocks_recomputed_by_choice",
)


def benefit(manager_stats: Any) -> dict[str, dict[str, float]]:
    """What each tier saved, per the tiering manager's estimate (empty without tiers)."""
    tiering = getattr(manager_stats, "tiering", None)
    if not tiering:
        return {}
    rows = {"cpu": {k: float(tiering.get(f"cpu_{k}", 0)) for k in _BENEFIT_KEYS}}
    for name, row in manager_stats.tiers.items():
        rows[name] = {k: float(row.get(k, 0)) for k in _BENEFIT_KEYS}
    return rows


def run_instance(args: argparse.Namespace, cold_path: Path | None) -> dict[str, Any]:
    """One engine: build the model, run the workload cold (unless a cold reference from an
    earlier instance is given) and warm, and summarize."""
    torch.set_num_threads(args.threads)
    model = demo_model(args)
    requests = conversations(args)
    cold_rows: list[dict[str, Any]] = []
    cold_logits: list[torch.Tensor] = []
    if cold_path is not None and cold_path.exists():
        saved = torch.load(cold_path)
        cold_logits, cold_rows = saved["logits"], saved["rows"]
    else:
        for req in requests:
            logits, wall, cpu = cold_prefill(model, req.tokens, args.block_tokens)
            cold_logits.append(logits)
            cold_rows.append({"ttft_wall_s": wall, "ttft_cpu_s": cpu})
        if cold_path is not None:
            torch.save({"logits": cold_logits, "rows": cold_rows}, cold_path)
    with PrefixCache(
        model,
        int(args.cpu_mib * 2**20),
        block_tokens=args.block_tokens,
        max_tokens=args.max_tokens,
        policy=args.policy,
        tiers=tier_config(args),
        tier_wait_s=10.0,
    ) as pc:
        warm = warm_pass(pc, requests, cold_logits)
        summary = summarize(cold_rows, warm, pc)
    summary["pid"] = os.getpid()
    summary["load_avg_1m"] = os.getloadavg()[0]
    return summary


def _print(summary: dict[str, Any], title: str) -> None:
    print(title)
    for key in ("ttft_cpu_s", "ttft_wall_s"):
        s = summary[key]
        what = "CPU" if key == "ttft_cpu_s" else "wall"
        if s["cold_median"] is not None:
            print(
                f"  TTFT {what:<4} median cold {s['cold_median']:.3f} s  warm "
                f"{s['warm_median']:.3f} s  ({s['median_ratio']:.2f}x); p90 cold "
                f"{s['cold_p90']:.3f} s  warm {s['warm_p90']:.3f} s"
            )
    for turn, t in summary["by_turn"].items():
        cold = t["cold_cpu_median_s"]
        shown = f"{cold:.3f}" if cold is not None else "-"
        print(
            f"  turn {turn}: CPU median cold {shown} s  warm {t['warm_cpu_median_s']:.3f} s  "
            f"reused {100 * t['reused_fraction']:.0f}% of prompt tokens"
        )
    print(
        f"  tokens: {summary['tokens_cold']:,} in prompts, {summary['tokens_computed']:,} "
        f"computed, {summary['tokens_reused']:,} reused"
    )
    for name, row in summary["restore_ms_per_1k_tokens"].items():
        print(
            f"  restore from {name}: {row['wall']:.1f} ms wall ({row['cpu']:.1f} CPU) per 1k "
            f"tokens over {row['requests']} requests"
        )
    share = summary["kvoffload_share_of_warm_ttft"]
    print(f"  kvoffload's share of warm TTFT (lookup, load, cache): {100 * share:.1f}%")
    ex = summary["exactness"]
    verdict = "OK" if ex["checked"] == ex["bit_identical"] else "MISMATCH"
    print(
        f"  exactness: {ex['bit_identical']}/{ex['checked']} first-token logits "
        f"bit-identical to cold ({verdict})"
    )
    for name, row in summary["bytes"].items():
        print(f"  bytes {name}: " + ", ".join(f"{k} {v:,}" for k, v in row.items()))
    for name, row in summary.get("benefit", {}).items():
        print(
            f"  saved by {name}: {int(row['tokens_served']):,} tokens served, est. "
            f"{row['prefill_seconds_saved']:.3f} s of prefill saved, "
            f"{row['load_seconds']:.3f} s loading, net {row['net_seconds_saved']:.3f} s; "
            f"{int(row['blocks_recomputed_by_choice'])} blocks recomputed by choice"
        )
    print(f"  load average (1 min) {summary['load_avg_1m']:.1f}; pid {summary['pid']}")


def run(args: argparse.Namespace) -> int:
    """The demo command's hf engine (instances after the first run as subprocesses)."""
    args.redis_namespace = args.redis_namespace or f"hf-demo-{uuid.uuid4().hex[:12]}"
    if args.format == "table":
        print(
            f"hf engine: {args.layers} layers, hidden {args.hidden}, {args.kv_heads} KV heads; "
            f"{args.conversations} conversations x {args.turns} turns; {THREADS_WHY}"
        )
    summaries = []
    with tempfile.TemporaryDirectory(prefix="kvoffload-hf-demo-") as tmp:
        cold_path = Path(tmp) / "cold.pt"
        summaries.append(run_instance(args, cold_path if args.instances > 1 else None))
        if args.format == "table":
            _print(summaries[0], "instance 1" if args.instances > 1 else "result")
        for index in range(1, args.instances):
            summary = _subprocess_instance(args, cold_path)
            summaries.append(summary)
            if args.format == "table":
                _print(summary, f"instance {index + 1} (a new process on the same Redis)")
    if args.format == "json":
        json.dump(summaries if args.instances > 1 else summaries[0], sys.stdout, indent=2)
        print()
    ok = all(s["exactness"]["checked"] == s["exactness"]["bit_identical"] for s in summaries)
    return 0 if ok and not any(s["failed_stores"] for s in summaries) else 1


def _subprocess_instance(args: argparse.Namespace, cold_path: Path) -> dict[str, Any]:
    plain = (str, int, float, bool, list, tuple, type(None))
    params = {k: v for k, v in vars(args).items() if isinstance(v, plain)}
    code = (
        "import json, sys, argparse; from pathlib import Path; "
        "from kvoffload.integrations.hf_demo import run_instance; "
        "a = argparse.Namespace(**json.loads(sys.argv[1])); "
        "print(json.dumps(run_instance(a, Path(sys.argv[2]))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(params), str(cold_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"instance process failed: {out.stderr[-2000:]}")
    summary: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    summary["by_turn"] = {int(k): v for k, v in summary["by_turn"].items()}
    return summary


__all__ = ["Request", "cold_prefill", "conversations", "demo_model", "run", "run_instance"]
