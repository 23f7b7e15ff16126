#!/usr/bin/env bash
# The ninth session's harness rows at decode sizes with the final dispatch (M = 9..16
# rules): python -m lowvm.bench at M = 1, 4, 16 on the Llama-3 shapes, cuBLAS fp16 and
# tinygemm in the same process.   bash benchmarks/s9_decode_bench.sh  (writes $OUT)
set -uo pipefail
. benchmarks/device_env.sh s9_decode_bench_out
timeout 420 python -m lowvm.bench --m 1,4,16 --baselines cublas_fp16,tinygemm \
  --out "$OUT/bench_m1_16.json" > "$OUT/bench_m1_16.log" 2>&1
echo "exit $?"; echo "== s9_decode_bench summary =="; cat "$OUT/gpu.txt"
grep -iE "hbm|bandwidth" "$OUT/bench_m1_16.log" | head -n 3
grep -E "^ *[0-9]+x[0-9]+ +[0-9]+ +(lowvm|cublas_fp16|tinygemm)" "$OUT/bench_m1_16.log" \
  | awk '{print $1, $2, $3, $4, $5, $7}'
