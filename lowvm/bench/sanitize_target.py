"""Small quantized-GEMM launches for compute-sanitizer memcheck/racecheck runs: the example
``quant_matmul`` and the library's ``quant_gemm`` in its decode (split-K, prefetch,
zero points) and prefill (pipelined x, 4x4 warps) schedules, quant_gemm_prefill and,
on sm_90, quant_gemm_wgmma (overlapped and waiting multiplies, split K), with a masked
M.

``--sweep`` then runs ``QuantLinear`` (the library's dispatch, as a model calls it) for
every 1..8-bit weight type x group size 32, 64, 128 and per row x M = 1, 16, 256 on a
small layer: each schedule family the dispatcher picks for each type. A launch refused
with a lowvm error (a known limit, named in the output) is counted, not a crash.

``python -m lowvm.bench sanitizers`` runs ``python -m lowvm.bench.sanitize_target --sweep``
under compute-sanitizer's memcheck and racecheck.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from lowvm.driver import compile as compile_program
from lowvm.dtypes import int4
from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.kernels.library import (
    choose_schedule,
    prefill_quant_linear,
    prepare_weight,
    quant_linear,
    wgmma_quant_linear,
)
from lowvm.kernels.quant_matmul import quant_matmul, quantize_weights


def main() -> None:
    """Launch every kernel form once on small shapes (rows masked), then synchronise."""
    m, n, k, group = 17, 128, 256, 64
    rng = np.random.default_rng(0)
    packed, scales = quantize_weights(rng.standard_normal((n, k)), "int4", group)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float16)).cuda()
    y = torch.zeros((m, n), dtype=torch.float16, device="cuda")
    kernel = compile_program(quant_matmul, wtype=int4, group=group)
    kernel(m, n, k, x, torch.from_numpy(packed).cuda(), torch.from_numpy(scales).cuda(), y)

    n, k, group = 128, 1024, 128
    codes = rng.integers(0, 16, size=(n, k)).astype(np.uint8)
    gscales = (rng.random((k // group, n)) / 8 + 0.01).astype(np.float16)
    zeros = rng.integers(0, 16, size=(k // group, n)).astype(np.float16)
    weight = prepare_weight(codes, gscales, "uint4", group, zeros=zeros)
    for rows in (3, 130):
        xs = torch.randn(rows, k, device="cuda", dtype=torch.float16)
        for base in (choose_schedule(rows, n, k, weight.bk),  # x_whole where it fits
                     choose_schedule(rows, n, k, weight.bk, x_whole=False)):
            for split, prefetch in ((1, 1), (2, 4 if rows <= 16 else 1)):
                out = quant_linear(xs, weight, base.resplit(k, split=split, prefetch=prefetch))
        # one x row read as all 16, a block per row of y (3 of them)
        out = quant_linear(xs, weight, GemmSchedule(split=2, prefetch=2, x_whole=k // 2, x_rows=1))
        # the prefill kernel, rows masked (cp.async chunks past M read nothing: src-size 0)
        out = prefill_quant_linear(xs, weight)
        if torch.cuda.get_device_capability() == (9, 0):  # the wgmma kernel, rows masked
            for bm, split in ((256, 1), (32, 2)):
                s = GemmSchedule(bm=bm, bn=128, bk=weight.bk, warps_m=8, warps_n=1, split=split,
                                 stages=3, prefetch=1)
                out = wgmma_quant_linear(xs, weight, s)
    torch.cuda.synchronize()
    print("sanitize targets ran; y[0, :4] =", y[0, :4].tolist(),
          "out[0, :2] =", out[0, :2].tolist())


SWEEP_GROUPS = (32, 64, 128, -1)
SWEEP_M = (1, 16, 256)


def sweep(k: int = 512, n: int = 256) -> tuple[int, list[str]]:
    """Every weight type x group x M through QuantLinear on CUDA; returns (launches,
    refusals as text)."""
    from lowvm.bench.scenarios import weight_type_names
    from lowvm.errors import LowvmError
    from lowvm.nn.layer.quant_linear import QuantLinear

    launches, refused = 0, []
    torch.manual_seed(0)
    dense = torch.nn.Linear(k, n, bias=True, dtype=torch.float16)
    for name in weight_type_names():
        if name == "int1":
            continue  # not a weight type (symmetric int1 holds only -1 and 0)
        for group in SWEEP_GROUPS:
            try:
                layer = QuantLinear.from_linear(dense, name, group).cuda()
            except LowvmError as exc:
                refused.append(f"{name} g{group}: {str(exc)[:160]}")
                continue
            for m in SWEEP_M:
                for act in (torch.float16, torch.bfloat16):
                    x = torch.randn(m, k, dtype=act, device="cuda")
                    try:
                        layer.to(act)(x)
                        launches += 1
                    except LowvmError as exc:
                        refused.append(f"{name} g{group} M={m} {act}: {str(exc)[:160]}")
    torch.cuda.synchronize()
    return launches, refused


if __name__ == "__main__":
    main()
    if "--sweep" in sys.argv[1:]:
        count, refusals = sweep()
        print(f"sweep: {count} QuantLinear launches, {len(refusals)} refused")
        for line in refusals:
            print("  refused:", line)
