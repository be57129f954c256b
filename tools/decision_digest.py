"""One digest of every built-in policy's decisions: a refactor that keeps it kept them all.

Replays every built-in policy in ``prefix``, overlapped prefix and ``blocks`` modes at 1%, 5%
and 10% of unique blocks on the shared trace (when it is there) and on three generated
workloads, and hashes (sha256) every replay's hit, store and eviction counts. Only the public
simulator API is used (``load_trace``, ``generate_workload``, ``run_sweep``), so the script
survives refactors of what it checks.

    python tools/decision_digest.py [TRACE] [--table] [--exclude 2q]

``TRACE`` defaults to ``$KVOFFLOAD_TRACE``, then ``../shared/traces/mooncake_synthetic_trace.jsonl``
in a folder above the checkout; when it is absent the shared-trace rows are skipped (and the digest
says so: it is then a different digest). ``--exclude`` drops policies from the digest (e.g.
one whose decisions a change means to alter); each policy's own digest is printed too.

Baseline at ``d161bae`` (before the base-owned table), with the shared trace, 648 replays:
    all policies:      f9993aaa62e9dcbe7ddcffb366331569a540a73c264f8d1143155deff48fecc9
    without 2q:        2638fb3ba24bf27fd195151b6347d1b46b7f244e95151b8532165cd0362ee654
(2Q's decisions changed on purpose afterwards: a pin is not an access; see ``twoq.py``.)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from kvoffload.policies import BUILTIN_POLICIES
from kvoffload.sim.capacity import parse_capacities
from kvoffload.sim.records import Trace
from kvoffload.sim.replay import PolicySpec, ReplayOptions, ReplayResult
from kvoffload.sim.sweep import run_sweep
from kvoffload.sim.traces import load_trace
from kvoffload.sim.workloads import WorkloadConfig, generate_workload

CAPACITIES = "1%,5%,10%"
MODES: tuple[tuple[str, ReplayOptions], ...] = (
    ("prefix", ReplayOptions()),
    ("overlap", ReplayOptions(overlap=True)),
    ("blocks", ReplayOptions(mode="blocks")),
)
WORKLOADS: tuple[tuple[str, WorkloadConfig], ...] = (
    ("gen-poisson", WorkloadConfig(seed=1, requests=500)),
    ("gen-bursty", WorkloadConfig(seed=2, requests=500, arrival="bursty")),
    (
        "gen-agents",
        WorkloadConfig(seed=3, requests=500, chat_weight=0.3, oneoff_weight=0.2, agent_weight=0.5),
    ),
)
FIELDS = (
    "block_hits",
    "prefix_hit_blocks",
    "token_hits",
    "pending_hits",
    "stored_blocks",
    "evictions",
    "store_failures",
    "store_failed_blocks",
)


def default_trace() -> Path:
    """``$KVOFFLOAD_TRACE``, else the shared trace beside the checkout."""
    env = os.environ.get("KVOFFLOAD_TRACE")
    if env:
        return Path(env)
    relative = Path("shared", "traces", "mooncake_synthetic_trace.jsonl")
    here = Path(__file__).resolve().parent
    for folder in here.parents:
        if (folder / relative).exists():
            return folder / relative
    return here.parent.parent / relative


def row(trace_name: str, mode: str, result: ReplayResult) -> str:
    """One replay's counts as a stable text line (what the digest hashes)."""
    counts = " ".join(f"{name}={getattr(result, name)}" for name in FIELDS)
    return f"{trace_name} {mode} {result.policy} {result.capacity_blocks} {counts}"


def replay_all(name: str, trace: Trace, policies: Sequence[str]) -> list[tuple[str, str]]:
    """(policy, row) for every mode and capacity on one trace."""
    capacities = parse_capacities(CAPACITIES, trace.num_unique_blocks, trace.block_tokens)
    specs = [PolicySpec(p) for p in policies]
    out: list[tuple[str, str]] = []
    for mode, options in MODES:
        sweep = run_sweep(trace, specs, capacities, options, with_bounds=False)
        out.extend((r.policy, row(name, mode, r)) for r in sweep.results)
        print(f"  {name} {mode}: {len(sweep.results)} replays", file=sys.stderr)
    return out


def digest(lines: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", nargs="?", type=Path, default=None, help="Mooncake trace")
    parser.add_argument("--table", action="store_true", help="print every replay's counts")
    parser.add_argument("--exclude", default="", help="comma-separated policies to leave out")
    args = parser.parse_args(argv)
    excluded = {p.strip() for p in args.exclude.split(",") if p.strip()}
    policies = [r[0] for r in BUILTIN_POLICIES if r[0] not in excluded]
    traces: list[tuple[str, Trace]] = []
    path: Path = args.trace or default_trace()
    if path.exists():
        traces.append(("shared", load_trace(path)))
    else:
        print(f"note: no trace at {path}; shared-trace rows skipped", file=sys.stderr)
    traces.extend((name, generate_workload(cfg)) for name, cfg in WORKLOADS)
    rows: list[tuple[str, str]] = []
    for name, trace in traces:
        rows.extend(replay_all(name, trace, policies))
    if args.table:
        for _, line in sorted(rows, key=lambda r: r[1]):
            print(line)
    for policy in policies:
        print(f"{policy:<12} {digest([line for p, line in rows if p == policy])}")
    for name, _ in traces:
        own = [line for _, line in rows if line.startswith(name + " ")]
        print(f"trace {name:<12} {digest(own)}")
    scope = "+".join(name for name, _ in traces)
    left_out = f", without {','.join(sorted(excluded))}" if excluded else ""
    print(f"digest ({scope}; {len(rows)} replays{left_out}): {digest([r[1] for r in rows])}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
