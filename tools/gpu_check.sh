#!/usr/bin/env bash
# The CUDA data plane, checked and measured on a GPU machine in one call (issue 18).
#
#   bash tools/gpu_check.sh            # on a machine with CUDA: under 6 minutes
#   bash tools/gpu_check.sh --dry-run  # here, without CUDA: the same steps on the CPU
#
# Needs only what travels with the working tree and a python3 with PyTorch (CUDA build),
# pytest and hypothesis (the device image has them); nothing is installed or downloaded.
# Steps, each under its own time limit:
#   1. tests/transfer (every layout, dtype and blocks_per_chunk, byte-exact, concurrency and
#      hazard cases, both CUDA copy modes); on CUDA it fails unless CUDA cases ran and none
#      was skipped for want of CUDA;
#   2. `kvoffload demo --device cuda` (real blocks through the offloader, every loaded byte
#      checked);
#   3. benchmarks/transfer_bandwidth.py --device cuda: device-to-host (store) and
#      host-to-device (load) GB/s against the same run's pinned-copy ceiling, 16- and
#      512-token blocks, sequential and random slots, staged and direct copy modes.
# Writes under $OUT (default ./out/gpu_check): gpu_check.log, gpu_check.json (the figures and
# each step's status), transfer_tests.xml, demo.json, transfer_bandwidth.json.
# Exit status: 0 when every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
case "${1:-}" in
  --dry-run) DRY=1 ;;
  "") ;;
  *) echo "usage: bash tools/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
esac
OUT="${OUT:-$PWD/out/gpu_check}"
export OUT
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
DEVICE=cuda
[ "$DRY" = 1 ] && DEVICE=cpu
STATUS="$OUT/.status"
: >"$STATUS"
T0=$(date +%s)

step() {  # step NAME LIMIT_S COMMAND...: run, time, and record pass/fail
  local name=$1 limit=$2
  shift 2
  local start end rc
  echo "== $name (limit ${limit}s): $*"
  start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  end=$(date +%s)
  echo "== $name: rc=$rc in $((end - start))s"
  echo "$name $rc $((end - start))" >>"$STATUS"
  return 0
}

