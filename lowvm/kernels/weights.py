"""Weights of the quantized GEMMs: the repacked format's shape rules and one prepared
weight (:class:`QuantWeight`) that every kernel and schedule reads.

The repacked format depends only on ``(wtype, bk)`` (:func:`weight_bk` of the group and
K), so one copy of the weights serves the decode, prefill and wgmma kernels alike.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowvm.dtypes import DType, decode
from lowvm.dtypes import dtype as as_dtype
from lowvm.errors import LowvmError
from lowvm.kernels.weight_format import FORMAT_BN, FORMAT_WARPS_N, weight_bk, weight_format

__all__ = ["WEIGHT_BN", "WEIGHT_WARPS_N", "QuantWeight", "weight_bk", "prepare_weight",
           "check_weight_shape", "check_activation", "fits_float16"]

#: the weight tile width every schedule shares (the repacked format's N tile)
WEIGHT_BN = FORMAT_BN
#: warps along N that read one format tile (16 columns each)
WEIGHT_WARPS_N = FORMAT_WARPS_N


@dataclass
class QuantWeight:
    """A weight ``[N, K]`` repacked for :func:`quant_gemm`, with its scales, on one device."""

    packed: Any  # torch uint8 [rows, bytes per thread]
    scales: Any  # torch float16 [K / group, N]
    wtype: DType
    group: int
    n: int
    k: int
    bk: int
    zeros: Any = None  # torch float16 [K / group, N] holding codes, or None (symmetric)

    def for_dtype(self, dtype: Any) -> tuple[Any, Any]:
        """(scales, zeros) in the activation type ``dtype`` (other-type copies made once)."""
        if self._native(dtype):
            return self.scales, self.zeros
        cache = self.__dict__.setdefault("_converted", {})
        if dtype not in cache:
            cache[dtype] = (self.scales.to(dtype),
                            None if self.zeros is None else self.zeros.to(dtype))
        return cache[dtype]

    def holds(self, dtype: Any) -> bool:
        """Whether :meth:`for_dtype` has ``dtype``'s scales (and zeros) without a cast."""
        return self._native(dtype) or dtype in self.__dict__.get("_converted", {})

    def _native(self, dtype: Any) -> bool:
        """Whether the stored scales (and zeros) are of ``dtype`` already."""
        return self.scales.dtype == dtype and (self.zeros is None or self.zeros.dtype == dtype)


def check_weight_shape(n: int, k: int, group: int, bk: int, bn: int = WEIGHT_BN) -> None:
    """Raise unless ``[n, k]`` with groups of ``group`` fits the format of K tile ``bk``
    and N tile ``bn``."""
    if n % bn:
        raise LowvmError(f"out_features (N) = {n} must be a multiple of {bn}")
    if k % group:
        raise LowvmError(f"group_size = {group} must divide in_features (K) = {k}")
    if group % bk or k % bk:
        raise LowvmError(f"in_features (K) = {k} and group_size = {group} must be multiples "
                         f"of {bk}")


def prepare_weight(codes: np.ndarray, scales: np.ndarray, wtype: DType | str, group: int,
                   device: Any = "cuda", zeros: np.ndarray | None = None) -> QuantWeight:
    """Repack integer codes ``[N, K]`` of ``wtype`` and ``scales [K/group, N]`` for the GPU
    (with ``zeros [K/group, N]``, codes of the zero point, for asymmetric types).

    ``device`` is where the weight will live: a CUDA device for the kernels (checked
    first, so a machine without one is told so before any repacking), or ``"cpu"`` to
    hold the repacked weight in host memory."""
    import torch

    _checked_device(device)
    wt = as_dtype(wtype)
    n, k = codes.shape
    fmt = weight_format(wt, weight_bk(group, k))
    check_weight_shape(n, k, group, fmt.bk, fmt.bn)
    if scales.shape != (k // group, n):
        raise LowvmError(f"scales must have shape [K/group, N] = [{k // group}, {n}], got "
                         f"{list(scales.shape)}")
    if zeros is not None and zeros.shape != scales.shape:
        raise LowvmError(f"zeros must have the shape of scales {list(scales.shape)}, got "
                         f"{list(zeros.shape)}")
    packed = fmt.repack(np.asarray(codes))

    def half(a: np.ndarray) -> Any:
        return torch.from_numpy(np.ascontiguousarray(a, np.float16)).to(device)

    return QuantWeight(torch.from_numpy(packed).to(device), half(scales), wt, group, n, k, fmt.bk,
                       None if zeros is None else half(zeros))


def _checked_device(device: Any) -> Any:
    """``device`` as a torch.device, after making sure it exists here: torch's own failure
    on a CPU-only machine is a bare ``AssertionError`` from deep inside ``.to("cuda")``."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise LowvmError(f"prepare_weight: device must be a torch device or its name "
                         f"('cuda', 'cuda:1', 'cpu'), got {device!r}") from None
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise LowvmError(
            f"prepare_weight: device={device!r} needs a CUDA device, and torch sees none "
            "(torch.cuda.is_available() is False: a CPU-only torch build or no driver), so "
            "the GPU kernels cannot run here. On a CPU use lowvm.QuantLinear, whose forward "
            "takes the reference path there, or pass device='cpu' to keep the repacked "
            "weight in host memory")
    count = torch.cuda.device_count()
    if dev.index is not None and not 0 <= dev.index < count:
        raise LowvmError(f"prepare_weight: device={device!r} does not exist; this machine "
                         f"has {count} CUDA device(s): cuda:0..cuda:{count - 1}")
    return dev


def check_activation(x: Any, weight: QuantWeight) -> Any:
    """``x`` made contiguous, after the checks every entry point makes."""
    import torch

    if (not isinstance(x, torch.Tensor) or x.dtype not in (torch.float16, torch.bfloat16)
            or x.dim() != 2):
        raise LowvmError(f"x must be a 2-D float16 or bfloat16 torch tensor, got "
                         f"{getattr(x, 'dtype', x)!r} of shape {list(getattr(x, 'shape', []))}")
    if x.shape[1] != weight.k:
        raise LowvmError(f"x has {x.shape[1]} columns but the weight has K = {weight.k}")
    if x.device != weight.packed.device:
        raise LowvmError(f"x is on {x.device}, the weight on {weight.packed.device}")
    if x.dtype == torch.float16 and not fits_float16(weight.wtype):
        raise LowvmError(f"{weight.wtype.name} weights have values float16 cannot hold "
                         f"(the kernel converts codes to the activation type before scaling); "
                         f"use bfloat16 activations for this type")
    return x.contiguous()


@functools.cache
def fits_float16(wtype: DType) -> bool:
    """True when every value of ``wtype`` is exactly a float16 (e5m1/e6m1 overflow or
    underflow it; every type of <= 8 bits fits bfloat16)."""
    codes = np.arange(1 << wtype.nbits, dtype=np.uint64)
    values = decode(codes, wtype).astype(np.float64)
    values = values[np.isfinite(values)]
    with np.errstate(over="ignore"):  # overflowing to inf is the answer "no"
        return bool(np.array_equal(values.astype(np.float16).astype(np.float64), values))
