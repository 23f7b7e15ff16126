#!/usr/bin/env bash
# M = 128 / 256 with quant_gemm_prefill split along K (its 256 x 128 tiles give few blocks
# there: 32 on 14336 x 4096), and two rows of the harness run re-timed with the per-access
# (plain) and the related address lowering: 4096 x 6144 at M = 4 (120.5 us, an outlier?)
# and 28672 x 8192 at M = 16 (92.6 us, 69.2 the session before). DESIGN's event method.
# Run: bash benchmarks/m256_check.sh
set -uo pipefail
. benchmarks/device_env.sh m256_check_out
timeout 300 python benchmarks/gemm_quick.py --ms 128,256 --shapes 0,1,2,3,4 \
  --prefill-kernel quant_gemm_prefill \
  --prefill-schedules 256:128:4:2:2:1,256:128:4:2:2:2,256:128:4:2:2:4,256:128:4:2:2:8 \
  --out "$OUT/m256_prefill_split.json" > /tmp/m256.log 2>&1
for mode in plain related; do
  flag=$([ "$mode" = plain ] && echo 1 || echo 0)
  LOWVM_PLAIN_ADDRESSES=$flag timeout 100 python benchmarks/gemm_quick.py --ms 4,16 \
    --shapes 1,4 --out "$OUT/ab_m4_m16_$mode.json" > "/tmp/ab_$mode.log" 2>&1
done
echo; echo "== m256_check summary =="; cat "$OUT/gpu.txt"
python benchmarks/rows_table.py "$OUT/m256_prefill_split.json" --fields split \
  || tail -n 8 /tmp/m256.log
echo "-- M = 4 / 16 (plain = per-access addresses, related = base + constant; same run)"
python benchmarks/ab_table.py "$OUT/ab_m4_m16_plain.json" "$OUT/ab_m4_m16_related.json" \
  --labels plain,related || tail -n 5 /tmp/ab_related.log
