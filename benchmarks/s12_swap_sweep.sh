#!/usr/bin/env bash
# Does the swapped batch-1 GEMM (swap_ab, fewer registers: 72-88 instead of 96-114 on
# 4096 x 28672) want other split / prefetch depths than the type-blind choice fitted for x
# as the A operand? int4 and int3 around the choice on the Llama-3-8B layer shapes, M = 1,
# CUDA graphs.
#   bash benchmarks/s12_swap_sweep.sh   (writes $OUT: gpu.txt, all.tgz)
set -uo pipefail
. benchmarks/device_env.sh s12_swap_sweep_out
W="$OUT/work"; mkdir -p "$W"
opts=(--ms 1 --types int4,int3 --graph)
sweep gate_up 0 "base,prefetch=2,prefetch=8,split=2/x_whole=2048/prefetch=2,split=2/x_whole=2048/prefetch=4" "${opts[@]}"
sweep qkv 1 "base,prefetch=2,split=4/x_whole=1024/prefetch=2,split=4/x_whole=1024,split=16/x_whole=256" "${opts[@]}"
sweep down 2 "base,split=8/x_whole=1792/prefetch=2,split=8/x_whole=1792,split=4/x_whole=3584/prefetch=2,split=4/x_whole=3584/prefetch=4" "${opts[@]}"
sweep o 4096x4096 "base,prefetch=2,prefetch=4,split=4/x_whole=1024/prefetch=2,split=16/x_whole=256" "${opts[@]}"
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== s12_swap_sweep summary =="; cat "$OUT/gpu.txt"
for f in gate_up qkv down o; do echo "-- $f"; grep -E "^ lowvm +int[34]" "$W/$f.log"; tail -n 2 "$W/$f.log" | grep -i error; done
