"""The ``kvoffload`` command: list policies, replay traces, compute bounds, sweep, generate.

Every command prints an aligned table (``--format table``, default) or one JSON object
(``--format json``). Errors are one line on stderr and a non-zero exit status (1; 2 for bad
usage); ``--debug`` shows the traceback instead. Long work shows a progress bar on stderr
when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from kvoffload.policies import BUILTIN_POLICIES, CachePolicyFactory, create_cache_policy
from kvoffload.sim.bounds import TraceBounds
from kvoffload.sim.capacity import CAPACITY_HELP, Capacity, parse_capacities
from kvoffload.sim.plugins import AdmissionFactory
from kvoffload.sim.records import Trace
from kvoffload.sim.replay import REPLAY_MODES, PolicySpec, ReplayOptions
from kvoffload.sim.sweep import SweepResult, run_sweep
from kvoffload.sim.traces import load_trace, trace_format_choices
from kvoffload.sim.workloads import (
    WorkloadConfig,
    config_as_dict,
    generate_workload,
    open_output,
    write_mooncake_jsonl,
)

SIMULATE_CAPACITIES = "1%,5%,25%"
SWEEP_CAPACITIES = "1%,2%,5%,10%,20%,30%,50%"
BOUNDS_CAPACITIES = "1%,5%,10%,25%"


class CLIError(Exception):
    """A user-facing error: printed as one line, exit status 1."""


# ------------------------------------------------------------------------------ arguments


def _key_values(items: Sequence[str] | None, what: str) -> dict[str, Any]:
    """``KEY=VALUE`` pairs; a VALUE that parses as JSON (numbers, true, lists) is converted."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise CLIError(f"{what} '{item}' must look like KEY=VALUE")
        try:
            value: Any = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        out[key.strip()] = value
    return out


def _add_format(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table: aligned table (default); json: one JSON object",
    )


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generated workload (when no trace is given)")
    g.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    g.add_argument("--requests", type=int, help="number of requests (default 1500)")
    g.add_argument("--arrival", choices=("poisson", "bursty"), help="arrival process")
    g.add_argument(
        "--workload-param",
        action="append",
        metavar="KEY=VALUE",
        help="any WorkloadConfig knob, e.g. think_time_s=120 (repeatable)",
    )


def _add_trace_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "trace",
        nargs="?",
        help="JSONL trace (gzip/zstd ok); omitted: the generated default workload",
    )
    g = p.add_argument_group("trace")
    g.add_argument("--trace-format", choices=trace_format_choices(), default="auto")
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
    _add_workload_args(p)


def _add_capacity_args(p: argparse.ArgumentParser, default: str) -> None:
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


