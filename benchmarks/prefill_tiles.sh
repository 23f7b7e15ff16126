#!/usr/bin/env bash
# Smaller prefill tiles at M = 128 / 256 / 512: quant_gemm_prefill's 128 x 64 tiles on 2 x 2
# warps (168 registers, two blocks per SM) against its 256 x 128 default (with the split
# prefill_split gives) and quant_gemm, DESIGN's event method. Run: bash benchmarks/prefill_tiles.sh
set -uo pipefail
. benchmarks/device_env.sh prefill_tiles_out
timeout 400 python benchmarks/gemm_quick.py --ms 128,256,512 --shapes 0,1,2,3,4 \
  --prefill-kernel quant_gemm_prefill --prefill-schedules 128:64:2:2:2,128:64:2:2:3 \
  --out "$OUT/prefill_tiles.json" > /tmp/pt.log 2>&1
echo; echo "== prefill_tiles summary =="; cat "$OUT/gpu.txt"
python benchmarks/rows_table.py "$OUT/prefill_tiles.json" --fields bm,bn,stages,split \
  || tail -n 8 /tmp/pt.log
