#!/usr/bin/env bash
# The tenth session's full GPU suite (every `gpu` test, 8 processes) at the final kernels.
#   bash benchmarks/s10_gpu_suite.sh   (writes $OUT: gpu.txt, pytest_gpu.log)
set -uo pipefail
. benchmarks/device_env.sh s10_gpu_suite_out
timeout 480 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests > "$OUT/pytest_gpu.log" 2>&1
rc=$?
echo; echo "== s10_gpu_suite summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu (exit $rc): $(tail -n 1 "$OUT/pytest_gpu.log")"
grep -E "^FAILED|^ERROR" "$OUT/pytest_gpu.log" | head -n 20
