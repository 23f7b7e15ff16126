#!/usr/bin/env bash
# The eighth session's check of the library with the wgmma GEMM in its dispatch: the whole
# `gpu` suite (every quant_linear test from M = 17 on an H100 now runs quant_gemm_wgmma),
# then the harness (python -m lowvm.bench: quant_linear with no schedule, cuBLAS fp16 in
# the same process) at M = 32 / 64 / 128 / 256 on the five Llama shapes.
# Run: bash benchmarks/wgmma_closing.sh
set -uo pipefail
. benchmarks/device_env.sh wgmma_closing_out
timeout 330 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests > "$OUT/pytest_gpu.log" 2>&1
tests_rc=$?
timeout 240 python -m lowvm.bench --m 32,64,128,256 --baselines cublas_fp16 --no-hbm-measure \
  --out "$OUT/bench_m32_256.json" > "$OUT/bench_m32_256.log" 2>&1
echo; echo "== wgmma_closing summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu (exit $tests_rc): $(tail -n 1 "$OUT/pytest_gpu.log")"
grep -E "^FAILED|^ERROR" "$OUT/pytest_gpu.log" | head -n 10
grep -E "^ *[0-9]+x[0-9]+ +[0-9]+ " "$OUT/bench_m32_256.log" | awk '{print $1, $2, $3, $4, $5}'
