#!/usr/bin/env bash
# M = 16 where 16 rows of x for a block's K range do not fit 32 KB (x streamed): a larger
# split so that they do (x held whole), or x held whole in 64 KB, against the choice;
# DESIGN's event method and inside a CUDA graph. Run: bash benchmarks/m16_x_whole.sh
set -uo pipefail
. benchmarks/device_env.sh m16_x_whole_out
run() {  # shape, variants, tag
  timeout 80 python benchmarks/gemm_quick.py --ms 16 --shapes "$1" --variants "base,$2" \
    --out "$OUT/m16xw_$3.json" > "/tmp/m16xw_$3.log" 2>&1
  timeout 80 python benchmarks/gemm_quick.py --ms 16 --shapes "$1" --variants "base,$2" --graph \
    --out "$OUT/m16xw_$3_graph.json" > "/tmp/m16xw_$3_graph.log" 2>&1
}
run 8192x10240 "split=8/x_whole=1024/stages=0/prefetch=2,split=8/x_whole=1024/stages=0/prefetch=4,x_whole=2048/stages=0/prefetch=4" a
run 28672x8192 "split=16/x_whole=1792/stages=0/prefetch=2,split=16/x_whole=1792/stages=0/prefetch=1" b
run 4096x28672 "split=4/x_whole=1024/stages=0/prefetch=2,split=2/x_whole=2048/stages=0/prefetch=4,split=4/x_whole=1024/stages=0/prefetch=4" c
echo; echo "== m16_x_whole summary =="; cat "$OUT/gpu.txt"
for t in a a_graph b b_graph c c_graph; do
  echo "-- $t"; python benchmarks/rows_table.py "$OUT/m16xw_$t.json" \
    --fields split,prefetch,stages,x_whole || tail -n 4 "/tmp/m16xw_$t.log"
done
