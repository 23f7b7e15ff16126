#!/usr/bin/env bash
# One device call (ninth session): the wgmma GEMM (weights as the register A operand, x
# read by the tensor cores from shared memory: half the MMA instructions of mma.sync and
# no ldmatrix for x) at decode sizes, 8- and 16-row x tiles, against the library's
# mma.sync choice, in CUDA graphs.
#   bash benchmarks/wgmma_decode_probe.sh   (writes $OUT: gpu.txt, all.tgz)
set -uo pipefail
. benchmarks/device_env.sh wgmma_decode_out
W="$OUT/work"; mkdir -p "$W"
run() {  # name m shape schedules
  sweep "$1_m$2" "$3" base --graph --ms "$2" --wgmma --wgmma-schedules "$4"
}
for m in 1 16; do
  b=8; [ "$m" = 16 ] && b=16
  run gate_up $m 4096x28672 "$b:64:1:2:1:1,$b:64:1:2:1:2,$b:64:1:3:1:2,$b:64:1:2:1:4,$b:128:2:2:1:1"
  run qkv $m 4096x6144 "$b:64:1:2:8:1,$b:64:1:4:8:1,$b:64:1:2:4:2,$b:64:1:2:4:1"
  run o $m 4096x4096 "$b:64:1:2:8:1,$b:64:1:4:8:1,$b:64:1:2:4:2"
  run down $m 14336x4096 "$b:64:1:2:16:1,$b:64:1:4:16:1,$b:64:1:2:8:2,$b:64:1:2:8:1"
  run wide $m 8192x10240 "$b:64:1:2:4:2,$b:64:1:2:4:1,$b:64:1:3:4:1"
  run deep $m 28672x8192 "$b:64:1:2:8:1,$b:64:1:4:8:1,$b:64:1:2:4:2"
done
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== wgmma_decode_probe summary =="
cat "$OUT/gpu.txt"
for f in "$W"/*.log; do
  echo "-- $(basename "$f")"; sed -n '/^ kernel/,$p' "$f" | grep -v "cublas\|kernel " \
    | awk '{printf "%-6s m%-3s split%-3s pf%-2s st%-5s bn%-4s %7s us  err %s\n", $1,$5,$6,$7,$8,$11,$13,$17}'
  grep -m2 "skipped\|Error" "$f" | cut -c1-150
done
