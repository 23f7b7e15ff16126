#!/usr/bin/env bash
# The thirteenth session's fourth device call: the batch-1 serving loop again with 7
# repeats per row (the third call's int4 row spread 392-450 ms over its 3 runs while its
# replayed step stayed 2.64 ms), int4/int3/int2 against float16.
#   bash benchmarks/s13_repeat.sh   (writes $OUT: gpu.txt, serving JSON/log)
set -uo pipefail
. benchmarks/device_env.sh s13_repeat_out
W="$OUT/work"; mkdir -p "$W"
OUT="$W" SERVING_BUDGET_S=300 SERVING_TIMEOUT_S=400 bash benchmarks/serving_check.sh \
  int4,int3,int2 1 loop --repeats 7 > "$W/serving.txt" 2>&1
cp "$W"/serving_*.json "$W"/serving_*.log "$OUT"/ 2>/dev/null
echo; echo "== s13_repeat summary =="; cat "$OUT/gpu.txt"
tail -n 12 "$W/serving.txt"
