"""``kvoffload generate``: the generated workload as a Mooncake JSONL file."""

from __future__ import annotations

import argparse
import sys

from kvoffload.cli import args as cli_args
from kvoffload.cli import inputs, output
from kvoffload.cli.errors import UserError
from kvoffload.sim.workloads import (
    config_as_dict,
    generate_workload,
    open_output,
    write_mooncake_jsonl,
)

NAME = "generate"
HELP = "write the generated workload as Mooncake JSONL"
DESCRIPTION = (
    "Write the simulator's generated workload (the one simulate replays with no trace) as "
    "Mooncake JSONL, to a file (.gz / .zst compress) or stdout."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli_args.add_workload(parser)
    parser.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="output file (.gz / .zst compress); default: stdout, no summary",
    )
    parser.add_argument(
        "--strict-mooncake",
        action="store_true",
        help="only the four Mooncake fields (no session_id / category)",
    )
    cli_args.add_format(parser)


def run(args: argparse.Namespace) -> int:
    cfg = inputs.workload_config(args)
    trace = generate_workload(cfg)
    if not args.output or args.output == "-":
        write_mooncake_jsonl(trace, sys.stdout, extra_fields=not args.strict_mooncake)
        return 0
    try:
        with open_output(args.output) as out:
            write_mooncake_jsonl(trace, out, extra_fields=not args.strict_mooncake)
    except (OSError, ImportError) as exc:
        raise UserError(f"--output '{args.output}': {exc}") from None
    summary = {
        **trace.describe(),
        "source": args.output,
        "tokens": trace.total_tokens,
        # Milliseconds are the trace's own resolution (Mooncake timestamps).
        "duration_s": round(trace.requests[-1].timestamp_s, 3),
        "config": config_as_dict(cfg),
    }
    if args.format == "json":
        output.emit_json(summary)
        return 0
    # A generated trace skips no lines: an empty "first_skip_error" row says nothing.
    rows = [(k, v) for k, v in summary.items() if k != "config" and v is not None]
    output.print_rich(output.tables().key_value_table(rows, title=f"wrote {args.output}"))
    return 0
