"""One decode-shaped quant_gemm launch to profile with ncu (see benchmarks/NOTES.md).

Usage on the device: ncu --set full -k regex:quant_gemm -c 1 python benchmarks/profile_decode.py
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import torch

from lowvm.kernels.library import choose_schedule, prepare_weight, quant_linear, quantize_to_codes

ap = argparse.ArgumentParser()
ap.add_argument("--k", type=int, default=4096)
ap.add_argument("--n", type=int, default=28672)
ap.add_argument("--m", type=int, default=1)
ap.add_argument("--prefetch", type=int, default=0)
ap.add_argument("--staged", type=int, default=-1,
                help="N > 0: weights staged in shared memory N deep; 0: register prefetch; "
                     "-1 (default): the library's choice")
args = ap.parse_args()
rng = np.random.default_rng(0)
codes, scales = quantize_to_codes(rng.standard_normal((args.n, args.k), dtype=np.float32),
                                  "int4", 128)
qw = prepare_weight(codes, scales, "int4", 128)
x = torch.randn(args.m, args.k, device="cuda", dtype=torch.float16)
s = choose_schedule(args.m, args.n, args.k, qw.bk)
if args.prefetch:
    s = dataclasses.replace(s, prefetch=args.prefetch)
if args.staged >= 0:
    s = dataclasses.replace(s, stages=args.staged or None,
                            prefetch=1 if args.staged else (args.prefetch or 4),
                            weights_shared=args.staged > 0)
for _ in range(3):
    quant_linear(x, qw, s)
torch.cuda.synchronize()
print("schedule", s)
