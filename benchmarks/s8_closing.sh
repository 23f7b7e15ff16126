#!/usr/bin/env bash
# The eighth session's last device call, at the final code: the whole `gpu` suite (the
# wgmma kernel's waiting and overlapped forms included), compute-sanitizer memcheck and
# racecheck on benchmarks/sanitize_target.py (which runs the wgmma kernel on sm_90).
# Run: bash benchmarks/s8_closing.sh
set -uo pipefail
. benchmarks/device_env.sh s8_closing_out
timeout 330 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests > "$OUT/pytest_gpu.log" 2>&1
tests_rc=$?
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --report-api-errors no --error-exitcode 9 \
    python benchmarks/sanitize_target.py > "$OUT/$tool.log" 2>&1
  echo "$tool rc=$?: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$tool.log" | tail -n 1)"
done
echo; echo "== s8_closing summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu (exit $tests_rc): $(tail -n 1 "$OUT/pytest_gpu.log")"
grep -E "^FAILED|^ERROR" "$OUT/pytest_gpu.log" | head -n 10
