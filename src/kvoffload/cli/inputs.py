"""From arguments to checked inputs: the trace, capacities, policies and replay options.

Everything here turns the library's ``ValueError`` / ``TypeError`` / ``ImportError`` about
what the user gave into :class:`UserError`, at the one place it can be told apart from a bug.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from kvoffload._checks import check_bool, check_int, check_number
from kvoffload.cli.args import key_values
from kvoffload.cli.errors import UserError
from kvoffload.policies import (
    BUILTIN_POLICIES,
    CachePolicyFactory,
    create_cache_policy,
    get_cache_policy_cls,
)
from kvoffload.sim.capacity import Capacity, parse_capacities
from kvoffload.sim.plugins import AdmissionFactory
from kvoffload.sim.records import Trace
from kvoffload.sim.replay import PolicySpec, ReplayOptions
from kvoffload.sim.tier_config import TieredCapacity, parse_sim_tiers
from kvoffload.sim.traces import load_trace
from kvoffload.sim.windows import Measure
from kvoffload.sim.workloads import WorkloadConfig, generate_workload

# What the library raises for a bad value, type, file or plug-in the user named.
INPUT_ERRORS = (ValueError, TypeError, ImportError, OSError, EOFError)


def workload_config(args: argparse.Namespace) -> WorkloadConfig:
    knobs = {f.name: f for f in fields(WorkloadConfig)}
    overrides = key_values(args.workload_param, "--workload-param")
    for key, value in list(overrides.items()):
        if key not in knobs:
            raise UserError(f"unknown workload knob '{key}'; known: {', '.join(knobs)}")
        default = getattr(WorkloadConfig, key)
        name = f"workload {key}"
        try:
            if isinstance(default, bool):
                check_bool(name, value)
            elif isinstance(default, int):
                check_int(name, value)
            elif isinstance(default, float):
                overrides[key] = check_number(name, value)
            elif type(value) is not type(default):
                raise TypeError(f"{name} must be a {type(default).__name__}, got {value!r}")
        except (TypeError, ValueError) as exc:
            raise UserError(str(exc)) from None
    overrides["seed"] = args.seed
    if args.requests is not None:
        overrides["requests"] = args.requests
    if args.arrival is not None:
        overrides["arrival"] = args.arrival
    if getattr(args, "block_tokens", None) is not None:
        overrides["block_tokens"] = args.block_tokens
    try:
        return WorkloadConfig(**overrides)
    except (ValueError, TypeError) as exc:
        raise UserError(str(exc)) from None


def load_input(args: argparse.Namespace) -> Trace:
    """The trace file named on the command line, or the generated workload."""
    if args.trace is None:
        if getattr(args, "max_requests", None) is not None:
            raise UserError("--max-requests applies to a trace file; use --requests instead")
        return generate_workload(workload_config(args))
    if args.workload_param or args.requests is not None or args.arrival is not None:
        raise UserError("workload options (--requests, --arrival, --workload-param) need no trace")
    if not Path(args.trace).exists():
        raise UserError(f"trace file not found: {args.trace}")
    try:
        trace = load_trace(
            args.trace, args.trace_format, args.block_tokens, args.skip_bad_lines, args.max_requests
        )
    except INPUT_ERRORS as exc:  # UnicodeError is a ValueError
        raise UserError(str(exc)) from None
    if trace.skipped_lines:
        print(
            f"kvoffload: skipped {trace.skipped_lines} malformed line(s); first: "
            f"{trace.first_skip_error}",
            file=sys.stderr,
        )
    return trace


def capacities(args: argparse.Namespace, trace: Trace, default: str) -> list[Capacity]:
    try:
        caps = parse_capacities(
            args.capacity or [default],
            trace.num_unique_blocks,
            trace.block_tokens,
            args.bytes_per_token,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from None
    for cap in caps:
        if cap.blocks < 0:
            raise UserError(f"capacity '{cap.label}' is negative")
    return caps


#: Built-ins left out of the default run: none. ``auto`` costs several times one policy (it
#: replays its candidates' shadows beside its active one) but it is the adaptive answer to
#: "which policy?", so the default run shows it beside the fixed ones.
NOT_IN_DEFAULT_RUN: frozenset[str] = frozenset()


def default_policy_names() -> list[str]:
    """The policies a run without ``--policy`` replays: every built-in but the meta-policies."""
    return [name for name, *_ in BUILTIN_POLICIES if name not in NOT_IN_DEFAULT_RUN]


def tier_capacities(args: argparse.Namespace, trace: Trace) -> list[Capacity] | None:
    """The ``--tiers`` grid columns, or ``None`` without ``--tiers`` (checked against the rest)."""
    specs = getattr(args, "tiers", None)
    instances = getattr(args, "instances", 1)
    if not specs:
        if instances != 1:
            raise UserError("--instances needs --tiers (e.g. --tiers cpu=5%,redis=100%)")
        for flag, default in (("tier_policy", "lru"), ("tier_write_policy", "write_through")):
            if getattr(args, flag, default) != default:
                option = "--" + flag.replace("_", "-")
                raise UserError(f"{option} needs --tiers (e.g. --tiers cpu=5%,disk=50%)")
        return None
    if args.capacity:
        raise UserError("--tiers gives the CPU capacity itself (cpu=5%); drop --capacity")
    if args.mode != "prefix":
        raise UserError("--tiers replays in prefix mode only; drop --mode blocks")
    if args.overlap:
        raise UserError("--tiers does not model --overlap yet; drop one of them")
    try:
        create_cache_policy(args.tier_policy, 1)
    except (ValueError, TypeError, ImportError) as exc:
        raise UserError(f"--tier-policy: {exc}") from None
    out: list[Capacity] = []
    for text in specs:
        try:
            config = parse_sim_tiers(
                text,
                trace.num_unique_blocks,
                trace.block_tokens,
                args.bytes_per_token,
                instances,
                args.tier_policy,
                args.tier_write_policy,
            )
        except (ValueError, TypeError) as exc:
            raise UserError(str(exc)) from None
        out.append(TieredCapacity.of(config))
    return out


def policy_names(args: argparse.Namespace) -> list[str]:
    names: list[str] = []
    for item in args.policy or [",".join(default_policy_names())]:
        for name in item.split(","):
            name = name.strip()
            if name == "all":
                names.extend(CachePolicyFactory.registered_names())
            elif name:
                names.append(name)
    names = list(dict.fromkeys(names))
    if not names:
        raise UserError("no policy given")
    return names


def _policy_class(name: str, module_path: str | None) -> type:
    try:
        return get_cache_policy_cls(name, module_path)
    except (ValueError, TypeError, ImportError) as exc:
        raise UserError(f"policy '{name}': {exc}") from None


def _accepts(cls: type, key: str) -> bool:
    """Whether ``cls(cache_capacity=..., key=...)`` is a valid call signature."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):  # no signature to read: let the constructor decide
        return True
    return any(
        p.kind is p.VAR_KEYWORD
        or (p.name == key and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        for p in parameters
    )


def policy_params(
    names: list[str], module_path: str | None, items: list[str] | None
) -> dict[str, dict[str, Any]]:
    """``--param`` values per policy: ``POLICY.KEY=V`` for one, ``KEY=V`` for all that take KEY."""
    per_policy: dict[str, dict[str, Any]] = {name: {} for name in names}
    bare: dict[str, Any] = {}
    for key, value in key_values(items, "--param").items():
        policy, dot, param = key.rpartition(".")
        if not dot:
            bare[key] = value
            continue
        if policy not in per_policy:
            raise UserError(
                f"--param {key}: policy '{policy}' is not one of the policies run "
                f"({', '.join(names)})"
            )
        if not param:
            raise UserError(f"--param {key}: no parameter name after '{policy}.'")
        per_policy[policy][param] = value
    for key, value in bare.items():
        takers = [n for n in names if _accepts(_policy_class(n, module_path), key)]
        if not takers:
            raise UserError(
                f"--param {key}: no policy run accepts '{key}' ({', '.join(names)}); "
                f"`kvoffload policies` lists them, POLICY.{key}=VALUE scopes it to one"
            )
        for name in takers:
            per_policy[name].setdefault(key, value)
    return per_policy


def policies(args: argparse.Namespace) -> list[PolicySpec]:
    """The policies to run, each built once here so a bad name or parameter fails now."""
    names = policy_names(args)
    params = policy_params(names, args.policy_module, args.param)
    specs = [PolicySpec.of(name, args.policy_module, params[name]) for name in names]
    for spec in specs:
        try:
            create_cache_policy(spec.name, 1, spec.module_path, dict(spec.params))
        except (ValueError, TypeError, ImportError) as exc:
            text = str(exc)
            named = text if f"'{spec.name}'" in text else f"policy '{spec.name}': {text}"
            raise UserError(named) from None
    return specs


def shadow_candidates(args: argparse.Namespace) -> list[str]:
    """The ``--shadow`` candidates (comma-separated, repeatable), checked; [] without it."""
    names = [
        name.strip() for item in getattr(args, "shadow", None) or () for name in item.split(",")
    ]
    names = list(dict.fromkeys(name for name in names if name))
    for name in names:
        try:
            create_cache_policy(name, 1, None, {})
        except (ValueError, TypeError, ImportError) as exc:
            raise UserError(f"--shadow: {exc}") from None
    return names


def shadow_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ReplayOptions fields of ``--shadow`` / ``--shadow-rate`` / ``--shadow-min-blocks``."""
    names = shadow_candidates(args)
    if not names:
        return {}
    return {
        "shadow_policies": tuple(names),
        "shadow_sample_rate": args.shadow_rate,
        "shadow_min_blocks": args.shadow_min_blocks,
    }


def measure(args: argparse.Namespace) -> Measure:
    """The warm-up and windows of ``--warmup-requests`` / ``--warmup-s`` / ``--window-s``."""
    if getattr(args, "windows_output", None) and getattr(args, "window_s", None) is None:
        raise UserError("--windows-output needs --window-s")
    try:
        return Measure(
            warmup_requests=getattr(args, "warmup_requests", 0),
            warmup_s=getattr(args, "warmup_s", 0.0),
            window_s=getattr(args, "window_s", None),
        )
    except (ValueError, TypeError) as exc:
        raise UserError(str(exc)) from None


def replay_options(args: argparse.Namespace) -> ReplayOptions:
    admission = None
    if args.admission:
        params = key_values(args.admission_param, "--admission-param")
        admission = AdmissionFactory(args.admission, tuple(sorted(params.items())))
        try:
            admission()  # validate now
        except (ValueError, TypeError, ImportError) as exc:
            raise UserError(str(exc)) from None
    elif args.admission_param:
        raise UserError("--admission-param needs --admission")
    try:
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
            measure=measure(args),
            **shadow_options(args),
        )
    except (ValueError, TypeError) as exc:
        raise UserError(str(exc)) from None


__all__ = [
    "INPUT_ERRORS",
    "capacities",
    "load_input",
    "measure",
    "policies",
    "policy_names",
    "policy_params",
    "replay_options",
    "shadow_candidates",
    "shadow_options",
    "tier_capacities",
    "workload_config",
]
