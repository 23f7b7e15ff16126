#!/usr/bin/env bash
# The eleventh session's second device call: 3/5/6/7-bit pairs that straddle a boundary
# gather their bytes with one prmt (int3: 40 operations per 32 codes, was 44). GPU tests of
# the casts and GEMMs (every type, the matrix), the int3/int4/int2 decode GEMMs at M = 1
# and 16 in CUDA graphs, the serving loop at batch 1 (int4/int3/int2 against float16), then
# int4 with lm_head in int8 (--lm-head int8).
#   bash benchmarks/s11_gather.sh   (writes $OUT: gpu.txt, all.tgz)
set -uo pipefail
. benchmarks/device_env.sh s11_gather_out
W="$OUT/work"; mkdir -p "$W"
timeout 150 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_fast_cast.py \
  tests/test_quant_gemm.py tests/test_quant_gemm_matrix.py tests/test_quant_gemm_prefill.py \
  tests/test_quant_gemm_wgmma.py tests/test_nn_gpu.py > "$W/pytest_gpu.log" 2>&1
tests_rc=$?
timeout 100 python benchmarks/gemm_quick.py --ms 1,16 --types int4,int3 --variants base \
  --graph --out "$W/gemm_types.json" > "$W/gemm_types.log" 2>&1
OUT="$W" SERVING_BUDGET_S=170 SERVING_TIMEOUT_S=220 bash benchmarks/serving_check.sh \
  int4,int3,int2 1 loop > "$W/serving.txt" 2>&1
OUT="$W" SERVING_BUDGET_S=40 SERVING_TIMEOUT_S=90 bash benchmarks/serving_check.sh \
  int4 1 loop --lm-head int8 --no-fp16-speed > "$W/serving_lm_int8.txt" 2>&1
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== s11_gather summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu (exit $tests_rc): $(tail -n 1 "$W/pytest_gpu.log")"
grep -E "^FAILED|^ERROR" "$W/pytest_gpu.log" | head -n 10
grep -E "^ lowvm +int[234]" "$W/gemm_types.log" | tail -n 20
tail -n 12 "$W/serving.txt"
tail -n 6 "$W/serving_lm_int8.txt"