def _add_replay_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("policies")
    g.add_argument(
        "--policy",
        action="append",
        metavar="NAME",
        help="policy name, 'module:Class' or 'all' (repeatable, comma-separated; "
        "default: every built-in)",
    )
    g.add_argument("--policy-module", help="module of an out-of-tree policy class named --policy")
    g.add_argument(
        "--param",
        action="append",
        metavar="KEY=VALUE",
        help="policy constructor parameter (repeatable)",
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
    g.add_argument("--prefill-tokens-per-s", type=float, default=20000.0)
    g.add_argument("--decode-tokens-per-s", type=float, default=50.0)
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
    g.add_argument("--admission-param", action="append", metavar="KEY=VALUE")
    g.add_argument("--no-bounds", action="store_true", help="skip Belady / OPT / infinite")
    g.add_argument("--workers", type=int, help="worker processes (default: one per CPU)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    g.add_argument(
        "-o",
        "--output",
        action="append",
        metavar="FILE",
        help="also write results to FILE (.json or .csv; repeatable)",
    )
    g.add_argument(
        "--plot",
        metavar="DIR",
        help="write a miss-ratio curve and per-capacity bar charts (needs matplotlib)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (the demo's own arguments are added only when it is chosen)."""
    parser = argparse.ArgumentParser(
        prog="kvoffload",
        description="KV-cache offloading: eviction policies, trace replay and optimal bounds.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors"
    )

    p = sub.add_parser(
        "policies", parents=[common], help="list the cache policies resolvable by name"
    )
    _add_format(p)

    p = sub.add_parser(
        "simulate",
        parents=[common],
        help="replay a trace (default: a generated workload) through policies",
        description="Replay a trace through policies and show each next to the optimal bounds. "
        "With no arguments: the generated default workload, every built-in policy, "
        f"capacities {SIMULATE_CAPACITIES}.",
    )
    _add_trace_args(p)
    _add_capacity_args(p, SIMULATE_CAPACITIES)
    _add_replay_args(p)
    _add_format(p)

    p = sub.add_parser(
        "sweep", parents=[common], help="policies x capacities grid with JSON/CSV output and plots"
    )
    _add_trace_args(p)
    _add_capacity_args(p, SWEEP_CAPACITIES)
    _add_replay_args(p)
    _add_format(p)

    p = sub.add_parser(
        "bounds", parents=[common], help="infinite-cache, Belady MIN and OPT-with-bypass hit ratios"
    )
    _add_trace_args(p)
    _add_capacity_args(p, BOUNDS_CAPACITIES)
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    _add_format(p)

    p = sub.add_parser(
        "generate", parents=[common], help="write the generated workload as Mooncake JSONL"
    )
    _add_workload_args(p)
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="output file (.gz / .zst compress); default: stdout, no summary",
    )
    p.add_argument(
        "--strict-mooncake",
        action="store_true",
        help="only the four Mooncake fields (no session_id / category)",
    )
    _add_format(p)

    sub.add_parser(
        "demo", parents=[common], help="move real KV blocks GPU<->CPU with a policy (needs PyTorch)"
    )
    return parser


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("kvoffload")
    except Exception:  # running from a source tree without metadata
        return "unknown"


# ------------------------------------------------------------------------------ inputs


def _workload_config(args: argparse.Namespace) -> WorkloadConfig:
    knobs = {f.name: f for f in fields(WorkloadConfig)}
    overrides = _key_values(args.workload_param, "--workload-param")
    for key, value in list(overrides.items()):
        if key not in knobs:
            raise CLIError(f"unknown workload knob '{key}'; known: {', '.join(knobs)}")
        default = getattr(WorkloadConfig, key)
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            overrides[key] = float(value)
        elif type(value) is not type(default):
            raise CLIError(f"workload knob '{key}' takes a {type(default).__name__}, got {value!r}")
    overrides["seed"] = args.seed
    if args.requests is not None:
        overrides["requests"] = args.requests
    if args.arrival is not None:
        overrides["arrival"] = args.arrival
    return WorkloadConfig(**overrides)


def _load_input(args: argparse.Namespace) -> Trace:
    if args.trace is None:
        if getattr(args, "max_requests", None) is not None:
            raise CLIError("--max-requests applies to a trace file; use --requests instead")
        cfg = _workload_config(args)
        if getattr(args, "block_tokens", None) is not None:
            cfg = replace(cfg, block_tokens=args.block_tokens)
        return generate_workload(cfg)
    if args.workload_param or args.requests is not None or args.arrival is not None:
        raise CLIError("workload options (--requests, --arrival, --workload-param) need no trace")
    if not Path(args.trace).exists():
        raise CLIError(f"trace file not found: {args.trace}")
    trace = load_trace(
        args.trace, args.trace_format, args.block_tokens, args.skip_bad_lines, args.max_requests
    )
    if trace.skipped_lines:
        print(
            f"kvoffload: skipped {trace.skipped_lines} malformed line(s); first: "
            f"{trace.first_skip_error}",
            file=sys.stderr,
        )
    return trace


def _capacities(args: argparse.Namespace, trace: Trace, default: str) -> list[Capacity]:
    caps = parse_capacities(
        args.capacity or [default],
        trace.num_unique_blocks,
        trace.block_tokens,
        args.bytes_per_token,
    )
    for cap in caps:
        if cap.blocks < 0:
            raise CLIError(f"capacity '{cap.label}' is negative")
    return caps


def _policies(args: argparse.Namespace) -> list[PolicySpec]:
    names: list[str] = []
    for item in args.policy or [",".join(name for name, *_ in BUILTIN_POLICIES)]:
        for name in item.split(","):
            name = name.strip()
            if name == "all":
                names.extend(CachePolicyFactory.registered_names())
            elif name:
                names.append(name)
    names = list(dict.fromkeys(names))
    if not names:
        raise CLIError("no policy given")
    params = _key_values(args.param, "--param")
    specs = [PolicySpec.of(name, args.policy_module, params) for name in names]
    for spec in specs:  # fail here, with one clear line, rather than in a worker
        create_cache_policy(spec.name, 1, spec.module_path, dict(spec.params))
    return specs


def _replay_options(args: argparse.Namespace) -> ReplayOptions:
    admission = None
    if args.admission:
        params = _key_values(args.admission_param, "--admission-param")
        admission = AdmissionFactory(args.admission, tuple(sorted(params.items())))
        admission()  # validate now
    elif args.admission_param:
        raise CLIError("--admission-param needs --admission")
    return ReplayOptions(
        mode=args.mode,
        overlap=args.overlap,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        decode_tokens_per_s=args.decode_tokens_per_s,
        bytes_per_token=args.bytes_per_token,
        store_threshold=args.store_threshold,
        skip_partial_tail=args.skip_partial_tail,
        partial_store=args.partial_store,
        admission=admission,
    )


def _progress(enabled: bool) -> Any:
    """A rich progress bar on stderr, or a no-op stand-in."""
    if not enabled or not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )


