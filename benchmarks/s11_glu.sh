#!/usr/bin/env bash
# The eleventh session's third device call: the MLP's down GEMM computes its x as
# silu(gate) * up while it reads the row (x_glu, fused models at M = 1: no activation
# kernel); 3/5/6/7-bit straddling pairs gathered with one prmt. GPU tests of the GEMMs
# (every type, the matrix), the layers, fusion, the serving loop and decode attention;
# the serving loop at batch 1 (int4/int3/int2 against float16), then int4 with lm_head in
# int8 (--lm-head int8).
#   bash benchmarks/s11_glu.sh   (writes $OUT: gpu.txt, all.tgz)
set -uo pipefail
. benchmarks/device_env.sh s11_glu_out
W="$OUT/work"; mkdir -p "$W"
timeout 200 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_quant_gemm.py \
  tests/test_quant_gemm_matrix.py tests/test_nn_gpu.py tests/test_fuse.py \
  tests/test_serving_loop.py tests/test_decode_attention.py > "$W/pytest_gpu.log" 2>&1
tests_rc=$?
OUT="$W" SERVING_BUDGET_S=170 SERVING_TIMEOUT_S=220 bash benchmarks/serving_check.sh \
  int4,int3,int2 1 loop > "$W/serving.txt" 2>&1
OUT="$W" SERVING_BUDGET_S=50 SERVING_TIMEOUT_S=100 bash benchmarks/serving_check.sh \
  int4 1 loop --lm-head int8 --no-fp16-speed > "$W/serving_lm_int8.txt" 2>&1
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== s11_glu summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu (exit $tests_rc): $(tail -n 1 "$W/pytest_gpu.log")"
grep -E "^FAILED|^ERROR" "$W/pytest_gpu.log" | head -n 10
tail -n 12 "$W/serving.txt"
tail -n 8 "$W/serving_lm_int8.txt"
