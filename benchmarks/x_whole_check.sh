#!/usr/bin/env bash
# One device call for the x_whole decode schedules (sixth session): their GPU tests,
# then decode GEMM timings of x_whole (the library's choice at M <= 16 where x fits)
# against the schedules that stream x ('streamed'), inside CUDA graphs (as a decode step
# runs them) and event-timed after DESIGN.md's 512 MB flush.
#   bash benchmarks/x_whole_check.sh [final]   (writes $OUT, default ./x_whole_check_out)
# final: only timings of the library's final choice (int4 M = 1/16 in graphs and
# event-timed, other widths at M = 1) against streamed x.
set -uo pipefail
. benchmarks/device_env.sh x_whole_check_out
q="python benchmarks/gemm_quick.py"
logs=""
if [ "${1:-}" = "final" ]; then
  # the library's final choice against streamed x: int4 at M = 1 and 16 in graphs and
  # event-timed, the other widths at M = 1 in graphs
  $q --graph --ms 1,16 --shapes 0,1,2,3,4,4096x4096 --variants base,streamed \
    --out "$OUT/final_graph.json" > "$OUT/final_graph.log" 2>&1
  $q --ms 1,16 --variants base,streamed --out "$OUT/final_events.json" \
    > "$OUT/final_events.log" 2>&1
  $q --graph --ms 1 --shapes 0,2 --types int3,int2,int8,float4_e2m1 --variants base,streamed \
    --out "$OUT/final_types_graph.json" > "$OUT/final_types_graph.log" 2>&1
  logs="final_graph final_events final_types_graph"
else
  timeout 240 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_quant_gemm.py \
    -k "x_whole or matches_float64 or zero_points" 2>&1 | tee "$OUT/pytest_x_whole.log"
  $q --graph --ms 1 --shapes 0,1,2,3,4,4096x4096 --variants base,prefetch=1,prefetch=4,streamed \
    --out "$OUT/graph_m1.json" > "$OUT/graph_m1.log" 2>&1
  $q --graph --ms 16 --shapes 1,2,4096x4096 --variants base,streamed \
    --out "$OUT/graph_m16.json" > "$OUT/graph_m16.log" 2>&1
  $q --ms 1 --variants base,streamed --out "$OUT/events_m1.json" > "$OUT/events_m1.log" 2>&1
  logs="graph_m1 graph_m16 events_m1"
fi
echo; echo "== x_whole_check summary =="
cat "$OUT/gpu.txt"; [ -f "$OUT/pytest_x_whole.log" ] && tail -n 1 "$OUT/pytest_x_whole.log"
for f in $logs; do echo "-- $f"; sed -n '/^ kernel/,$p' "$OUT/$f.log"; done
