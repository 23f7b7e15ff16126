#!/usr/bin/env bash
# One device call (ninth session): do more weight bytes in flight per SM make the M = 1
# decode GEMMs faster? Each shape's library choice against deeper prefetch on fewer
# blocks (smaller split), narrow blocks with deep prefetch, and staged weights, in CUDA
# graphs; then Nsight Compute's memory and warp-state sections for 4096x28672's choice
# and its deep-prefetch variant. Writes $OUT (default ./inflight_out) and one tar of it.
set -uo pipefail
. benchmarks/device_env.sh inflight_out
W="$OUT"
run() { sweep "$@" --graph --ms 1; }
run gate_up 4096x28672 "base,bn=32/warps_n=2/prefetch=8,split=2/x_whole=2048/prefetch=2,split=2/x_whole=2048/prefetch=4,x_whole=0/x_rows=0/weights_shared=1/stages=4/prefetch=1,x_whole=0/x_rows=0/weights_shared=1/stages=8/prefetch=1"
run qkv 4096x6144 "base,split=4/x_whole=1024/prefetch=4,split=4/x_whole=1024/prefetch=8,split=2/x_whole=2048/prefetch=8,x_whole=0/x_rows=0/weights_shared=1/stages=4/prefetch=1"
run o 4096x4096 "base,split=4/x_whole=1024/prefetch=4,split=4/x_whole=1024/prefetch=8,split=2/x_whole=2048/prefetch=8"
run down 14336x4096 "base,split=8/x_whole=1792/prefetch=2,split=8/x_whole=1792/prefetch=7,split=4/x_whole=3584/prefetch=4,split=4/x_whole=3584/prefetch=7"
run wide 8192x10240 "base,prefetch=4,split=2/x_whole=4096/prefetch=4,split=2/x_whole=4096/prefetch=8"
run deep 28672x8192 "base,split=4/x_whole=7168/prefetch=2,split=4/x_whole=7168/prefetch=4,split=2/x_whole=14336/prefetch=8"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
timeout 180 "$NCU" --profile-from-start off --clock-control none --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
  --section LaunchStats python benchmarks/ncu_decode.py --m 1 --shapes 4096x28672 \
  --no-cublas --variants base,bn=32/warps_n=2/prefetch=8 > "$OUT/ncu_gate_up.txt" 2>&1
tar -C "$OUT" -czf "$OUT/../inflight.tgz" . && mv "$OUT/../inflight.tgz" "$OUT/"
echo; echo "== inflight_sweep summary =="
cat "$OUT/gpu.txt"
for f in gate_up qkv o down wide deep; do
  echo "-- $f"; sed -n '/^ kernel/,$p' "$OUT/$f.log" | grep -v cublas
  grep -m3 "skipped\|Error\|error" "$OUT/$f.log"
done
grep -E "^  lowvm|Duration|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Registers Per|Issued Warp|Warp Cycles Per Issued" "$OUT/ncu_gate_up.txt" | head -40
