#!/usr/bin/env bash
# One device call (ninth session): the tuner's M = 16 find on 4096 x 6144 (split 4,
# prefetch 2, x streamed: 16.8 us against the built-in 19.7, events) on the serving
# model's four projections at M = 16 and 8, in CUDA graphs (as batch-16 decode runs them)
# and event-timed after the write flush.   bash benchmarks/m16_rules.sh  (writes $OUT)
set -uo pipefail
. benchmarks/device_env.sh m16_rules_out
W="$OUT/work"; mkdir -p "$W"
run() {  # name shape variants: in graphs and event-timed
  sweep "$1_graph" "$2" "$3" --graph --ms 16,8
  sweep "$1_events" "$2" "$3" --ms 16,8
}
small="base,split=4/prefetch=2/x_whole=0,split=4/prefetch=1/x_whole=0,split=8/prefetch=1/x_whole=0,split=4/prefetch=2/x_whole=1024"
run qkv 4096x6144 "$small"
run o 4096x4096 "$small"
run gate_up 4096x28672 "base,prefetch=2,split=2/prefetch=2,split=2/prefetch=4"
run down 14336x4096 "base,split=4/prefetch=2/stages=0,split=4/prefetch=4/stages=0,split=8/prefetch=1/stages=0"
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== m16_rules summary =="; cat "$OUT/gpu.txt"
for f in qkv o gate_up down; do for mode in graph events; do
  echo "-- $f $mode"; sed -n '/^ kernel/,$p' "$W/${f}_$mode.log" | grep -v "cublas\| kernel" \
    | awk '{printf "m%-3s split%-3s pf%-2s st%-5s xw%-5s %7s us\n", $5,$6,$7,$8,$12,$13}'
  grep -m2 "skipped\|Error" "$W/${f}_$mode.log" | cut -c1-120
done; done
