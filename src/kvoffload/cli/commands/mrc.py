"""``kvoffload mrc``: hit-ratio curves in one pass (exact LRU, sampled for any policy)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvoffload.cli import args as cli_args
from kvoffload.cli import inputs, output
from kvoffload.cli.errors import UserError
from kvoffload.sim.capacity import Capacity
from kvoffload.sim.mrc import Curves, exact_lru_curve, replayed_curve, sampled_curve
from kvoffload.sim.records import Trace

NAME = "mrc"
CAPACITIES = "1%,2%,5%,10%,20%,30%,50%"
HELP = "hit-ratio curves in one pass: exact LRU, sampled (SHARDS) for any policy"
DESCRIPTION = (
    "Hit-ratio curves at many capacities without a replay per capacity. LRU in blocks mode "
    "is exact (stack distances, one pass; block, prefix, token and request hit ratios); "
    "every other policy (and LRU with --sampled) runs as SHARDS-sampled miniatures with an "
    "error estimate, by default corrected with LRU as a control variate (--lru-control) and "
    "with the sample bounded (--max-sampled-blocks, --max-blocks); --mode prefix replays "
    "LRU at each capacity (prefix mode is not a stack algorithm). Default capacities "
    f"{CAPACITIES.replace('%', '%%')} of the unique blocks, or --points N."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_trace(parser)
    cli_args.add_capacity(parser, CAPACITIES)
    g = parser.add_argument_group("curves")
    g.add_argument(
        "--points",
        type=int,
        metavar="N",
        help="N capacities spaced evenly on a log scale from 0.1%% to 100%% of the unique "
        "blocks (instead of --capacity)",
    )
    g.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help="policies (comma-separated, repeatable; 'module:Class' works; default lru)",
    )
    g.add_argument("--policy-module", help="module of an out-of-tree policy class named --policy")
    g.add_argument(
        "--param",
        action="append",
        metavar="[POLICY.]KEY=VALUE",
        help="policy constructor parameter (as in simulate)",
    )
    g.add_argument(
        "--mode",
        choices=("blocks", "prefix"),
        default="blocks",
        help="blocks: every block an independent access (default; LRU exact); prefix: the "
        "engine's call sequence (LRU replayed per capacity, others sampled)",
    )
    g.add_argument(
        "--sampled", action="store_true", help="sample LRU too (to compare with the exact curve)"
    )
    g.add_argument(
        "--sample-rate",
        type=float,
        default=0.01,
        help="SHARDS fixed rate: share of the blocks sampled (default 0.01)",
    )
    g.add_argument(
        "--sample-blocks",
        type=int,
        default=256,
        help="fixed size: raise the rate so each miniature holds at least this many blocks "
        "(default 256; 0: the fixed rate everywhere)",
    )
    g.add_argument(
        "--max-sampled-blocks",
        type=int,
        default=32768,
        metavar="N",
        help="SHARDS fixed-size: lower the rate so the sample holds about N of the trace's "
        "distinct blocks, so the time stops growing with the trace (default 32768; 0: no "
        "bound, the rate everywhere)",
    )
    g.add_argument(
        "--max-blocks",
        type=int,
        default=2048,
        metavar="N",
        help="largest miniature: lower the rate of a capacity whose miniature would hold more "
        "than N blocks (default 2048; 0: no bound)",
    )
    g.add_argument(
        "--lru-control",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="LRU as a control variate (blocks mode): every sample also runs LRU, and its "
        "error against the exact LRU curve is taken off every policy's estimate of that "
        "sample (method 'sampled+lru'; LRU itself then reads exact). Default: on in blocks "
        "mode unless --sampled (which is there to show the sampling error); "
        "--no-lru-control gives the plain estimate (method 'sampled')",
    )
    g.add_argument(
        "--salts",
        type=int,
        default=2,
        help="independent samples per point: the curve is their mean, the error estimate its "
        "standard error (default 2; 1: no estimate)",
    )
    cli_args.add_measure(parser)
    cli_args.add_format(parser)
    g = parser.add_argument_group("output")
    g.add_argument("--timing", action="store_true", help="also report the time taken")
    g.add_argument(
        "-o",
        "--output",
        action="append",
        metavar="FILE",
        help="also write the points to FILE (.json or .csv; repeatable)",
    )
    g.add_argument(
        "--plot",
        metavar="DIR",
        help="write hit_ratio_curve.png (and hit_ratio_over_time.png with --window-s) to DIR",
    )


def _capacities(args: argparse.Namespace, trace: Trace) -> list[Capacity]:
    if args.points is None:
        return inputs.capacities(args, trace, CAPACITIES)
    if args.capacity:
        raise UserError("--points replaces --capacity: give one of them")
    if args.points < 1:
        raise UserError(f"--points must be >= 1, got {args.points}")
    unique = trace.num_unique_blocks
    out: list[Capacity] = []
    seen: set[int] = set()
    for i in range(args.points):
        share = 0.001 * (1000 ** (i / (args.points - 1))) if args.points > 1 else 1.0
        blocks = max(1, round(unique * share))
        if blocks not in seen:
            seen.add(blocks)
            out.append(Capacity(f"{share * 100:.3g}%", blocks))
    return out


def compute(args: argparse.Namespace, trace: Trace) -> Curves:
    """The curves the arguments ask for (exact, replayed and sampled points together)."""
    if args.salts < 1 or args.salts > 255:
        raise UserError(f"--salts must be in 1..255, got {args.salts}")
    if not 0 < args.sample_rate <= 1:
        raise UserError(f"--sample-rate must be in (0, 1], got {args.sample_rate}")
    if args.sample_blocks < 0:
        raise UserError(f"--sample-blocks must be >= 0, got {args.sample_blocks}")
    bounds: dict[str, int | None] = {}
    for flag, value in (
        ("max_sampled_blocks", args.max_sampled_blocks),
        ("max_blocks", args.max_blocks),
    ):
        if value and value < max(1, args.sample_blocks):
            raise UserError(
                f"--{flag.replace('_', '-')} must be 0 (no bound) or >= --sample-blocks "
                f"({args.sample_blocks}), got {value}"
            )
        if value is not None and value < 0:
            raise UserError(f"--{flag.replace('_', '-')} must be >= 0, got {value}")
        bounds[flag] = value or None
    lru_control = args.lru_control
    if lru_control is None:
        lru_control = args.mode == "blocks" and not args.sampled
    elif lru_control and args.mode != "blocks":
        raise UserError(
            "--lru-control needs --mode blocks (the exact LRU curve it corrects against is "
            "blocks mode)"
        )
    if args.policy is None:
        args.policy = ["lru"]
    specs = inputs.policies(args)
    capacities = _capacities(args, trace)
    measure = inputs.measure(args)
    per_block = None if args.bytes_per_token is None else args.bytes_per_token * trace.block_tokens
    exact = [s for s in specs if s.name == "lru" and not s.params and not args.sampled]
    sampled = [s for s in specs if s not in exact]
    parts: list[Curves] = []
    try:
        if exact and args.mode == "blocks":
            parts.append(exact_lru_curve(trace, capacities, measure, per_block))
        elif exact:
            from kvoffload.sim.replay import ReplayOptions

            options = ReplayOptions(bytes_per_token=args.bytes_per_token)
            parts.append(replayed_curve(trace, capacities, "lru", options, measure))
        if sampled:
            if measure.window_s is not None:
                raise UserError(
                    "--window-s gives per-window figures for exact LRU only; sampled curves "
                    "(other policies, --sampled) have none: drop one of them"
                )
            parts.append(
                sampled_curve(
                    trace,
                    capacities,
                    sampled,
                    args.mode,
                    args.sample_rate,
                    args.sample_blocks,
                    args.salts,
                    measure,
                    max_sampled_blocks=bounds["max_sampled_blocks"],
                    max_blocks=bounds["max_blocks"],
                    lru_control=lru_control,
                )
            )
    except (ValueError, TypeError) as exc:
        raise UserError(str(exc)) from None
    return Curves(
        [p for c in parts for p in c.points],
        [p for c in parts for p in c.windows],
        args.mode,
        measure,
        sum(c.elapsed_s for c in parts),
    )


def run(args: argparse.Namespace) -> int:
    output.check_outputs(args.output, args.plot)
    if args.windows_output:
        output.check_outputs([args.windows_output], None)
    trace = inputs.load_input(args)
    curves = compute(args, trace)
    from kvoffload.sim.report.curves import (
        curves_record,
        plot_curves,
        plot_windows,
        write_curves_csv,
    )

    record = curves_record(trace.describe(), curves, args.timing)
    if args.format == "json":
        output.emit_json(record)
    else:
        tables = output.tables()
        items: list[object] = [
            output.trace_caption(trace, f"mode {args.mode}"),
            tables.curves_table(curves.points),
            "exact: LRU from stack distances (equal to simulate --mode blocks); replay: one "
            "prefix-mode replay per capacity; sampled: SHARDS miniatures at capacity x rate "
            "(block hit ratio only); sampled+lru: the same, less the sampled LRU's error "
            "against the exact LRU curve (--lru-control); ± est: standard error over --salts "
            "samples. req full / req any: requests whose whole prompt / first block hit.",
        ]
        if curves.windows:
            items.append(tables.curves_table(curves.windows, title="per window (by start)"))
        if args.timing:
            items.append(f"computed in {curves.elapsed_s:.2f} s")
        output.print_rich(*items)
    errors: list[str] = []
    for name in args.output or ():
        path = Path(name)
        try:
            with path.open("w", newline="") as out:
                if path.suffix == ".csv":
                    write_curves_csv(curves.points + curves.windows, out)
                else:
                    from kvoffload.sim.report import dump_json

                    dump_json(record, out)
        except OSError as exc:
            errors.append(f"--output '{name}' was not written: {exc.strerror or exc}")
    if args.windows_output:
        path = Path(args.windows_output)
        with path.open("w", newline="") as out:
            if path.suffix == ".csv":
                write_curves_csv(curves.windows, out)
            else:
                from kvoffload.sim.report import dump_json

                dump_json({"windows": [p.to_dict() for p in curves.windows]}, out)
    if args.plot:
        title = (args.trace and args.trace.rsplit("/", 1)[-1]) or "generated workload"
        directory = Path(args.plot)
        plot_curves(curves, directory / "hit_ratio_curve.png", title)
        if curves.windows:
            plot_windows(curves.windows, directory / "hit_ratio_over_time.png", title)
    for line in errors:
        print(f"kvoffload: error: {line}", file=sys.stderr)
    return 1 if errors else 0
