#!/usr/bin/env bash
# After the related-address lowering, do the fitted schedule choices still win? One device
# call: the M = 64 schedule variants on the five Llama shapes (DESIGN's event method), and
# the decode GEMMs at M = 1 and 16 inside a CUDA graph with the per-access (plain) and the
# related lowering, each in its own process of the same run.
# Run: bash benchmarks/sweep_check.sh   (carry: .carry)
set -uo pipefail
. benchmarks/device_env.sh sweep_check_out
timeout 200 python benchmarks/gemm_quick.py --ms 64 --shapes 0,1,2,3,4 \
  --variants base,split=2,stages=2,stages=4,k_slice=16,k_slice=32,warps_m=2/k_slice=0,min_blocks=2 \
  --out "$OUT/m64_variants.json" > /tmp/m64.log 2>&1
for mode in plain related; do
  flag=$([ "$mode" = plain ] && echo 1 || echo 0)
  LOWVM_PLAIN_ADDRESSES=$flag timeout 110 python benchmarks/gemm_quick.py --ms 1,16 --graph \
    --shapes 0,1,2 --out "$OUT/ab_graph_$mode.json" > "/tmp/ab_graph_$mode.log" 2>&1
done
echo; echo "== sweep_check summary =="; cat "$OUT/gpu.txt"
echo "-- M = 64 variants (us, events after the write flush)"
python benchmarks/rows_table.py "$OUT/m64_variants.json" --fields split,stages,k_slice,warps_m,min_blocks \
  || tail -n 5 /tmp/m64.log
echo "-- graph, M = 1 / 16 (plain = per-access addresses, related = base + constant)"
python benchmarks/ab_table.py "$OUT/ab_graph_plain.json" "$OUT/ab_graph_related.json" \
  --labels plain,related || tail -n 5 /tmp/ab_graph_related.log
