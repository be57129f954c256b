"""``kvoffload demo``: real KV blocks GPU<->CPU through a policy, every loaded byte checked.

The options are declared here, without PyTorch, so ``kvoffload demo --help`` works on a
machine without it; the engine (:mod:`kvoffload.cli.toy_engine`) is imported only to run.
"""

from __future__ import annotations

import argparse
from types import ModuleType

from kvoffload.cli.errors import UserError

NAME = "demo"
HELP = "move real KV blocks GPU<->CPU(<->disk/Redis) with a policy (needs PyTorch)"
DESCRIPTION = (
    "A toy engine moves real KV tensors between device and a CPU tier through "
    "KVOffloader and checks every loaded block's bytes. With --disk and/or --redis the "
    "blocks also go to a disk tier (run it twice: the second run starts warm from disk) "
    "or a shared Redis (--instances 2: the second engine process hits the first one's "
    "blocks). Needs PyTorch (pip install 'kvoffload[torch]')."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options: plain argparse, so ``demo --help`` works without PyTorch."""
    m = parser.add_argument_group("toy KV cache")
    m.add_argument("--layers", type=int, default=4, help="attention layers (default 4)")
    m.add_argument("--kv-heads", type=int, default=8, help="KV heads per layer (default 8)")
    m.add_argument("--head-size", type=int, default=64, help="head size (default 64)")
    m.add_argument("--block-tokens", type=int, default=16, help="tokens per device block (16)")
    m.add_argument(
        "--dtype",
        default="float16",
        help="KV dtype: float16, bfloat16, float32, uint8 (fp8 bytes), float8_e4m3fn, ...",
    )
    m.add_argument(
        "--kind",
        choices=("kv_first", "blocks_first", "mla", "heads_first"),
        default="kv_first",
        help="tensor layout (default kv_first: [2, blocks, tokens, heads, head_size])",
    )
    m.add_argument(
        "--device", default="auto", help="device of the KV cache: auto (cuda if present), cpu, cuda"
    )
    t = parser.add_argument_group("CPU tier")
    t.add_argument("--cpu-mib", type=float, default=128.0, help="host memory in MiB (default 128)")
    t.add_argument("--policy", default="lru", help="eviction policy name (default lru)")
    t.add_argument("--blocks-per-chunk", type=int, default=1, help="device blocks per slot (1)")
    s = parser.add_argument_group("secondary tiers (behind the CPU tier, in this order)")
    s.add_argument("--disk", metavar="DIR", help="add a disk tier keeping its records in DIR")
    s.add_argument(
        "--disk-bytes", default="2GiB", help="the disk tier's byte budget (default 2GiB)"
    )
    s.add_argument(
        "--disk-policy", default="lru", help="the disk tier's eviction policy (default lru)"
    )
    s.add_argument(
        "--durability",
        choices=("none", "rename", "fsync"),
        default="rename",
        help="disk records: none, rename (default: atomic) or fsync (also power-safe)",
    )
    s.add_argument("--redis", metavar="URL", help="add a shared Redis tier (redis://host:port/db)")
    s.add_argument(
        "--redis-namespace",
        help="namespace of the demo's records (default: a fresh one per command, shared by "
        "its instances)",
    )
    s.add_argument(
        "--instances",
        type=int,
        default=1,
        help="engine processes run one after another on one Redis (needs --redis; default 1)",
    )
    s.add_argument(
        "--write-policy",
        choices=("write_through", "write_back", "selective", "none"),
        default="write_through",
        help="when the secondary tiers receive the CPU tier's blocks (default write_through)",
    )
    w = parser.add_argument_group("workload")
    w.add_argument("--requests", type=int, default=100, help="requests to run (default 100)")
    w.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--format", choices=("table", "json"), default="table", help="output format"
    )


_POSITIVE = ("layers", "kv_heads", "head_size", "block_tokens", "requests", "blocks_per_chunk")


def _engine() -> ModuleType:
    try:
        from kvoffload.cli import toy_engine
    except ImportError as exc:
        missing = exc.name or ""
        if missing == "torch" or missing.startswith("torch."):
            raise UserError(
                "kvoffload demo needs PyTorch: pip install 'kvoffload[torch]'"
            ) from None
        raise
    return toy_engine


def run(args: argparse.Namespace) -> int:
    for name in _POSITIVE:
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.cpu_mib <= 0:
        raise UserError(f"--cpu-mib must be > 0, got {args.cpu_mib}")
    from kvoffload.tiers.config import parse_bytes

    try:
        args.disk_bytes = parse_bytes("--disk-bytes", args.disk_bytes)
    except (TypeError, ValueError) as exc:
        raise UserError(str(exc).replace("config '--disk-bytes'", "--disk-bytes")) from None
    if args.disk_bytes <= 0:
        raise UserError(f"--disk-bytes must be > 0, got {args.disk_bytes}")
    if args.instances < 1:
        raise UserError(f"--instances must be >= 1, got {args.instances}")
    if args.instances > 1 and not args.redis:
        raise UserError(
            "--instances needs --redis: several engines share a Redis store (a disk tier "
            "belongs to one engine)"
        )
    return int(_engine().run(args))
