#!/usr/bin/env bash
# M = 64 occupancy and wave balance: the one-M-warp schedule with register caps
# (min_blocks 4: 164 -> 128 registers on 8192 x 10240, no spill), two x stages (32 KB of
# shared memory instead of 48), and narrow blocks (bn 32 on 2 warps: twice the blocks),
# on the five Llama shapes, DESIGN's event method. Run: bash benchmarks/m64_occupancy.sh
set -uo pipefail
. benchmarks/device_env.sh m64_occupancy_out
timeout 300 python benchmarks/gemm_quick.py --ms 64 --shapes 0,1,2,3,4 \
  --variants base,min_blocks=4,stages=2,stages=2/min_blocks=4,bn=32/warps_n=2/stages=2,bn=32/warps_n=2/stages=2/min_blocks=8 \
  --out "$OUT/m64_occupancy.json" > /tmp/m64o.log 2>&1
echo; echo "== m64_occupancy summary =="; cat "$OUT/gpu.txt"
python benchmarks/rows_table.py "$OUT/m64_occupancy.json" --fields bn,stages,min_blocks,split \
  || tail -n 8 /tmp/m64o.log
