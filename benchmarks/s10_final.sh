#!/usr/bin/env bash
# The tenth session's final device call: the GPU tests of what changed since the full suite
# (split-K buffers allocated outside CUDA-graph pools; the rope-path tests), then issue 6's
# serving loop: int4/int3/int2 against float16 at batch 1 and 16 (quantized models fused, on
# lowvm attention), and int4 with lm_head quantized too at batch 1.
#   bash benchmarks/s10_final.sh   (writes $OUT: gpu.txt, all.tgz)
set -uo pipefail
. benchmarks/device_env.sh s10_final_out
W="$OUT/work"; mkdir -p "$W"
timeout 110 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_decode_attention.py \
  tests/test_quant_gemm.py -k "decode or rope or split or graph" > "$W/pytest_gpu.log" 2>&1
tests_rc=$?
OUT="$W" SERVING_BUDGET_S=270 SERVING_TIMEOUT_S=320 bash benchmarks/serving_check.sh \
  int4,int3,int2 1,16 loop > "$W/serving.txt" 2>&1
OUT="$W" SERVING_BUDGET_S=60 SERVING_TIMEOUT_S=110 bash benchmarks/serving_check.sh \
  int4 1 loop --skip "" --no-fp16-speed > "$W/serving_lm_head.txt" 2>&1
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== s10_final summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu (exit $tests_rc): $(tail -n 1 "$W/pytest_gpu.log")"
grep -E "^FAILED|^ERROR" "$W/pytest_gpu.log" | head -n 10
tail -n 15 "$W/serving.txt"
tail -n 6 "$W/serving_lm_head.txt"
