#!/usr/bin/env bash
# Issue 5's harness at the ninth session's final code: python -m lowvm.bench --anchors on
# the Llama-3 shapes (int4 g128, M = 1..4096; cuBLAS fp16/bf16, tinygemm and GemLite
# where carried, in the same process). Run with carry .carry for GemLite.
#   bash benchmarks/s9_harness.sh   (writes $OUT: bench_int4.json/.log)
set -uo pipefail
. benchmarks/device_env.sh s9_harness_out
timeout 420 python -m lowvm.bench --anchors --out "$OUT/bench_int4.json" > "$OUT/bench_int4.log" 2>&1
echo "exit $?"; echo "== s9_harness summary =="; cat "$OUT/gpu.txt"
grep -iE "hbm bandwidth" "$OUT/bench_int4.log" | head -n 1
grep -E "^ *[0-9]+x[0-9]+ +[0-9]+ +lowvm" "$OUT/bench_int4.log" | awk '{print $1, $2, $4}'
