"""Quantized-GEMM test data and references shared by the decode, prefill and wgmma tests."""

from __future__ import annotations

import numpy as np

import lowvm
from lowvm.dtypes import DType, decode
from lowvm.kernels.library import quantize_to_codes


def float64_reference(x: np.ndarray, codes: np.ndarray, scales: np.ndarray,
                      wtype: str | DType, group: int,
                      zeros: np.ndarray | None = None) -> np.ndarray:
    """float64 ``x @ ((q - zeros) * scales)^T`` (no zeros: ``q * scales``)."""
    wt = lowvm.dtype(wtype)
    w = decode(codes, wt).astype(np.float64)
    if zeros is not None:
        w = w - np.repeat(zeros.T.astype(np.float64), group, 1)
    return x.astype(np.float64) @ (w * np.repeat(scales.T.astype(np.float64), group, 1)).T


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """``|out - ref| / |ref|`` in the Frobenius norm, computed in float64."""
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))


def random_weights(rng: np.random.Generator, wt: DType, n: int, k: int, g: int,
                   zero_point: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Codes [n, k], scales [k/g, n] and zeros (codes of the zero point, or None)."""
    if zero_point:
        codes = rng.integers(0, 2 ** wt.nbits, size=(n, k)).astype(np.uint8)
        scales = (rng.random((k // g, n)) / 8 + 0.01).astype(np.float16)
        zeros = rng.integers(0, 2 ** wt.nbits, size=(k // g, n)).astype(np.float16)
        return codes, scales, zeros
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), wt, g)
    return codes, scales, None


def split_k_counters(m: int, n: int) -> np.ndarray:
    """Split-K arrival counters, one per 16 x 64 output tile (a bound for any schedule)."""
    return np.zeros(-(-m // 16) * -(-n // 64), np.int32)
