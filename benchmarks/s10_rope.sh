#!/usr/bin/env bash
# The tenth session's fifth device call: a fused model's decode step runs rotary embedding, the
# static cache's update and attention as one kernel (decode_attention_rope); the loop's greedy
# pick is a two-stage argmax. As in the fourth call (the bool mask viewed inside the op (inductor cannot
# lower a bool->uint8 view), 3 tiles in flight, MAX_LENGTH 8192; as before: reductions in registers
# (shuffle_plan) and its mask load ahead of the K/V wait. GPU tests of the reductions and
# the attention, the attention alone per cache length, then the serving loop at batch 1 for
# int4/int3/int2 (lowvm attention) against float16 (SDPA and lowvm attention).
#   bash benchmarks/s10_rope.sh   (writes $OUT: gpu.txt, all.tgz)
set -uo pipefail
. benchmarks/device_env.sh s10_rope_out
W="$OUT/work"; mkdir -p "$W"
timeout 150 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_decode_attention.py \
  tests/test_reduce_shuffles.py tests/test_nn_gpu.py tests/test_fuse.py tests/test_serving_loop.py > "$W/pytest_gpu.log" 2>&1
tests_rc=$?
timeout 60 python benchmarks/attention_bench.py --lengths 144,1024,8192 \
  --batches 1,16 --json "$W/attention_bench.json" > "$W/attention_bench.log" 2>&1
OUT="$W" SERVING_BUDGET_S=280 SERVING_TIMEOUT_S=340 bash benchmarks/serving_check.sh \
  int4,int3,int2 1 loop --fp16-attention sdpa,lowvm > "$W/serving.txt" 2>&1
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== s10_rope summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu (exit $tests_rc): $(tail -n 1 "$W/pytest_gpu.log")"
grep -E "^FAILED|^ERROR" "$W/pytest_gpu.log" | head -n 10
tail -n 11 "$W/attention_bench.log"
tail -n 14 "$W/serving.txt"
