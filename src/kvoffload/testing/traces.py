"""Where the project's reference trace is, for the exactness tests and the benchmarks.

The README's headline figures and the libCacheSim comparisons replay the Mooncake FAST'25
synthetic trace. It is never copied into the project: it is found at ``$KVOFFLOAD_TRACE``, else
at ``shared/traces/mooncake_synthetic_trace.jsonl`` in the nearest folder above the checkout
(the layout of a development machine). Without it those tests skip with one notice
(:func:`missing_trace_notice`) and the rest of the suite still runs.
"""

from __future__ import annotations

import os
from pathlib import Path

TRACE_ENV = "KVOFFLOAD_TRACE"
TRACE_NAME = "mooncake_synthetic_trace.jsonl"
TRACE_SOURCE = (
    "https://github.com/kvcache-ai/Mooncake/raw/main/FAST25-release/traces/synthetic_trace.jsonl"
)
_RELATIVE = Path("shared", "traces", TRACE_NAME)


def shared_trace_path(start: str | os.PathLike[str] | None = None) -> Path:
    """``$KVOFFLOAD_TRACE`` if set, else the first ``shared/traces/...`` above ``start``.

    ``start`` is the checkout (default: the current directory). When nothing is found, the
    path returned is where it was expected beside the checkout, so a message can name it.
    """
    env = os.environ.get(TRACE_ENV)
    if env:
        return Path(env).expanduser()
    here = Path(start if start is not None else Path.cwd()).resolve()
    for folder in here.parents:
        if (folder / _RELATIVE).is_file():
            return folder / _RELATIVE
    return here.parent / _RELATIVE


def missing_trace_notice(path: Path, skipped: int | None = None) -> str:
    """How to get the trace, for a test run or a benchmark that did not find it at ``path``."""
    what = f"{skipped} tests that replay" if skipped is not None else "Runs that replay"
    source = (
        f"{TRACE_ENV}={os.environ[TRACE_ENV]!r} names no file"
        if os.environ.get(TRACE_ENV)
        else f"it is not at {path}"
    )
    return (
        f"{what} the shared Mooncake synthetic trace were skipped: {source}.\n"
        f"Get it (the FAST'25 release's synthetic_trace.jsonl, Apache-2.0) and point to it:\n"
        f"    curl -L -o {TRACE_NAME} {TRACE_SOURCE}\n"
        f"    export {TRACE_ENV}=$PWD/{TRACE_NAME}\n"
        f"or place it at ../{_RELATIVE.as_posix()} beside the checkout."
    )


__all__ = [
    "TRACE_ENV",
    "TRACE_NAME",
    "TRACE_SOURCE",
    "missing_trace_notice",
    "shared_trace_path",
]
