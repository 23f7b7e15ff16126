"""The one place the benchmark calls lowvm's quantized GEMM.

The harness knows three functions and nothing else about the kernel:

* ``prepare(weight_fp16 [N, K], wtype, group) -> prepared``: quantise and upload, once
  per (shape, type, group), outside the timed region;
* ``run(prepared, x [M, K] fp16) -> y [M, N] fp16``: what is timed;
* ``dequantized(prepared) -> [N, K]`` float tensor: the exact dequantised weight the
  kernel multiplies by, for the float64 reference the harness checks ``run`` against.

The body is the kernel library (:mod:`lowvm.kernels.library`): symmetric round-to-nearest
codes with fp16 group scales, repacked for ``quant_gemm``; the schedule is chosen per M.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from lowvm.bench.errors import BenchError
from lowvm.dtypes import DType, decode
from lowvm.dtypes import dtype as as_dtype
from lowvm.errors import LowvmError
from lowvm.kernels.library import (
    QuantWeight,
    prepare_weight,
    quant_linear,
    quantize_to_codes,
    weight_bk,
)

__all__ = ["Prepared", "quantize", "prepare", "run", "dequantized"]

_ROWS_PER_CHUNK = 2048  # quantise this many rows at a time to bound host memory


@dataclass
class Prepared:
    """A weight quantised and repacked for the kernel, on the device."""

    weight: QuantWeight
    dequant: Any     # float32 [N, K], exact (a <=8-bit value times an fp16 scale)

    @property
    def packed(self) -> Any:
        """The repacked weight bytes on the device."""
        return self.weight.packed

    @property
    def scales(self) -> Any:
        """float16 [K/group, N] on the device."""
        return self.weight.scales


def quantize(weight: np.ndarray, wtype: DType | str, group: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(codes [N, K], scales float16 [K/group, N], dequant float32 [N, K])`` by
    :func:`lowvm.kernels.library.quantize_to_codes`, ``_ROWS_PER_CHUNK`` rows at a time."""
    wt = as_dtype(wtype)
    n, k = weight.shape
    codes = np.empty((n, k), np.uint8)
    scales = np.empty((k // group, n), np.float16)
    dequant = np.empty((n, k), np.float32)
    for r0 in range(0, n, _ROWS_PER_CHUNK):
        rows = slice(r0, min(n, r0 + _ROWS_PER_CHUNK))
        c, s = quantize_to_codes(weight[rows], wt, group)
        codes[rows], scales[:, rows] = c, s
        dequant[rows] = (decode(c, wt).astype(np.float64)
                         * np.repeat(s.T.astype(np.float64), group, axis=1))
    return codes, scales, dequant


def _check(weight: Any, wt: DType, group: int) -> None:
    if getattr(weight, "ndim", None) != 2:
        raise BenchError(f"weight: expected a 2-D [N, K] tensor, got shape "
                         f"{tuple(getattr(weight, 'shape', ()))}")
    if not 1 <= wt.nbits <= 8:
        raise BenchError(f"wtype={wt}: lowvm's quantized GEMM takes 1..8-bit types")
    n, k = weight.shape
    if group <= 0 or k % group:
        raise BenchError(f"group={group} must divide K={k}")
    bk = weight_bk(group, k)
    if group % bk or n % 64:
        raise BenchError(f"group={group}, N={n}: the kernel needs N a multiple of 64 and the "
                         f"group a multiple of {bk}")


def prepare(weight_fp16: Any, wtype: str | DType, group: int) -> Prepared:
    """Quantise ``weight_fp16 [N, K]`` (a torch tensor, any device) to ``wtype`` with one
    scale per ``group`` inputs and upload it repacked for the kernel."""
    import torch

    wt = as_dtype(wtype)
    _check(weight_fp16, wt, group)
    host = weight_fp16.detach().to("cpu", torch.float32).numpy()
    codes, scales, dequant = quantize(host, wt, group)
    try:
        qw = prepare_weight(codes, scales, wt, group, device=weight_fp16.device)
    except LowvmError as exc:
        raise BenchError(str(exc)) from exc
    return Prepared(qw, torch.from_numpy(dequant).to(weight_fp16.device))


def run(prepared: Prepared, x: Any) -> Any:
    """``y [M, N] = x [M, K] @ dequant(W)^T`` in x's type (float16, or bfloat16 for types
    whose values float16 cannot hold)."""
    return quant_linear(x, prepared.weight)


def dequantized(prepared: Prepared) -> Any:
    """The exact dequantised weight ``[N, K]`` (float32) the kernel multiplies by."""
    return prepared.dequant
