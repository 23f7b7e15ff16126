#!/usr/bin/env bash
# The Hopper wgmma GEMM (quant_gemm_wgmma, sm_90a): its GPU tests (dot_shared and the GEMM
# against the interpreter and float64), then M = 64 / 256 / 4096 on the five Llama shapes
# against quant_gemm, quant_gemm_prefill and cuBLAS fp16 in the same process
# (DESIGN's event method). Run: bash benchmarks/wgmma_check.sh [wgmma schedules]
# (env: MS, SHAPES, TYPES as gemm_quick's --ms/--shapes/--types; TESTS=0 skips the tests)
set -uo pipefail
. benchmarks/device_env.sh wgmma_check_out
SCHEDS="${1:-256:128:2:3,128:256:2:4,128:128:2:4,64:128:2:4}"
if [ "${TESTS:-1}" != 0 ]; then
  timeout 300 python -m pytest -q -m gpu tests/test_dot_shared.py \
    tests/test_quant_gemm_wgmma.py > "$OUT/pytest_wgmma.log" 2>&1
  echo "pytest rc=$?"; tail -n 15 "$OUT/pytest_wgmma.log"
fi
timeout 420 python benchmarks/gemm_quick.py --ms "${MS:-64,256,4096}" --shapes "${SHAPES:-0,1,2,3,4}" \
  --types "${TYPES:-int4}" \
  --prefill-kernel quant_gemm_prefill --wgmma --wgmma-schedules "$SCHEDS" \
  --out "$OUT/wgmma_bench.json" > "$OUT/wgmma_bench.log" 2>&1
echo "bench rc=$?"
echo; echo "== wgmma_check summary =="; cat "$OUT/gpu.txt"
python benchmarks/rows_table.py "$OUT/wgmma_bench.json" --fields split,stages,bm,bn \
  || tail -n 30 "$OUT/wgmma_bench.log"
