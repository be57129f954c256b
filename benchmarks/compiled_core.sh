#!/usr/bin/env bash
# What compiling the core with mypyc would buy, measured: builds the modules on the manager's
# hot path (manager, keys, context, events, the policy base, lru, arc, victims) with mypyc into
# a temporary copy of the package (the repository is left untouched), then runs
# compare_vllm.py with that copy first on the path, then with the pure-Python package, so the
# two replays of each policy meet the same machine within minutes.
#
# The source is compiled as it is: no mypyc-specific rewrites. The compiled copy is only a
# measurement; kvoffload ships pure Python (and its core stays standard-library only).
#
#   benchmarks/compiled_core.sh                       # ours only, in the dev venv
#   PYTHON=../vllm-env/bin/python benchmarks/compiled_core.sh --runs 5   # next to vLLM's
#
# Environment variables:
#   PYTHON  interpreter that runs the replays (default: python3); same version as MYPYC's
#   MYPYC   the mypyc command (default: mypyc; `pip install mypy` provides it, plus
#           setuptools and a C compiler)
# Other arguments go to compare_vllm.py (default: --policies lru,arc).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
MYPYC="${MYPYC:-mypyc}"
MODULES=(manager/__init__ manager/api manager/counters manager/cpu manager/keyargs manager/locked manager/pool manager/records keys context events policies/base policies/lru policies/arc policies/victims)
FILES=()
for module in "${MODULES[@]}"; do FILES+=("kvoffload/$module.py"); done

if ! command -v "$MYPYC" >/dev/null; then
    echo "compiled_core.sh: '$MYPYC' not found (pip install mypy setuptools, or set MYPYC)" >&2
    exit 2
fi
BUILD="$(mktemp -d)"
trap 'rm -rf "$BUILD"' EXIT
cp -r "$HERE/../src/kvoffload" "$BUILD/"
find "$BUILD" -name __pycache__ -prune -exec rm -rf {} +
echo "building ${#MODULES[@]} core modules with mypyc in $BUILD ..."
if ! (cd "$BUILD" && "$MYPYC" "${FILES[@]}" >build.log 2>&1); then
    tail -20 "$BUILD/build.log" >&2
    exit 1
fi
ARGS=("$@")
[[ ${#ARGS[@]} -eq 0 ]] && ARGS=(--policies lru,arc)

echo "== compiled core (mypyc) =="
PYTHONPATH="$BUILD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - <<'EOF'
import kvoffload.manager.cpu as cpu
assert cpu.__file__.endswith(".so"), f"not the compiled manager: {cpu.__file__}"
EOF
PYTHONPATH="$BUILD${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" "$HERE/compare_vllm.py" "${ARGS[@]}"
echo
echo "== pure Python =="
"$PYTHON" "$HERE/compare_vllm.py" "${ARGS[@]}"
