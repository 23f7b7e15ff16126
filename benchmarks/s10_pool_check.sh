#!/usr/bin/env bash
# Split-K buffers allocated by a helper thread: the generate + CUDA-graph-trees tests of the
# rope path (which found the pool leak) and the split-K graph tests.
#   bash benchmarks/s10_pool_check.sh   (writes $OUT: gpu.txt, pytest_gpu.log)
set -uo pipefail
. benchmarks/device_env.sh s10_pool_check_out
timeout 150 python -m pytest -m gpu -q -p no:cacheprovider -n 4 tests/test_decode_attention.py \
  tests/test_quant_gemm.py tests/test_nn_gpu.py -k "cuda_graphs or split or graph or compile" \
  > "$OUT/pytest_gpu.log" 2>&1
rc=$?
echo "pytest -m gpu (exit $rc): $(tail -n 1 "$OUT/pytest_gpu.log")"
grep -E "^FAILED|^ERROR" "$OUT/pytest_gpu.log" | head -n 10
