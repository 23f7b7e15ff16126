#!/usr/bin/env bash
# The thirteenth session's second device call: the decode-attention GPU tests three times
# (their greedy-token checks now accept a parting only on a tie of the reference's logits,
# tests/greedy.py), then the serving loop at batch 16 for int4/int3/int2 against float16.
#   bash benchmarks/s13_batch16.sh   (writes $OUT: gpu.txt, pytest logs, serving JSON/log)
set -uo pipefail
. benchmarks/device_env.sh s13_batch16_out
W="$OUT/work"; mkdir -p "$W"
for run in 1 2 3; do
  timeout 100 python -m pytest -m gpu -q -p no:cacheprovider -n 8 \
    tests/test_decode_attention.py > "$OUT/pytest_attention_$run.log" 2>&1
  echo "attention tests run $run (exit $?): $(tail -n 1 "$OUT/pytest_attention_$run.log")"
done
OUT="$W" SERVING_BUDGET_S=260 SERVING_TIMEOUT_S=330 bash benchmarks/serving_check.sh \
  int4,int3,int2 16 loop > "$W/serving.txt" 2>&1
cp "$W"/serving_*.json "$W"/serving_*.log "$OUT"/ 2>/dev/null
echo; echo "== s13_batch16 summary =="; cat "$OUT/gpu.txt"
grep -hE "^FAILED|^ERROR" "$OUT"/pytest_attention_*.log | head -n 20
tail -n 12 "$W/serving.txt"
