"""Argument groups shared by several commands, and ``KEY=VALUE`` parsing."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from kvoffload.cli.errors import UserError
from kvoffload.sim.capacity import CAPACITY_HELP
from kvoffload.sim.replay import REPLAY_MODES
from kvoffload.sim.tier_config import TIERS_HELP, simulated_write_policies
from kvoffload.sim.traces import trace_format_choices


def key_values(items: Sequence[str] | None, what: str) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; a VALUE that parses as JSON (numbers, true, lists) is converted."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{what} '{item}' must look like KEY=VALUE")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip()] = value
    return out


def add_format(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table: aligned table (default); json: one JSON object (needs no extras)",
    )


def add_workload(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generated workload (when no trace is given)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    g.add_argument("--requests", type=int, help="number of requests (default 1500)")
    g.add_argument(
        "--arrival", choices=("poisson", "bursty"), help="arrival process (default poisson)"
    )
    g.add_argument(
        "--workload-param",
        action="append",
        metavar="KEY=VALUE",
        help="any WorkloadConfig knob, e.g. think_time_s=120 (repeatable)",
    )


def add_trace(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "trace",
        nargs="?",
        help="JSONL trace (gzip/zstd ok); omitted: the generated default workload",
    )
    g = p.add_argument_group("trace")
    g.add_argument(
        "--trace-format",
        choices=trace_format_choices(),
        default="auto",
        help="trace format (default auto: detected from the first record)",
    )
    g.add_argument(
        "--block-tokens",
        type=int,
        help="tokens per block (default 512; LMCache logs: their chunk_size)",
    )
    g.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="skip and count malformed lines instead of failing",
    )
    g.add_argument("--max-requests", type=int, help="read only the first N requests")
    add_workload(p)


def add_capacity(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument(
        "--capacity",
        action="append",
        metavar="SPEC",
        help=f"{CAPACITY_HELP} (default {default.replace('%', '%%')})",
    )
    p.add_argument(
        "--bytes-per-token",
        type=float,
        help="KV bytes per token, for byte capacities and byte counts",
    )


def add_tiers(p: argparse.ArgumentParser) -> None:
    """``--tiers``: replay through the tiering manager with simulated secondary tiers."""
    g = p.add_argument_group("tiers (multi-tier replay)")
    g.add_argument(
        "--tiers",
        action="append",
        metavar="SPEC",
        help=TIERS_HELP + "; repeatable: each SPEC is one column of the grid; replaces "
        "--capacity, implies --no-bounds",
    )
    g.add_argument(
        "--instances",
        type=int,
        default=1,
        help="with --tiers: split the requests round-robin over N CPU tiers (each of the cpu "
        "capacity); shared tiers (redis) are one store behind all of them (default 1)",
    )
    g.add_argument(
        "--tier-policy",
        default="lru",
        metavar="NAME",
        help="with --tiers: eviction policy of every secondary tier (default lru)",
    )
    g.add_argument(
        "--tier-write-policy",
        default="write_through",
        choices=simulated_write_policies(),
        help="with --tiers: when the secondaries get the CPU's blocks: after each CPU store "
        "(write_through, the default), when the CPU evicts them (write_back), or on their "
        "second offer (selective)",
    )


def add_measure(p: argparse.ArgumentParser) -> None:
    """Warm-up and windows: which requests the figures count (the cache sees them all)."""
    g = p.add_argument_group("warm-up and windows")
    g.add_argument(
        "--warmup-requests",
        type=int,
        default=0,
        metavar="N",
        help="leave the first N requests out of the figures (the cache still sees them)",
    )
    g.add_argument(
        "--warmup-s",
        type=float,
        default=0.0,
        metavar="T",
        help="leave the requests of the first T seconds of trace time out of the figures",
    )
    g.add_argument(
        "--window-s",
        type=float,
        metavar="W",
        help="also report the figures per window of W seconds of trace time",
    )
    g.add_argument(
        "--windows-output",
        metavar="FILE",
        help="with --window-s: write the per-window figures to FILE (.json or .csv)",
    )


def add_progress(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def add_replay(p: argparse.ArgumentParser) -> None:
    """Policies, replay model and outputs of ``simulate`` and ``sweep``."""
    g = p.add_argument_group("policies")
    g.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help="policy name, 'module:Class' or 'all' (repeatable, comma-separated; "
        "default: every built-in but 'auto', which runs when named)",
    )
    g.add_argument("--policy-module", help="module of an out-of-tree policy class named --policy")
    g.add_argument(
        "--param",
        action="append",
        metavar="[POLICY.]KEY=VALUE",
        help="policy constructor parameter (repeatable): 2q.a_in_ratio=0.3 for one policy; "
        "a bare KEY=VALUE goes to every listed policy that accepts KEY",
    )
    g = p.add_argument_group("replay")
    g.add_argument(
        "--mode",
        choices=REPLAY_MODES,
        default="prefix",
        help="prefix: engine call sequence per request (default); "
        "blocks: every block an independent access (libCacheSim's model)",
    )
    g.add_argument(
        "--overlap",
        action="store_true",
        help="run requests concurrently by timestamp; running requests pin blocks",
    )
    g.add_argument(
        "--prefill-tokens-per-s",
        type=float,
        default=20000.0,
        help="prefill speed of the --overlap model and of --tiers' time saved (default 20000)",
    )
    g.add_argument(
        "--decode-tokens-per-s",
        type=float,
        default=50.0,
        help="decode speed of the --overlap model (default 50)",
    )
    g.add_argument(
        "--store-threshold",
        type=int,
        default=0,
        help="admit a block on its N-th store offer (0: store everything)",
    )
    g.add_argument(
        "--skip-partial-tail",
        action="store_true",
        help="never store a request's last, partial block",
    )
    g.add_argument(
        "--partial-store",
        action="store_true",
        help="store the longest prefix that fits instead of nothing",
    )
    g.add_argument("--admission", metavar="MODULE:CLASS", help="extra admission filter class")
    g.add_argument(
        "--admission-param",
        action="append",
        metavar="KEY=VALUE",
        help="constructor parameter of the --admission class (repeatable)",
    )
    g.add_argument("--no-bounds", action="store_true", help="skip Belady / OPT / infinite")
    g.add_argument("--workers", type=int, help="worker processes (default: one per CPU)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    g = p.add_argument_group("output")
    g.add_argument(
        "--timing",
        action="store_true",
        help="also report wall time (blocks/s column, elapsed_s in JSON/CSV); off by "
        "default so two runs give the same output",
    )
    g.add_argument(
        "-o",
        "--output",
        action="append",
        metavar="FILE",
        help="also write results to FILE (.json or .csv; repeatable; checked before the run)",
    )
    g.add_argument(
        "--plot",
        metavar="DIR",
        help="write a hit-ratio curve and per-capacity bar charts to DIR (needs matplotlib); "
        "the curve shows the best few policies, lru and the bounds",
    )
    g.add_argument(
        "--all-policies",
        action="store_true",
        help="with --plot: draw every policy's curve, not only the best few",
    )


__all__ = [
    "add_capacity",
    "add_format",
    "add_measure",
    "add_progress",
    "add_replay",
    "add_tiers",
    "add_trace",
    "add_workload",
    "key_values",
]
