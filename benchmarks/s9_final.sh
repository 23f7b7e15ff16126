#!/usr/bin/env bash
# The ninth session's final device call: the whole `gpu` suite at the final code (the
# M = 9..16 rules among it), then issue 6's serving loop at batch 1 and 16 (int4 against
# float16).   bash benchmarks/s9_final.sh   (writes $OUT: gpu.txt, all.tgz)
set -uo pipefail
. benchmarks/device_env.sh s9_final_out
W="$OUT/work"; mkdir -p "$W"
timeout 300 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests > "$W/pytest_gpu.log" 2>&1
tests_rc=$?
OUT="$W" SERVING_BUDGET_S=220 SERVING_TIMEOUT_S=280 bash benchmarks/serving_check.sh int4 1,16 loop \
  > "$W/serving.txt" 2>&1
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== s9_final summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu (exit $tests_rc): $(tail -n 1 "$W/pytest_gpu.log")"
grep -E "^FAILED|^ERROR" "$W/pytest_gpu.log" | head -n 10
tail -n 12 "$W/serving.txt"
