#!/usr/bin/env bash
# Everything the GPU must prove, in one device call: the `gpu` tests, compute-sanitizer
# memcheck and racecheck on the quantized matmul, and the launch-overhead benchmark.
# Run from the repository root on the device: bash benchmarks/gpu_check.sh
# Full logs go to $OUT (or ./gpu_check_out); a short table is printed last.
# With pytest-xdist (on the device image) the tests run in 8 processes, whose kernel
# compiles then overlap, and the GEMM correctness matrix (tests/test_quant_gemm_matrix.py)
# runs in the same call; without it the matrix does not fit one 10-minute call:
# `bash benchmarks/gpu_check.sh matrix` runs only it.
set -uo pipefail
. benchmarks/device_env.sh gpu_check_out

if [ "${1:-}" = "matrix" ]; then
  python -m pytest -m gpu -q -p no:cacheprovider tests/test_quant_gemm_matrix.py 2>&1 \
    | tee "$OUT/pytest_gpu_matrix.log"
  exit "${PIPESTATUS[0]}"
fi
if python -c "import xdist" 2>/dev/null; then
  python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests 2>&1 | tee "$OUT/pytest_gpu.log"
else
  python -m pytest -m gpu -q -p no:cacheprovider --ignore=tests/test_quant_gemm_matrix.py \
    tests 2>&1 | tee "$OUT/pytest_gpu.log"
fi
tests_rc=${PIPESTATUS[0]}
compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 python benchmarks/sanitize_target.py \
  > "$OUT/memcheck.log" 2>&1
memcheck_rc=$?
compute-sanitizer --tool racecheck --report-api-errors no --error-exitcode 9 python benchmarks/sanitize_target.py \
  > "$OUT/racecheck.log" 2>&1
racecheck_rc=$?
python benchmarks/launch_overhead.py --out "$OUT/launch_overhead.json" 2>&1 | tee "$OUT/launch.log"

echo
echo "== gpu_check summary =="
echo "gpu:        $(cat "$OUT/gpu.txt")"
echo "pytest -m gpu: $(tail -n 1 "$OUT/pytest_gpu.log")  (exit $tests_rc)"
echo "memcheck:   $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -n 1)  (exit $memcheck_rc)"
echo "racecheck:  $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$OUT/racecheck.log" | tail -n 1)  (exit $racecheck_rc)"
echo "launch:     $(grep -iE 'us|µs' "$OUT/launch.log" | tail -n 2 | tr '\n' ' ')"
