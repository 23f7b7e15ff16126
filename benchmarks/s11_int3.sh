#!/usr/bin/env bash
# The eleventh session's first device call: 3/5/6/7-bit codes stored so that codes i and
# i + 16 (i + 8 for 6 bits) share a lane position in two words (the cast splices the words:
# int3 44 operations per 32 codes, was 76); split-K buffers allocated by a helper thread
# (outside CUDA-graph trees' pools). GPU tests of the casts, GEMMs, layers and graph trees,
# the decode GEMMs of int4/int3/int2 at M = 1 and 16 in CUDA graphs, then the serving loop
# at batch 1 for int4/int3/int2 against float16.
#   bash benchmarks/s11_int3.sh   (writes $OUT: gpu.txt, all.tgz)
set -uo pipefail
. benchmarks/device_env.sh s11_int3_out
W="$OUT/work"; mkdir -p "$W"
timeout 200 python -m pytest -m gpu -q -p no:cacheprovider -n 8 --runxfail \
  tests/test_fast_cast.py tests/test_quant_gemm.py tests/test_quant_gemm_prefill.py \
  tests/test_repack_program.py tests/test_nn_gpu.py \
  tests/test_decode_attention.py::test_gpu_fused_int4_model_rope_steps_under_cuda_graphs \
  > "$W/pytest_gpu.log" 2>&1
tests_rc=$?
timeout 120 python benchmarks/gemm_quick.py --ms 1,16 --types int4,int3,int2 --variants base \
  --graph --out "$W/gemm_types.json" > "$W/gemm_types.log" 2>&1
OUT="$W" SERVING_BUDGET_S=200 SERVING_TIMEOUT_S=260 bash benchmarks/serving_check.sh \
  int4,int3,int2 1 loop > "$W/serving.txt" 2>&1
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== s11_int3 summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu (exit $tests_rc): $(tail -n 1 "$W/pytest_gpu.log")"
grep -E "^FAILED|^ERROR" "$W/pytest_gpu.log" | head -n 10
grep -E "int[234]" "$W/gemm_types.log" | tail -n 40
tail -n 12 "$W/serving.txt"
