#!/usr/bin/env bash
# The tenth session's first device call: decode attention on the VM program
# (lowvm.use_decode_attention). GPU tests of the kernel and of the layers/fusion/loop it
# plugs into, the attention alone against transformers' SDPA path per cache length, then
# the serving loop at batch 1: float16 (SDPA and lowvm attention) against int4 with lowvm
# attention.   bash benchmarks/s10_attention.sh   (writes $OUT: gpu.txt, all.tgz)
set -uo pipefail
. benchmarks/device_env.sh s10_attention_out
W="$OUT/work"; mkdir -p "$W"
timeout 200 python -m pytest -m gpu -q -p no:cacheprovider -n 8 tests/test_decode_attention.py \
  tests/test_nn_gpu.py tests/test_fuse.py tests/test_serving_loop.py > "$W/pytest_gpu.log" 2>&1
tests_rc=$?
timeout 90 python benchmarks/attention_bench.py --lengths 144,512,1024,2048,4096 \
  --batches 1,16 --json "$W/attention_bench.json" > "$W/attention_bench.log" 2>&1
OUT="$W" SERVING_BUDGET_S=200 SERVING_TIMEOUT_S=260 bash benchmarks/serving_check.sh int4 1 loop \
  --fp16-attention sdpa,lowvm > "$W/serving.txt" 2>&1
tar -C "$W" -czf "$OUT/all.tgz" .
echo; echo "== s10_attention summary =="; cat "$OUT/gpu.txt"
echo "pytest -m gpu (exit $tests_rc): $(tail -n 1 "$W/pytest_gpu.log")"
grep -E "^FAILED|^ERROR" "$W/pytest_gpu.log" | head -n 10
tail -n 7 "$W/attention_bench.log"
tail -n 12 "$W/serving.txt"