def _run_grid(
    args: argparse.Namespace, trace: Trace, default_caps: str
) -> tuple[SweepResult, list[Capacity]]:
    policies = _policies(args)
    options = _replay_options(args)
    capacities = _capacities(args, trace, default_caps)
    progress = _progress(not args.no_progress)
    state: dict[str, Any] = {}

    def started(total: int) -> None:
        if progress is not None:
            progress.start()
            state["task"] = progress.add_task("simulating", total=total)

    def done(label: str) -> None:
        if progress is not None:
            progress.update(state["task"], advance=1, description=label)

    try:
        result = run_sweep(
            trace,
            policies,
            capacities,
            options,
            with_bounds=not args.no_bounds,
            workers=args.workers,
            on_task_done=done,
            on_started=started,
        )
    finally:
        if progress is not None:
            progress.stop()
    return result, capacities


# ------------------------------------------------------------------------------ output


def _emit_json(obj: Any) -> None:
    from kvoffload.sim.report import dump_json

    dump_json(obj, sys.stdout)


def _print_table(*renderables: Any) -> None:
    from kvoffload.sim.report import stdout_console

    console = stdout_console()
    for item in renderables:
        console.print(item, highlight=False, soft_wrap=isinstance(item, str))


def _trace_caption(trace: Trace, extra: str = "") -> str:
    return (
        f"{trace.source}: {len(trace.requests):,} requests, {trace.block_accesses:,} block "
        f"accesses, {trace.num_unique_blocks:,} unique blocks of {trace.block_tokens} tokens"
        + (f"; {extra}" if extra else "")
    )


def _write_outputs(args: argparse.Namespace, trace: Trace, sweep: SweepResult) -> None:
    from kvoffload.sim.report import dump_json, write_results_csv

    for name in args.output or ():
        path = Path(name)
        if path.suffix == ".csv":
            with path.open("w", newline="") as out:
                write_results_csv(sweep.results, sweep.bounds, out)
        elif path.suffix == ".json":
            with path.open("w") as out:
                dump_json(_grid_json(trace, sweep), out)
        else:
            raise CLIError(f"--output '{name}': use a .json or .csv file name")
    if args.plot:
        from kvoffload.sim.plot import plot_capacity_bars, plot_miss_ratio_curves

        directory = Path(args.plot)
        directory.mkdir(parents=True, exist_ok=True)
        title = Path(trace.source).name if args.trace else "generated workload"
        plot_miss_ratio_curves(
            sweep.results, sweep.bounds, directory / "miss_ratio_curve.png", title
        )
        plot_capacity_bars(sweep.results, sweep.bounds, directory, title)


def _grid_json(trace: Trace, sweep: SweepResult) -> dict[str, Any]:
    return {
        "trace": trace.describe(),
        "results": [r.to_dict() for r in sweep.results],
        "bounds": [b.to_dict() for b in sweep.bounds],
    }


# ------------------------------------------------------------------------------ commands


def cmd_policies(args: argparse.Namespace) -> int:
    infos = CachePolicyFactory.describe_cache_policies()
    if args.format == "json":
        _emit_json({"policies": [info.__dict__ for info in infos]})
        return 0
    from rich.table import Table

    table = Table(header_style="bold")
    for column in ("name", "description", "source", "target"):
        table.add_column(column)
    for info in infos:
        table.add_row(info.name, info.description, info.source, info.target)
    _print_table(table)
    return 0


