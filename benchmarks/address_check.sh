#!/usr/bin/env bash
# The related-address lowering (codegen/thread_offsets.py) on the GPU, in one device call:
# the whole `gpu` suite (every kernel's addresses changed), then the GEMMs timed with the
# per-access lowering (LOWVM_PLAIN_ADDRESSES=1, "plain") and the related one ("related"),
# each in its own process of the same run: DESIGN's method (events after the 512 MB write
# flush, median of 30) at M = 16..4096 with quant_gemm_prefill for M > 64, and inside a
# CUDA graph at M = 1 and 16. GemLite's source rides along in .carry (carry_gemlite.sh).
# Run: bash benchmarks/address_check.sh   (carry: .carry)
set -uo pipefail
. benchmarks/device_env.sh address_check_out
timeout 270 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests > "$OUT/pytest_gpu.log" 2>&1
tests_rc=$?
for mode in plain related; do
  flag=$([ "$mode" = plain ] && echo 1 || echo 0)
  LOWVM_PLAIN_ADDRESSES=$flag timeout 100 python benchmarks/gemm_quick.py --ms 16,64,256,4096 --shapes 0,1,3 \
    --prefill-kernel quant_gemm_prefill --out "$OUT/ab_events_$mode.json" > "/tmp/ab_events_$mode.log" 2>&1
  LOWVM_PLAIN_ADDRESSES=$flag timeout 50 python benchmarks/gemm_quick.py --ms 1,16 --graph \
    --out "$OUT/ab_graph_$mode.json" > "/tmp/ab_graph_$mode.log" 2>&1
done
echo; echo "== address_check summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu (exit $tests_rc):"; grep -E "passed|failed|error" "$OUT/pytest_gpu.log" | tail -n 3
grep -E "^FAILED|^ERROR" "$OUT/pytest_gpu.log" | head -n 15
for t in events graph; do
  echo "-- $t (plain = per-access addresses, related = base + constant; same run)"
  python benchmarks/ab_table.py "$OUT/ab_${t}_plain.json" "$OUT/ab_${t}_related.json" \
    --labels plain,related || tail -n 5 "/tmp/ab_${t}_related.log"
done
