#!/usr/bin/env bash
# The seventh session's last device call: the whole `gpu` suite at the final code, then the
# library's own dispatch (quant_linear: no schedule given) timed by the harness where this
# session changed it: M = 64 / 128 / 256 on the five Llama shapes (quant_gemm up to M = 128,
# the prefill kernel with split K above) and 28672 x 8192 at M = 4 / 16 (x 3 stages).
# Run: bash benchmarks/closing_check.sh   (carry: .carry)
set -uo pipefail
. benchmarks/device_env.sh closing_check_out
timeout 300 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests > "$OUT/pytest_gpu.log" 2>&1
tests_rc=$?
timeout 200 python -m lowvm.bench --m 64,128,256 --baselines cublas_fp16 --no-hbm-measure \
  --out "$OUT/bench_m128_256.json" > "$OUT/bench_m128_256.log" 2>&1
timeout 60 python -m lowvm.bench --shape 28672,8192 --m 4,16 --baselines cublas_fp16 \
  --no-hbm-measure --out "$OUT/bench_70b_down.json" > "$OUT/bench_70b_down.log" 2>&1
echo; echo "== closing_check summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu (exit $tests_rc): $(tail -n 1 "$OUT/pytest_gpu.log")"
grep -E "^FAILED|^ERROR" "$OUT/pytest_gpu.log" | head -n 10
for f in bench_m128_256 bench_70b_down; do
  grep -E "^ *[0-9]+x[0-9]+ +[0-9]+ " "$OUT/$f.log" | awk '{print $1, $2, $3, $4, $5}'
done
