#!/usr/bin/env bash
# One device call (ninth session): the decode GEMMs at M = 1 with x held whole and the
# weights asked into the L2 `l2_ahead` steps beyond the registers, one
# cp.async.bulk.prefetch.L2 per tile on sm_90, in CUDA graphs; plus the GPU tests of it.
#   bash benchmarks/l2_bulk_sweep.sh   (writes $OUT, default ./l2_bulk_out: gpu.txt, all.tgz)
set -uo pipefail
. benchmarks/device_env.sh l2_bulk_out
W="$OUT/work"; mkdir -p "$W"
timeout 150 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_quant_gemm.py \
  -k "x_steps_match or x_whole_match" > "$W/pytest.log" 2>&1
run() { sweep "$@" --graph --ms "${MS:-1}"; }
run gate_up 4096x28672 "base,l2_ahead=2,l2_ahead=4,l2_ahead=8,prefetch=2/l2_ahead=4,prefetch=2/l2_ahead=8,prefetch=1/l2_ahead=8"
run qkv 4096x6144 "base,l2_ahead=1,l2_ahead=3"
run o 4096x4096 "base,l2_ahead=1,l2_ahead=3"
run down 14336x4096 "base,l2_ahead=2,l2_ahead=4,l2_ahead=6"
run wide 8192x10240 "base,l2_ahead=2,l2_ahead=4,l2_ahead=8"
run deep 28672x8192 "base,l2_ahead=2,l2_ahead=4,l2_ahead=8"
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== l2_bulk_sweep summary =="
cat "$OUT/gpu.txt"; tail -n 2 "$W/pytest.log"
for f in gate_up qkv o down wide deep; do
  echo "-- $f"; sed -n '/^ kernel/,$p' "$W/$f.log" | grep -v cublas | cut -c1-100
  grep -m3 "skipped\|Error" "$W/$f.log"
done
