#!/usr/bin/env bash
# The closing device call of a session: the GEMM and nn GPU tests with the correctness
# matrix (8 xdist processes), then the int4 serving measurement at batch 1 and 16.
#   COMMIT=<hash> bash benchmarks/final_check.sh
set -uo pipefail
. benchmarks/device_env.sh final_check_out
timeout 230 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_quant_gemm.py \
  tests/test_quant_gemm_matrix.py tests/test_nn_gpu.py tests/test_fuse.py \
  tests/test_serving_loop.py 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 3
OUT="$OUT" SERVING_BUDGET_S=250 SERVING_TIMEOUT_S=330 \
  bash benchmarks/serving_check.sh int4 1,16 loop 2>&1 | tail -n 16
