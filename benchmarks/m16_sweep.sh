#!/usr/bin/env bash
# 28672 x 8192 at M = 4 / 16 with the related addresses: the split-8, 4-stage, prefetch-1
# choice measured 19-36 % slower than with per-access ldmatrix addresses (ab_parts.sh);
# which schedule wins now? Then GemLite's own dispatch against the harness adapter
# (benchmarks/gemlite_probe.py), where carried. Run: bash benchmarks/m16_sweep.sh (carry .carry)
set -uo pipefail
. benchmarks/device_env.sh m16_sweep_out
timeout 150 python benchmarks/gemm_quick.py --ms 4,16 --shapes 4 \
  --variants base,prefetch=2/stages=2,prefetch=2/stages=3,stages=2,stages=3,split=4/prefetch=2/stages=2,prefetch=4/stages=0,split=16/x_whole=1792/prefetch=2/stages=0 \
  --out "$OUT/m16_variants.json" > /tmp/m16.log 2>&1
if [ -f benchmarks/gemlite_probe.py ] && [ -d .carry/gemlite_src ]; then
  timeout 240 python benchmarks/gemlite_probe.py --out "$OUT/gemlite_probe.json" > "$OUT/gemlite_probe.log" 2>&1
fi
echo; echo "== m16_sweep summary =="; cat "$OUT/gpu.txt"
python benchmarks/rows_table.py "$OUT/m16_variants.json" --fields split,prefetch,stages,x_whole \
  || tail -n 8 /tmp/m16.log
[ -f "$OUT/gemlite_probe.log" ] && { echo "-- gemlite probe"; tail -n 40 "$OUT/gemlite_probe.log"; }
