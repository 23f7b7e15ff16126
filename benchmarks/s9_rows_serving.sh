#!/usr/bin/env bash
# The ninth session's last device call: the M = 9 / 16 rows of the wide shapes with the
# wgmma dispatch beside quant_gemm's choice (events after the write flush, and in graphs),
# then issue 6's batch-1 serving loop (int4 against float16).
#   bash benchmarks/s9_rows_serving.sh   (writes $OUT: gpu.txt, all.tgz)
set -uo pipefail
. benchmarks/device_env.sh s9_rows_out
W="$OUT/work"; mkdir -p "$W"
q="python benchmarks/gemm_quick.py --ms 9,16 --shapes 3,4 --variants base --wgmma"
$q --out "$W/m16_events.json" > "$W/m16_events.log" 2>&1
$q --graph --out "$W/m16_graph.json" > "$W/m16_graph.log" 2>&1
OUT="$W" SERVING_BUDGET_S=300 SERVING_TIMEOUT_S=400 bash benchmarks/serving_check.sh int4 1 loop \
  > "$W/serving.txt" 2>&1
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== s9_rows_serving summary =="; cat "$OUT/gpu.txt"
for f in m16_events m16_graph; do
  echo "-- $f"; sed -n '/^ kernel/,$p' "$W/$f.log" | grep -v cublas | cut -c1-110
done
tail -n 14 "$W/serving.txt"
