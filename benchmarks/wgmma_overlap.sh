#!/usr/bin/env bash
# The wgmma GEMM with its multiplies overlapped with the next step's conversion
# (dot_shared(wait=False) + dot_wait: LOWVM_WGMMA_OVERLAP=1, x tiles of <= 128 rows)
# against the waiting form (the default), same schedules, one device call: the wgmma GPU
# tests, compute-
# sanitizer memcheck/racecheck on benchmarks/sanitize_target.py, then M = 64 / 256 / 4096
# on the five Llama shapes for each form (DESIGN's event method).
# Run: bash benchmarks/wgmma_overlap.sh
set -uo pipefail
. benchmarks/device_env.sh wgmma_overlap_out
timeout 200 python -m pytest -q -m gpu -n 4 tests/test_dot_shared.py \
  tests/test_quant_gemm_wgmma.py > "$OUT/pytest_wgmma.log" 2>&1
echo "pytest rc=$?: $(tail -n 1 "$OUT/pytest_wgmma.log")"
for tool in memcheck racecheck; do
  timeout 150 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 \
    python benchmarks/sanitize_target.py > "$OUT/$tool.log" 2>&1
  echo "$tool rc=$?: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$tool.log" | tail -n 1)"
done
for form in wait overlap; do
  flag=$([ "$form" = wait ] && echo 0 || echo 1)
  LOWVM_WGMMA_OVERLAP=$flag timeout 150 python benchmarks/gemm_quick.py --ms "${MS:-64,256,4096}" \
    --wgmma --out "$OUT/wgmma_$form.json" > "$OUT/wgmma_$form.log" 2>&1
  echo "$form rc=$?"
done
echo; echo "== wgmma_overlap summary =="; cat "$OUT/gpu.txt"
python benchmarks/ab_table.py "$OUT/wgmma_wait.json" "$OUT/wgmma_overlap.json" \
  --labels wait,overlap | grep -E "wgmma|kernel" || tail -n 20 "$OUT/wgmma_overlap.log"
