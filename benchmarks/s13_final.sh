#!/usr/bin/env bash
# The thirteenth session's device call at the final code: every `gpu` test (8 processes),
# then the serving loop at batch 1 for int4/int3/int2 against float16 (Llama-3-8B shape,
# random weights, 128 new tokens, one CUDA graph per decode step).
#   COMMIT=<hash> bash benchmarks/s13_final.sh   (writes $OUT: gpu.txt, pytest_gpu.log,
#   serving JSON and log, all.tgz; the table is printed last)
set -uo pipefail
. benchmarks/device_env.sh s13_final_out
W="$OUT/work"; mkdir -p "$W"
timeout 330 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests > "$W/pytest_gpu.log" 2>&1
tests_rc=$?
cp "$W/pytest_gpu.log" "$OUT/pytest_gpu.log"
OUT="$W" SERVING_BUDGET_S=150 SERVING_TIMEOUT_S=200 bash benchmarks/serving_check.sh \
  int4,int3,int2 1 loop > "$W/serving.txt" 2>&1
cp "$W"/serving_*.json "$W"/serving_*.log "$OUT"/ 2>/dev/null
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== s13_final summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu (exit $tests_rc): $(tail -n 1 "$W/pytest_gpu.log")"
grep -E "^FAILED|^ERROR" "$W/pytest_gpu.log" | head -n 20
tail -n 12 "$W/serving.txt"
