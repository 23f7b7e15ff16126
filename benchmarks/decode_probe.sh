#!/usr/bin/env bash
# One device call (ninth session): where the decode GEMMs' time goes, by Nsight Compute
# (one launch per shape at M = 1 and 16, cuBLAS fp16 beside them at M = 1), and the
# single-thread arrive fence against the first lowering (LOWVM_ARRIVE_FENCE=all) in graphs.
#   bash benchmarks/decode_probe.sh    (writes $OUT, default ./decode_probe_out)
set -uo pipefail
. benchmarks/device_env.sh decode_probe_out
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
export PATH="$(dirname "$NCU"):$PATH"
timeout 200 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_quant_gemm.py \
  tests/test_instructions.py -k "arrive or split or x_whole or matches_float64" 2>&1 \
  | tail -n 3 > "$OUT/pytest_arrive.log"
for m in 1 16; do
  extra=""; [ "$m" = 16 ] && extra="--no-cublas"
  timeout 240 ncu --profile-from-start off --clock-control none --set full \
    -o "$OUT/ncu_m$m" python benchmarks/ncu_decode.py --m $m $extra > "$OUT/ncu_m$m.log" 2>&1
  python benchmarks/ncu_summary.py "$OUT/ncu_m$m.ncu-rep" --json "$OUT/ncu_m$m.json" \
    > "$OUT/ncu_m$m.txt" 2>&1
done
ncu --import "$OUT/ncu_m1.ncu-rep" --page details > "$OUT/ncu_m1_details.txt" 2>&1
q="python benchmarks/gemm_quick.py --graph --ms 1,16 --shapes 1,4096x4096,2,3,4,0"
LOWVM_ARRIVE_FENCE=all $q --out "$OUT/fence_all.json" > "$OUT/fence_all.log" 2>&1
$q --out "$OUT/fence_one.json" > "$OUT/fence_one.log" 2>&1
echo; echo "== decode_probe summary =="
cat "$OUT/gpu.txt" "$OUT/pytest_arrive.log"
for m in 1 16; do echo "-- ncu M=$m"; tail -n 5 "$OUT/ncu_m$m.log"; cat "$OUT/ncu_m$m.txt"; done
for f in fence_all fence_one; do echo "-- $f"; sed -n '/^ kernel/,$p' "$OUT/$f.log"; done
