"""The decode GEMMs (and cuBLAS fp16 on the same shapes) once each, for Nsight Compute.

Every kernel is compiled and run once before ``cudaProfilerStart``, so under
``ncu --profile-from-start off`` only one launch per (shape, kernel) is profiled; ncu
flushes the caches before each of its passes (cold weights, as in a decode step).
Usage (on the device):
  ncu --profile-from-start off --clock-control none --set full -o rep \
      python benchmarks/ncu_decode.py --m 1 --shapes 4096x6144,4096x4096
then ``python benchmarks/ncu_summary.py rep.ncu-rep`` for the table.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from lowvm.dtypes import dtype as as_dtype
from lowvm.kernels.gemm_schedule import with_fields
from lowvm.kernels.library import choose_schedule, prepare_weight, quant_linear


def prepared(k: int, n: int, tname: str, group: int = 128):
    """A prepared weight of random codes and scales (their values do not change the time)."""
    wt = as_dtype(tname)
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 2 ** wt.nbits, size=(n, k), dtype=np.uint8)  # bit patterns
    scales = (rng.random((k // group, n), dtype=np.float32) * 0.01 + 0.001).astype(np.float16)
    return prepare_weight(codes, scales, wt, group)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--type", default="int4")
    ap.add_argument("--shapes", default="4096x6144,4096x4096,4096x28672,14336x4096,"
                    "8192x10240,28672x8192")
    ap.add_argument("--no-cublas", action="store_true")
    ap.add_argument("--variants", default="base", help="comma list of schedules: base (the "
                    "library's choice) or field=value/... changes to it "
                    "(gemm_schedule.with_fields)")
    args = ap.parse_args()
    calls = []
    for spec in args.shapes.split(","):
        k, n = (int(v) for v in spec.split("x"))
        qw = prepared(k, n, args.type)
        x = torch.randn(args.m, k, device="cuda", dtype=torch.float16)
        base = choose_schedule(args.m, n, k, qw.bk)
        for spec in args.variants.split(","):
            s = with_fields(base, "" if spec == "base" else spec)
            print(f"{k}x{n} M={args.m} {spec}: {s}", flush=True)
            calls.append(lambda x=x, qw=qw, s=s: quant_linear(x, qw, s))
        if not args.no_cublas:
            wd = torch.randn(n, k, device="cuda", dtype=torch.float16)
            calls.append(lambda x=x, wd=wd: x @ wd.T)
    for call in calls:  # compile, allocate the split-K buffers
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for call in calls:
        call()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
