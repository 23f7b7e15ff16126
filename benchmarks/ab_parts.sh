#!/usr/bin/env bash
# Which part of the related-address lowering slows 28672 x 8192 at M = 4 / 16 (streamed
# x, 4 stages, split 8: 61.3 -> 73.1 and 68.5 -> 93.0 us, m256_check.sh)? The GEMMs timed
# with LOWVM_PLAIN_ADDRESSES = 1 (all per-access), cp_async, ldmatrix (those per-access)
# and 0 (all related), each in its own process of this run; then 4096 x 28672 as control.
# Run: bash benchmarks/ab_parts.sh
set -uo pipefail
. benchmarks/device_env.sh ab_parts_out
for v in 1 cp_async ldmatrix 0; do
  LOWVM_PLAIN_ADDRESSES=$v timeout 100 python benchmarks/gemm_quick.py --ms 4,16 --shapes 4,0 \
    --out "$OUT/ab_parts_$v.json" > "/tmp/ab_parts_$v.log" 2>&1
done
echo; echo "== ab_parts summary =="; cat "$OUT/gpu.txt"
python - "$OUT" <<'PY'
import json, sys
runs = {v: {(r["kernel"], r["k"], r["n"], r["m"]): r["us"]
            for r in json.load(open(f"{sys.argv[1]}/ab_parts_{v}.json"))["rows"]}
        for v in ("1", "cp_async", "ldmatrix", "0")}
print(" plain: all per-access | cp_async / ldmatrix: that part per-access | 0: all related")
print(f" {'kernel':<12}{'K':>6}{'N':>7}{'M':>4}" + "".join(f"{v:>10}" for v in runs))
for key in runs["1"]:
    print(f" {key[0]:<12}{key[1]:>6}{key[2]:>7}{key[3]:>4}"
          + "".join(f"{runs[v].get(key, float('nan')):>10.1f}" for v in runs))
PY