def _cmd_grid(args: argparse.Namespace, default_caps: str) -> int:
    trace = _load_input(args)
    sweep, _ = _run_grid(args, trace, default_caps)
    _write_outputs(args, trace, sweep)
    if args.format == "json":
        if len(sweep.results) == 1:
            record = sweep.results[0].to_dict()
            record["bounds"] = sweep.bounds[0].to_dict() if sweep.bounds else None
            record["trace"] = trace.describe()
            _emit_json(record)
        else:
            _emit_json(_grid_json(trace, sweep))
        return 0
    from kvoffload.sim.report import results_table

    mode = args.mode + (", overlapped" if args.overlap else "")
    _print_table(_trace_caption(trace, f"mode {mode}"), results_table(sweep.results, sweep.bounds))
    return 0


def cmd_simulate(args: argparse.Namespace) -> int:
    return _cmd_grid(args, SIMULATE_CAPACITIES)


def cmd_sweep(args: argparse.Namespace) -> int:
    return _cmd_grid(args, SWEEP_CAPACITIES)


def cmd_bounds(args: argparse.Namespace) -> int:
    trace = _load_input(args)
    capacities = _capacities(args, trace, BOUNDS_CAPACITIES)
    trace_bounds = TraceBounds(trace)
    progress = _progress(not args.no_progress)
    if progress is None:
        bounds = [trace_bounds.at(c.blocks) for c in capacities]
    else:
        with progress:
            task = progress.add_task("bounds", total=len(capacities))
            bounds = []
            for capacity in capacities:
                progress.update(task, description=f"bounds @ {capacity.label}")
                bounds.append(trace_bounds.at(capacity.blocks))
                progress.advance(task)
    if args.format == "json":
        if len(bounds) == 1:
            _emit_json(
                {**bounds[0].to_dict(), "capacity": capacities[0].label, "trace": trace.describe()}
            )
        else:
            _emit_json(
                {
                    "trace": trace.describe(),
                    "bounds": [
                        {**b.to_dict(), "capacity": c.label}
                        for b, c in zip(bounds, capacities, strict=True)
                    ],
                }
            )
        return 0
    from kvoffload.sim.report import bounds_table

    _print_table(_trace_caption(trace), bounds_table(bounds, [c.label for c in capacities]))
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    cfg = _workload_config(args)
    trace = generate_workload(cfg)
    if not args.output or args.output == "-":
        write_mooncake_jsonl(trace, sys.stdout, extra_fields=not args.strict_mooncake)
        return 0
    with open_output(args.output) as out:
        write_mooncake_jsonl(trace, out, extra_fields=not args.strict_mooncake)
    summary = {
        **trace.describe(),
        "source": args.output,
        "tokens": trace.total_tokens,
        "duration_s": trace.requests[-1].timestamp_s,
        "config": config_as_dict(cfg),
    }
    if args.format == "json":
        _emit_json(summary)
        return 0
    from kvoffload.sim.report import key_value_table

    rows = [(k, v) for k, v in summary.items() if k != "config"]
    _print_table(key_value_table(rows, title=f"wrote {args.output}"))
    return 0


def _demo_module() -> Any:
    try:
        return importlib.import_module("kvoffload.transfer.demo")
    except ImportError as exc:
        missing = exc.name or ""
        if missing == "torch" or missing.startswith("torch."):
            raise CLIError("kvoffload demo needs PyTorch: pip install 'kvoffload[torch]'") from exc
        if missing in ("kvoffload.transfer", "kvoffload.transfer.demo"):
            raise CLIError(
                "kvoffload demo is not available: kvoffload.transfer.demo is missing "
                "from this installation"
            ) from exc
        raise


COMMANDS = {
    "policies": cmd_policies,
    "simulate": cmd_simulate,
    "sweep": cmd_sweep,
    "bounds": cmd_bounds,
    "generate": cmd_generate,
}


def _chosen_command(argv: Sequence[str]) -> str | None:
    for arg in argv:
        if not arg.startswith("-"):
            return arg
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvoffload`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    parser = build_parser()
    try:
        demo = None
        if _chosen_command(argv) == "demo":
            demo = _demo_module()
            subparsers = next(
                a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
            )
            demo.add_arguments(subparsers.choices["demo"])
        args = parser.parse_args(argv)
        if args.command == "demo":
            assert demo is not None
            return int(demo.run(args))
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("kvoffload: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except (CLIError, ValueError, TypeError, ImportError, OSError, RuntimeError) as exc:
        if debug:
            raise
        print(f"kvoffload: error: {_one_line(exc)}", file=sys.stderr)
        return 1


def _one_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
