"""How much of a decode timing is the L2 flush's own write-back, not the kernel.

DESIGN.md flushes the L2 before each timed run by *writing* a 512 MB buffer. The H100's
L2 (50 MB) is write-back: after the flush it is full of dirty lines, and the timed kernel's
reads evict them, so DRAM also carries up to ~50 MB of writes during the timing. For a
kernel that reads 60 MB, that is a large share of the traffic the "floor" does not count.

This script times the same work after three flushes, in one process:
  write  ``flush.zero_()`` (DESIGN.md's method; dirty L2)
  read   a 512 MB read (``flush.sum()``): the L2 is evicted but left clean
  none   no flush, only a GPU-side wait ahead of the call (an operand that fits the L2 is
         timed from cache); results/flush_effect_h100_2026-11-23.json predates the wait,
         so its "none" column timed the host's launch path too (25-135 µs)
for a pure read (``torch.sum`` of a float16 tensor as large as the int4 weight + scales),
lowvm's int4 g128 GEMM at M = 1 and cuBLAS fp16 at M = 1.
Usage: python benchmarks/flush_effect.py --out flush_effect.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
from timing import median_us

from lowvm.dtypes import dtype as as_dtype
from lowvm.kernels.library import prepare_weight, quant_linear, quantize_to_codes

SHAPES = [(4096, 1024), (4096, 4096), (4096, 6144), (4096, 14336), (14336, 4096),
          (8192, 10240), (4096, 28672), (28672, 8192)]


def time_shape(k: int, n: int, rng: np.random.Generator, flushes: dict) -> list[dict]:
    """Rows for one (K, N): each kind of work after each flush."""
    wt = as_dtype("int4")
    w = rng.standard_normal((n, k), dtype=np.float32)
    codes, scales = quantize_to_codes(w, wt, 128)
    qw = prepare_weight(codes, scales, wt, 128)
    wbytes = qw.packed.numel() + qw.scales.numel() * 2
    wdev = torch.from_numpy(w).to("cuda", torch.float16)
    x = torch.randn(1, k, device="cuda", dtype=torch.float16)
    same_bytes = torch.ones(wbytes // 2, device="cuda", dtype=torch.float16)
    out = torch.zeros((), device="cuda", dtype=torch.float32)
    work = {"read_only_sum": (lambda: torch.sum(same_bytes, 0, dtype=torch.float32, out=out),
                              wbytes),
            "lowvm_int4": (lambda: quant_linear(x, qw), wbytes),
            "cublas_fp16": (lambda: x @ wdev.T, 2 * n * k)}
    rows = []
    for name, (fn, nbytes) in work.items():
        for fname, before in flushes.items():
            us = median_us(fn, before)
            rows.append(dict(k=k, n=n, kernel=name, flush=fname, us=us, bytes=nbytes,
                             gbps=nbytes / us / 1e3, floor_us=nbytes / 3.04e6))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="flush_effect.json")
    args = ap.parse_args()
    flush = torch.zeros(128 * 2**20, dtype=torch.float32, device="cuda")  # 512 MB
    sink = torch.zeros((), dtype=torch.float32, device="cuda")
    flushes = {"write": lambda: flush.zero_(),
               "read": lambda: torch.sum(flush, 0, out=sink),
               # no flush, but a GPU-side wait, so the events do not time the host's launch
               "none": lambda: torch.cuda._sleep(2_000_000)}
    rng = np.random.default_rng(0)
    rows = []
    for k, n in SHAPES:
        rows += time_shape(k, n, rng, flushes)
    with open(args.out, "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"),
                       torch=torch.__version__, rows=rows), f, indent=1)
    print("\n K      N      kernel         floor   write    read    none   (µs, median of 30)")
    for i in range(0, len(rows), 3):
        r = rows[i: i + 3]
        print(f" {r[0]['k']:<6} {r[0]['n']:<6} {r[0]['kernel']:<14} {r[0]['floor_us']:6.1f} "
              + " ".join(f"{v['us']:7.1f}" for v in r))


if __name__ == "__main__":
    main()
