"""The one place the benchmark calls lowvm's quantized GEMM.

The harness knows three functions and nothing else about the kernel:

* ``prepare(weight_fp16 [N, K], wtype, group) -> prepared``: quantise and upload, once
  per (shape, type, group), outside the timed region;
* ``run(prepared, x [M, K] fp16) -> y [M, N] fp16``: what is timed;
* ``dequantized(prepared) -> [N, K]`` float tensor: the exact dequantised weight the
  kernel multiplies by, for the float64 reference the harness checks ``run`` against.

Today the body uses the first, generic kernel ``lowvm.kernels.quant_matmul`` (correct,
not fast): weights are dense little-endian bit streams per row ``[N, K*bits/8]``, one
fp16 scale per ``group`` inputs ``[K/group, N]``, symmetric round-to-nearest as in
``quant_matmul.quantize_weights``. Swapping in the tuned library means changing this
file only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lowvm.bench.errors import BenchError
from lowvm.dtypes import DType, decode, encode, pack
from lowvm.dtypes import dtype as as_dtype

__all__ = ["Prepared", "quantize", "prepare", "run", "dequantized"]

_BK = 64              # quant_matmul's default K step: K and the group must be multiples
_ROWS_PER_CHUNK = 2048  # quantise this many rows at a time to bound host memory


@dataclass
class Prepared:
    """A weight quantised for the kernel, on the device, with its compiled kernel."""

    wtype: DType
    group: int
    n: int
    k: int
    packed: Any      # uint8 [N, K*bits/8]
    scales: Any      # float16 [K/group, N]
    dequant: Any     # float32 [N, K], exact (a <=8-bit value times an fp16 scale)
    kernel: Any


def quantize(weight: np.ndarray, wtype: DType | str, group: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Symmetric group-wise round-to-nearest of ``weight [N, K]`` (numpy).

    The same rule as ``quant_matmul.quantize_weights`` (scale = absmax / the type's
    largest value, fp16), vectorised over rows: returns ``(packed uint8 [N, K*bits/8],
    scales float16 [K/group, N], dequant float32 [N, K])``.
    """
    wt = as_dtype(wtype)
    n, k = weight.shape
    packed = np.empty((n, k * wt.nbits // 8), np.uint8)
    scales = np.empty((n, k // group), np.float16)
    dequant = np.empty((n, k), np.float32)
    for r0 in range(0, n, _ROWS_PER_CHUNK):
        rows = slice(r0, min(n, r0 + _ROWS_PER_CHUNK))
        groups = weight[rows].reshape(-1, k // group, group).astype(np.float64)
        s = (np.abs(groups).max(axis=2) / wt.max_value).astype(np.float16)
        s[s == 0] = 1
        q = np.clip(groups / s.astype(np.float64)[..., None], wt.min_value, wt.max_value)
        codes = encode(q.reshape(-1), wt)
        packed[rows] = pack(codes, wt).reshape(-1, packed.shape[1])
        values = decode(codes, wt).reshape(-1, k // group, group)
        dequant[rows] = (values * s.astype(np.float32)[..., None]).reshape(-1, k)
        scales[rows] = s
    return packed, np.ascontiguousarray(scales.T), dequant


def _check(weight: Any, wt: DType, group: int) -> None:
    if getattr(weight, "ndim", None) != 2:
        raise BenchError(f"weight: expected a 2-D [N, K] tensor, got shape "
                         f"{tuple(getattr(weight, 'shape', ()))}")
    n, k = weight.shape
    if not 1 <= wt.nbits <= 8:
        raise BenchError(f"wtype={wt}: lowvm's quantized GEMM takes 1..8-bit types")
    if group <= 0 or group % _BK:
        raise BenchError(f"group={group}: the current kernel needs a multiple of {_BK}")
    if k % group:
        raise BenchError(f"group={group} must divide K={k}")
    if k % _BK:
        raise BenchError(f"K={k}: the current kernel needs a multiple of {_BK}")


def prepare(weight_fp16: Any, wtype: str | DType, group: int) -> Prepared:
    """Quantise ``weight_fp16 [N, K]`` (a torch tensor, any device) to ``wtype`` with one
    scale per ``group`` inputs, upload it and compile the kernel for it."""
    import torch

    import lowvm
    from lowvm.kernels.quant_matmul import quant_matmul

    wt = as_dtype(wtype)
    _check(weight_fp16, wt, group)
    n, k = weight_fp16.shape
    host = weight_fp16.detach().to("cpu", torch.float32).numpy()
    packed, scales, dequant = quantize(host, wt, group)
    device = weight_fp16.device
    kernel = lowvm.compile(quant_matmul, wtype=wt, group=group)
    return Prepared(wt, group, n, k, torch.from_numpy(packed).to(device),
                    torch.from_numpy(scales).to(device), torch.from_numpy(dequant).to(device),
                    kernel)


def run(prepared: Prepared, x: Any) -> Any:
    """``y [M, N] fp16 = x [M, K] fp16 @ dequant(W)^T``."""
    import torch

    m = x.shape[0]
    y = torch.empty((m, prepared.n), dtype=torch.float16, device=x.device)
    prepared.kernel(m, prepared.n, prepared.k, x, prepared.packed, prepared.scales, y)
    return y


def dequantized(prepared: Prepared) -> Any:
    """The exact dequantised weight ``[N, K]`` (float32) the kernel multiplies by."""
    return prepared.dequant
