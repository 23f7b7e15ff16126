#!/usr/bin/env bash
# Issue 5's harness run in one device call: python -m lowvm.bench on the Llama-3 shapes
# (int4 g128, M = 1..4096, cuBLAS fp16/bf16 and tinygemm in the same process, anchors
# printed as recorded), the other widths on two shapes, and the pending M = 64 sweep of
# one-M-warp (k_slice) schedules. Plot the JSON on any machine with matplotlib:
#   python -m lowvm.bench.plot $OUT/bench_int4.json
set -uo pipefail
. benchmarks/device_env.sh final_bench_out
python -m lowvm.bench --anchors --out "$OUT/bench_int4.json" > "$OUT/bench_int4.log" 2>&1
python -m lowvm.bench --dtype int3,int2,int8,float4_e2m1 --shape 4096,28672 --shape 14336,4096 \
  --m 1,16,64,4096 --out "$OUT/bench_types.json" > "$OUT/bench_types.log" 2>&1
python benchmarks/gemm_quick.py --ms 64 --shapes 0,1,2,3,4 \
  --variants base,warps_m=1/k_slice=16,warps_m=1/k_slice=32 --out "$OUT/m64_k_slice.json" \
  > "$OUT/m64_k_slice.log" 2>&1
echo; echo "== final_bench summary =="; cat "$OUT/gpu.txt"
tail -n 45 "$OUT/bench_int4.log"; echo "-- types"; tail -n 25 "$OUT/bench_types.log"
echo "-- M = 64, k_slice"; sed -n '/^ kernel/,$p' "$OUT/m64_k_slice.log"
