#!/usr/bin/env bash
# The twelfth session's first device call: the batch-1 decode GEMM with (a) the old
# per-access global addresses (LOWVM_PLAIN_ADDRESSES=global_vector) and x as the MMA's A
# operand, (b) the related global addresses (one pointer per load, constant offsets) and x
# as A, (c) the related addresses and the weights as A (swap_ab, the new choice at M = 1);
# int4/int3/int2 on the Llama-3-8B layer shapes in CUDA graphs; then the GEMM's GPU tests.
#   bash benchmarks/s12_swap.sh   (writes $OUT: gpu.txt, all.tgz)
set -uo pipefail
. benchmarks/device_env.sh s12_swap_out
W="$OUT/work"; mkdir -p "$W"
shapes="0,1,2,4096x4096"
LOWVM_PLAIN_ADDRESSES=global_vector sweep plain "$shapes" "swap_ab=0" --ms 1 \
  --types int4,int3,int2 --graph
sweep related "$shapes" "swap_ab=0,base" --ms 1 --types int4,int3,int2 --graph
timeout 200 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_quant_gemm.py \
  > "$W/pytest_gemm.log" 2>&1
tests_rc=$?
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== s12_swap summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu tests/test_quant_gemm.py (exit $tests_rc): $(tail -n 1 "$W/pytest_gemm.log")"
grep -E "^FAILED|^ERROR" "$W/pytest_gemm.log" | head -n 20
for f in plain related; do echo "-- $f"; grep -E "^ lowvm +int[234]" "$W/$f.log"; tail -n 2 "$W/$f.log" | grep -i error; done
