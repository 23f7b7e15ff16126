#!/usr/bin/env bash
# The eleventh session's last device call: does int3 have better decode schedules than the
# type-blind choice on the Llama-3-8B layer shapes (M = 1, CUDA graphs)? int3 and int4 on
# each shape's choice and neighbours (prefetch depth, split with the row held whole).
#   bash benchmarks/s11_int3_sweep.sh   (writes $OUT: gpu.txt, all.tgz)
set -uo pipefail
. benchmarks/device_env.sh s11_int3_sweep_out
W="$OUT/work"; mkdir -p "$W"
sweep gate_up 0 "base,prefetch=2,prefetch=8,split=2/x_whole=2048/prefetch=2,split=2/x_whole=2048/prefetch=4" --ms 1 --types int3,int4 --graph
sweep qkv 1 "base,prefetch=2,prefetch=4,split=4/x_whole=1024/prefetch=2,split=16/x_whole=256" --ms 1 --types int3,int4 --graph
sweep down 2 "base,split=8/x_whole=1792/prefetch=2,split=8/x_whole=1792,split=4/x_whole=3584/prefetch=2" --ms 1 --types int3,int4 --graph
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== s11_int3_sweep summary =="; cat "$OUT/gpu.txt"
for f in gate_up qkv down; do grep -E "^ lowvm +int[34]" "$W/$f.log"; tail -n 2 "$W/$f.log" | grep -i error; done
