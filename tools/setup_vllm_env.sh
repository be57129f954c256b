#!/usr/bin/env bash
# Build (or refresh) a virtual environment in which vLLM's CPU offloading manager imports on a
# machine with no GPU, plus kvoffload installed editable, for benchmarks/compare_vllm.py and the
# vLLM integration tests.
#
# Why not `pip install vllm`: its requirements pull a CUDA torch and GPU kernels (gigabytes) that
# the manager never uses. Instead: the vLLM wheel with --no-deps, torch 2.13 CPU, and only the
# modules that `import vllm.v1.kv_offload.cpu.manager` actually reaches (found by trying the
# import), every one pinned and installed with --no-deps. `pip check` therefore lists many
# "requires X, which is not installed": expected, nothing on the import path needs them.
#
# Idempotent: wheels are cached in $KVOFFLOAD_VLLM_WHEELS and downloaded only when missing, so a
# second run (or a CI job restoring that directory) installs offline. Re-running on an existing
# environment reinstalls nothing that is already at its pinned version.
#
# Environment variables:
#   KVOFFLOAD_VLLM_VENV    where the environment goes (default: <repo>/../vllm-env)
#   KVOFFLOAD_VLLM_WHEELS  wheel cache (default: ~/.cache/kvoffload-vllm-wheels)
#   PYTHON                 interpreter for the venv (default: python3; 3.10+)
#
# torch 2.13.0+cpu: this workplace's pip config finds it on local disk. Elsewhere, give pip the
# PyTorch CPU index first: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="${KVOFFLOAD_VLLM_VENV:-$(dirname "$REPO")/vllm-env}"
WHEELS="${KVOFFLOAD_VLLM_WHEELS:-$HOME/.cache/kvoffload-vllm-wheels}"

VLLM_VERSION=0.33.0

# Everything the vLLM manager's import chain needs, pinned (versions within vLLM 0.33.0's own
# requirement ranges where it states one). vLLM 0.33.0 asks for torch 2.14.0; 2.13.0 imports and
# runs the (pure-Python) manager fine.
PINS=(
  "vllm==$VLLM_VERSION"
  "torch==2.13.0+cpu"
  # torch's own requirements
  filelock==4.3.1 fsspec==2026.9.0 Jinja2==3.1.6 MarkupSafe==3.0.4 mpmath==1.3.0
  networkx==3.6.1 sympy==1.14.0 typing_extensions==4.16.0
  # vLLM's import chain (vllm.distributed, model_executor, entrypoints, transformers, ...)
  aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7
  annotated-types==0.8.0 anyio==4.16.0 apache-tvm-ffi==0.1.11 attrs==26.1.0 cachetools==8.0.2
  cbor2==6.3.0 certifi==2026.10.19.post1 charset-normalizer==3.5.3 cloudpickle==3.1.3
  fastapi==0.136.3 frozenlist==1.8.0 h11==0.16.0 httpcore2==2.16.2 httpx2==2.16.2
  huggingface_hub==2.4.0 idna==3.20 llguidance==1.7.6 msgspec==0.23.0 multidict==7.2.1
  numpy==2.4.6 openai==3.57.0 openai-harmony==0.0.8 opentelemetry-api==1.45.2
  packaging==26.4 partial-json-parser==0.2.1.1.post7 pillow==13.0.0
  prometheus_client==0.26.0 propcache==0.5.4 psutil==7.2.2 py-cpuinfo==9.0.0
  pybase64==1.5.1 pydantic==2.14.4 pydantic_core==2.50.5 PyYAML==6.0.4 pyzmq==27.3.0
  regex==2026.11.19 requests==2.34.2 safetensors==0.8.0 sniffio==1.3.1 starlette==1.10.0
  tokenizers==0.23.3 tqdm==4.70.1 transformers==5.20.2 truststore==0.10.5
  typing-inspection==0.4.5 urllib3==2.8.0 uvloop==0.23.0 xgrammar==0.2.8 yarl==1.25.1
)
# Build backend for the editable kvoffload install (pip's isolated build env, from the cache).
BUILD_PINS=(
  hatchling==1.33.0 editables==0.6 packaging==26.4 pathspec==1.1.1 pluggy==1.7.0 tomlkit==0.15.2
  trove-classifiers==2026.9.21.13
)

mkdir -p "$WHEELS"
if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

fill_cache() {
  # Offline check first: a warm cache needs no index at all.
  if "${PIP[@]}" download --quiet --no-deps --no-index --find-links "$WHEELS" -d "$WHEELS" \
      "$@" >/dev/null 2>&1; then
    return
  fi
  echo "== downloading missing wheels into $WHEELS"
  "${PIP[@]}" download --quiet --no-deps -d "$WHEELS" "$@"
}

fill_cache "${PINS[@]}"
fill_cache "${BUILD_PINS[@]}"

echo "== installing pinned wheels (--no-deps, offline from the cache)"
"${PIP[@]}" install --quiet --no-deps --no-index --find-links "$WHEELS" "${PINS[@]}"

echo "== installing kvoffload editable from $REPO"
"${PIP[@]}" install --quiet --no-deps --no-index --find-links "$WHEELS" -e "$REPO"

echo "== checking the import (vLLM's import chain takes ~15 s)"
"$VENV/bin/python" - <<'EOF'
import torch
import vllm
from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

import kvoffload

assert torch.version.cuda is None, f"a CUDA torch was installed: {torch.__version__}"
manager = CPUOffloadingManager(2, cache_policy="arc")
ctx = ReqContext(req_id="smoke")
manager.on_new_request(ctx)
key = make_offload_key(b"\x00" * 8, 0)
out = manager.prepare_store([key], ctx)
manager.complete_store(out.keys_to_store, ctx)
assert manager.lookup(key, ctx) is LookupResult.HIT
manager.on_request_finished(ctx)
print(f"ok: vllm {vllm.__version__}, torch {torch.__version__}, kvoffload {kvoffload.__version__}")
EOF
echo "== done: run benchmarks with $VENV/bin/python"
