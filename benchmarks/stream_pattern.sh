#!/usr/bin/env bash
# One device call (ninth session): stream_pattern.cu, the decode GEMM's read pattern with
# a block's tiles K-step-major (the repacked format) against block-major.
set -uo pipefail
. benchmarks/device_env.sh stream_pattern_out
nvcc -O3 -arch=sm_90 -o /tmp/stream_pattern benchmarks/stream_pattern.cu || exit 1
for shape in "448 32" "896 16" "160 64" "1024 28"; do
  /tmp/stream_pattern $shape
done 2>&1 | tee "$OUT/stream_pattern.txt"
