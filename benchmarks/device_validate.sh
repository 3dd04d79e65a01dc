#!/usr/bin/env bash
# The quick out-of-sample protocol of all five validations on a bigger machine (a lent GPU host's CPUs):
#   bash benchmarks/device_validate.sh            # < 8 min on 16 cores
# Calibrates that machine first (its own file: calibrations never travel between machines), then runs
# benchmarks/validate_quick.py for one round; results land in docs/benchmarks/validate.quick.json and
# validate_quick_runs.json beside this machine's, under $OUT when set (the device tool's output folder).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 dev.py setup >/dev/null
PY=.venv/bin/python
for tool in ip tc; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "device_validate: '$tool' is missing here: the validations run on loopback with the user-space delay line" >&2
  fi
done
export XDG_CACHE_HOME="${XDG_CACHE_HOME:-$PWD/.cache-device}"
timeout 120 $PY -m trainsim validate calibrate --recalibrate
timeout 400 $PY benchmarks/validate_quick.py --rounds 1
if [ -n "${OUT:-}" ]; then
  cp docs/benchmarks/validate.quick.json "$OUT/validate.quick.device.json"
  cp docs/benchmarks/validate_quick_runs.json "$OUT/validate_quick_runs.device.json"
fi
