#!/usr/bin/env bash
# The thirteenth session's third device call: the serving example's GPU tests, then the
# serving loop at batch 1 for int4/int3/int2 against float16 with the per-layer error
# column (each quantized layer against its float16 original on the float16 model's
# activations), Llama-3-8B shape, random weights.
#   bash benchmarks/s13_quality.sh   (writes $OUT: gpu.txt, pytest log, serving JSON/log)
set -uo pipefail
. benchmarks/device_env.sh s13_quality_out
W="$OUT/work"; mkdir -p "$W"
timeout 150 python -m pytest -m gpu -q -p no:cacheprovider -n 4 tests/test_nn_examples.py \
  tests/test_serving_loop.py > "$OUT/pytest_examples.log" 2>&1
echo "example GPU tests (exit $?): $(tail -n 1 "$OUT/pytest_examples.log")"
OUT="$W" SERVING_BUDGET_S=200 SERVING_TIMEOUT_S=260 bash benchmarks/serving_check.sh \
  int4,int3,int2 1 loop > "$W/serving.txt" 2>&1
cp "$W"/serving_*.json "$W"/serving_*.log "$OUT"/ 2>/dev/null
echo; echo "== s13_quality summary =="; cat "$OUT/gpu.txt"
grep -hE "^FAILED|^ERROR" "$OUT"/pytest_examples.log | head -n 20
tail -n 12 "$W/serving.txt"
