#!/usr/bin/env bash
# The ninth session's closing check: the whole `gpu` suite (the single-thread arrive fence,
# the sm_90 bulk L2 prefetch lowering, wgmma at M = 9..16 on wide weights), then the
# decode rows it changes, event-timed after DESIGN.md's write flush and in graphs:
# quant_gemm's choice ("lowvm") against the wgmma dispatch ("wgmma") at M = 9 and 16.
#   bash benchmarks/s9_closing.sh   (writes $OUT: gpu.txt, all.tgz)
set -uo pipefail
. benchmarks/device_env.sh s9_closing_out
W="$OUT/work"; mkdir -p "$W"
timeout 360 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests > "$W/pytest_gpu.log" 2>&1
tests_rc=$?
q="python benchmarks/gemm_quick.py --ms 9,16 --shapes 3,4 --variants base --wgmma"
$q --out "$W/m16_events.json" > "$W/m16_events.log" 2>&1
$q --graph --out "$W/m16_graph.json" > "$W/m16_graph.log" 2>&1
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== s9_closing summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu (exit $tests_rc): $(tail -n 1 "$W/pytest_gpu.log")"
grep -E "^FAILED|^ERROR" "$W/pytest_gpu.log" | head -n 10
for f in m16_events m16_graph; do
  echo "-- $f"; sed -n '/^ kernel/,$p' "$W/$f.log" | cut -c1-110
done