echo "== environment (dry run: $DRY, device: $DEVICE)"
"$PY" - <<'EOF'
import platform, sys
import torch
print("python", platform.python_version(), "torch", torch.__version__,
      "cuda", torch.version.cuda, "available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
EOF
if [ "$DRY" = 0 ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "CUDA is not available: run with --dry-run for the CPU steps" >&2
  exit 1
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L

# 1. The transfer tests. On CUDA every device-parametrized case gets a cuda twin.
step tests 240 "$PY" -m pytest tests/transfer -q -p no:cacheprovider -rs \
  --junitxml "$OUT/transfer_tests.xml"

# 2. The demo, as the CLI runs it (the console script may not be installed there).
DEMO_ARGS=(demo --device "$DEVICE" --format json --requests 200 --layers 8 --cpu-mib 64
           --blocks-per-chunk 2 --policy arc)
[ "$DRY" = 1 ] && DEMO_ARGS=(demo --device cpu --format json --requests 40 --layers 2
                             --cpu-mib 8 --blocks-per-chunk 2 --policy arc)
step demo 120 bash -c '"$0" -c "import sys; from kvoffload.cli import main; sys.exit(main(sys.argv[1:]))" "$@" >"$OUT/demo.json"' \
  "$PY" "${DEMO_ARGS[@]}"

# 3. Bandwidth against the same run's pinned-copy ceiling.
BW_ARGS=(--device "$DEVICE" -o "$OUT/transfer_bandwidth.json")
[ "$DRY" = 1 ] && BW_ARGS+=(--quick --rounds 3)
step bandwidth 180 "$PY" benchmarks/transfer_bandwidth.py "${BW_ARGS[@]}"

# Summary: one JSON of figures and statuses; the exit status says whether all passed.
DRY=$DRY DEVICE=$DEVICE T0=$T0 "$PY" - <<'EOF'
import json, os, sys, time
import xml.etree.ElementTree as ET

out = os.environ["OUT"]
dry = os.environ["DRY"] == "1"
summary = {"dry_run": dry, "device": os.environ["DEVICE"], "steps": {}}
for line in open(os.path.join(out, ".status")):
    name, rc, seconds = line.split()
    summary["steps"][name] = {"rc": int(rc), "seconds": int(seconds)}
ok = all(s["rc"] == 0 for s in summary["steps"].values()) and len(summary["steps"]) == 3

tests = {"passed": 0, "failed": 0, "skipped": 0, "cuda_passed": 0, "skipped_for_cuda": 0}
try:
    for case in ET.parse(os.path.join(out, "transfer_tests.xml")).iter("testcase"):
        name = case.get("name", "")
        skipped = case.find("skipped")
        if case.find("failure") is not None or case.find("error") is not None:
            tests["failed"] += 1
        elif skipped is not None:
            tests["skipped"] += 1
            if "CUDA" in (skipped.get("message") or ""):
                tests["skipped_for_cuda"] += 1
        else:
            tests["passed"] += 1
            params = name.partition("[")[2]
            if "cuda" in params or name.startswith("test_cuda_"):  # a case run on CUDA
                tests["cuda_passed"] += 1
except (OSError, ET.ParseError) as exc:
    tests["error"] = str(exc)
    ok = False
if not dry and (tests["cuda_passed"] == 0 or tests["skipped_for_cuda"]):
    ok = False  # the CUDA cases must really run, not skip
summary["tests"] = tests

try:
    demo = json.load(open(os.path.join(out, "demo.json")))
    keys = ("device", "hit_ratio", "hit_blocks", "loaded_blocks_verified", "loaded_blocks_wrong",
            "failed_transfers", "load_gbps", "store_gbps")
    summary["demo"] = {k: demo.get(k) for k in keys}
    ok = ok and demo.get("loaded_blocks_wrong") == 0 and demo.get("loaded_blocks_verified", 0) > 0
except (OSError, ValueError) as exc:
    summary["demo"] = {"error": str(exc)}
    ok = False

try:
    bw = json.load(open(os.path.join(out, "transfer_bandwidth.json")))
    summary["bandwidth_header"] = bw["header"]
    summary["bandwidth"] = [
        {
            "copy_mode": r["copy_mode"],
            "block_tokens": r["block_tokens"],
            "mapping": r["mapping"],
            "direction": {"store": "device_to_host", "load": "host_to_device"}[r["direction"]],
            "worker_gbps": r["worker_gbps"],
            "ceiling_gbps": r["ceiling_gbps"],
            "ratio": r["ratio"],
            "ratio_q1_q3": [r["ratio_q1"], r["ratio_q3"]],
            "target": r["target"],
            "meets_target": r["meets_target"],
        }
        for r in bw["rows"]
        if r["device"].startswith(os.environ["DEVICE"])
    ]
except (OSError, ValueError, KeyError) as exc:
    summary["bandwidth"] = {"error": str(exc)}
    ok = False

summary["ok"] = ok
summary["seconds"] = int(time.time()) - int(os.environ["T0"])
with open(os.path.join(out, "gpu_check.json"), "w") as handle:
    json.dump(summary, handle, indent=2)
print("== summary")
print(json.dumps({k: summary[k] for k in ("ok", "seconds", "steps", "tests", "demo")}, indent=1))
for r in summary["bandwidth"] if isinstance(summary["bandwidth"], list) else []:
    met = "" if r["target"] is None else (" met" if r["meets_target"] else " MISSED")
    print(f'{r["copy_mode"]:>7} {r["block_tokens"]:>4} tok {r["mapping"]:>10} '
          f'{r["direction"]:>14}: {r["worker_gbps"]:7.2f} GB/s of {r["ceiling_gbps"]:7.2f} '
          f'= {r["ratio"]:.2f}' + (f' (target {r["target"]}{met})' if r["target"] else ""))
sys.exit(0 if ok else 1)
EOF
rc=$?
rm -f "$STATUS"
echo "== gpu_check: $([ $rc = 0 ] && echo PASSED || echo FAILED) (details in $OUT/gpu_check.json)"
exit $rc
