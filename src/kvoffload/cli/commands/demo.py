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


#: Defaults that differ between the toy engine and the hf engine (the option's default is
#: None, filled in by engine).
_ENGINE_DEFAULTS = {
    "toy": {"layers": 4, "kv_heads": 8, "block_tokens": 16, "cpu_mib": 128.0},
    "hf": {"layers": 6, "kv_heads": 2, "block_tokens": 256, "cpu_mib": 1024.0},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options: plain argparse, so ``demo --help`` works without PyTorch."""
    parser.add_argument(
        "--engine",
        choices=("toy", "hf"),
        default="toy",
        help="toy: random KV tensors, every loaded byte checked (default); hf: a seeded "
        "Llama from transformers on this CPU, multi-turn conversations, cold vs warm time to "
        "first token with bit-exact logits (needs pip install 'kvoffload[hf]')",
    )
    m = parser.add_argument_group("KV cache (both engines)")
    m.add_argument("--layers", type=int, help="attention layers (default: toy 4, hf 6)")
    m.add_argument("--kv-heads", type=int, help="KV heads per layer (default: toy 8, hf 2)")
    m.add_argument("--head-size", type=int, default=64, help="head size (toy; default 64)")
    m.add_argument(
        "--block-tokens", type=int, help="tokens per device block (default: toy 16, hf 256)"
    )
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
    t.add_argument("--cpu-mib", type=float, help="host memory in MiB (default: toy 128, hf 1024)")
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
    w.add_argument("--requests", type=int, default=100, help="toy: requests to run (default 100)")
    w.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    h = parser.add_argument_group("hf engine (--engine hf)")
    h.add_argument("--conversations", type=int, default=3, help="conversations (default 3)")
    h.add_argument("--turns", type=int, default=3, help="turns per conversation (default 3)")
    h.add_argument(
        "--system-tokens", type=int, default=500, help="shared system prompt (default 500)"
    )
    h.add_argument(
        "--user-tokens", type=int, nargs=2, default=[100, 400], metavar=("MIN", "MAX"),
        help="tokens per user message (default 100 400)",
    )  # fmt: skip
    h.add_argument(
        "--answer-tokens", type=int, nargs=2, default=[50, 150], metavar=("MIN", "MAX"),
        help="tokens per answer, added to the history (default 50 150)",
    )  # fmt: skip
    h.add_argument("--hidden", type=int, default=512, help="hidden size (default 512)")
    h.add_argument("--heads", type=int, default=8, help="attention heads (default 8)")
    h.add_argument("--vocab", type=int, default=32000, help="vocabulary (default 32000)")
    h.add_argument(
        "--max-tokens", type=int, default=8192, help="longest prompt the cache holds (8192)"
    )
    h.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a shared 2-core machine two threads stalled "
        "prefill 2-10x whenever the other core was busy)",
    )
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


def _hf_engine() -> ModuleType:
    # Resolved by name at run time: integrations is a side layer that the CLI never imports
    # statically (nor does importing the CLI import transformers).
    import importlib

    try:
        return importlib.import_module("kvoffload.integrations.hf_demo")
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing in ("torch", "transformers"):
            raise UserError(
                "kvoffload demo --engine hf needs transformers 5.x and PyTorch: "
                "pip install 'kvoffload[hf]'"
            ) from None
        raise


def run(args: argparse.Namespace) -> int:
    for name, value in _ENGINE_DEFAULTS[args.engine].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
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
    if args.engine == "hf":
        for name in ("conversations", "turns", "system_tokens", "hidden", "heads", "vocab"):
            if getattr(args, name) < 1:
                raise UserError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}"
                )
        for name in ("user_tokens", "answer_tokens"):
            low, high = getattr(args, name)
            if not 1 <= low <= high:
                raise UserError(
                    f"--{name.replace('_', '-')} needs 1 <= MIN <= MAX, got {low} {high}"
                )
        if args.hidden % args.heads or args.heads % args.kv_heads:
            raise UserError("--hidden must be a multiple of --heads, and --heads of --kv-heads")
        return int(_hf_engine().run(args))
    return int(_engine().run(args))
