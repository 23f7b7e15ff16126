#!/usr/bin/env bash
# Issue 5's harness run in one device call: python -m lowvm.bench on the Llama-3 shapes
# (int4 g128, M = 1..4096, cuBLAS fp16/bf16 and tinygemm in the same process, anchors
# printed as recorded; GemLite too where its source is carried: benchmarks/carry_gemlite.sh,
# then run with carry .carry), the other widths on two shapes. Plot the JSON on any machine
# with matplotlib:
#   python -m lowvm.bench.plot $OUT/bench_int4.json
set -uo pipefail
. benchmarks/device_env.sh final_bench_out
timeout 400 python -m lowvm.bench --anchors --out "$OUT/bench_int4.json" > "$OUT/bench_int4.log" 2>&1
timeout 150 python -m lowvm.bench --dtype int3,int2,int8,float4_e2m1 --shape 4096,28672 \
  --shape 14336,4096 --m 1,16,64,4096 --baselines none --out "$OUT/bench_types.json" \
  > "$OUT/bench_types.log" 2>&1
echo; echo "== final_bench summary =="; cat "$OUT/gpu.txt"
grep -E "^ *[0-9]+x[0-9]+ +[0-9]+ +(lowvm|cublas_fp16|tinygemm|gemlite)" "$OUT/bench_int4.log" \
  | awk '{print $1, $2, $3, $4, $5, $7}' | head -n 130
echo "-- types"; grep -E "^ *[0-9]+x[0-9]+ +[0-9]+ +lowvm" "$OUT/bench_types.log" \
  | awk '{print $1, $2, $3, $4, $5}'
