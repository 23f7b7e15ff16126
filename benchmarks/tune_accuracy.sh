#!/usr/bin/env bash
# One device call (ninth session): the tuner's static model against exhaustive tuning
# (benchmarks/tune_accuracy.py) on decode and wgmma problems.
#   bash benchmarks/tune_accuracy.sh   (writes $OUT: gpu.txt, tune_accuracy.json/.log)
set -uo pipefail
. benchmarks/device_env.sh tune_accuracy_out
timeout 540 python benchmarks/tune_accuracy.py --out "$OUT/tune_accuracy.json" \
  > "$OUT/tune_accuracy.log" 2>&1
echo "exit $?"; echo "== tune_accuracy summary =="; cat "$OUT/gpu.txt"
grep -v "^\s*$" "$OUT/tune_accuracy.log" | cut -c1-400 | tail -n 30
