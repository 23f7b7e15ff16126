#!/usr/bin/env bash
# The eleventh session's final device call at the final code: every `gpu` test (8
# processes), then the serving loop at batch 1 for int4/int3/int2 against float16.
#   bash benchmarks/s11_final.sh   (writes $OUT: gpu.txt, all.tgz)
set -uo pipefail
. benchmarks/device_env.sh s11_final_out
W="$OUT/work"; mkdir -p "$W"
timeout 300 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests > "$W/pytest_gpu.log" 2>&1
tests_rc=$?
OUT="$W" SERVING_BUDGET_S=170 SERVING_TIMEOUT_S=220 bash benchmarks/serving_check.sh \
  int4,int3,int2 1 loop > "$W/serving.txt" 2>&1
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== s11_final summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu (exit $tests_rc): $(tail -n 1 "$W/pytest_gpu.log")"
grep -E "^FAILED|^ERROR" "$W/pytest_gpu.log" | head -n 20
tail -n 12 "$W/serving.txt"
