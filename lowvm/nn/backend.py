"""Where a quantized linear layer meets the GPU kernel: the only file that calls it.

:func:`quant_linear` picks the path for one call: :func:`cuda_quant_linear` (the
library's ``quant_gemm``, :mod:`lowvm.kernels.library`) for float16/bfloat16 activations
on a CUDA device, otherwise the reference path (dequantize, then matmul in float32).
:class:`~lowvm.nn.quant_linear.QuantLinear` stores its codes once, already in the
kernel's repacked layout (:mod:`lowvm.nn.kernel_format`), so the kernel reads the layer's
``qweight`` as it is and the reference path unpacks it on each call.
:func:`shape_problem` states the kernel's shape rules for the checks made before any
weight is quantized.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch

from lowvm.kernels.library import QuantWeight, fits_float16, weight_bk
from lowvm.kernels.library import quant_linear as library_quant_linear
from lowvm.nn.packed import PackedLinear, dequantize

__all__ = ["quant_linear", "cuda_quant_linear", "reference_quant_linear", "shape_problem",
           "LowvmFallbackWarning", "IN_FEATURES_MULTIPLE", "OUT_FEATURES_MULTIPLE",
           "GROUP_MULTIPLE"]

# The kernel's tile rules: K runs in steps of bk = min(128, group) (a multiple of the
# MMA's k = 16), and the repacked weight is tiled by 64 along N.
IN_FEATURES_MULTIPLE = 64
OUT_FEATURES_MULTIPLE = 64
GROUP_MULTIPLE = 16


class LowvmFallbackWarning(UserWarning):
    """A quantized layer ran on the (slow) reference path instead of the GPU kernel."""


_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, LowvmFallbackWarning, stacklevel=3)


def shape_problem(in_features: int, out_features: int, group_size: int) -> str | None:
    """Why the kernel cannot run this layer shape (a sentence), or None when it can."""
    if in_features % IN_FEATURES_MULTIPLE:
        return (f"in_features={in_features} is not a multiple of {IN_FEATURES_MULTIPLE}, "
                "the kernel's K tile")
    if out_features % OUT_FEATURES_MULTIPLE:
        return (f"out_features={out_features} is not a multiple of {OUT_FEATURES_MULTIPLE}, "
                "the kernel's N tile")
    if group_size % GROUP_MULTIPLE:
        return (f"group_size={group_size} is not a multiple of {GROUP_MULTIPLE} "
                "(the kernel steps K by a multiple of 16 inside each group)")
    bk = weight_bk(group_size, in_features)
    if group_size % bk or in_features % bk:  # the layer stores its weight in bk-wide tiles
        return (f"group_size={group_size} and in_features={in_features} must both be "
                f"multiples of the kernel's K step bk={bk} (min(128, group_size))")
    return None


def reference_quant_linear(x2d: torch.Tensor, layer: PackedLinear) -> torch.Tensor:
    """Dequantize, then ``x @ W^T + bias`` in float32, rounded once to x's dtype."""
    y = x2d.float() @ dequantize(layer, torch.float32).t()
    if layer.bias is not None:
        y = y + layer.bias.float()
    return y.to(x2d.dtype)


def cuda_quant_linear(x2d: torch.Tensor, layer: PackedLinear) -> torch.Tensor:
    """``x2d [M, K]`` float16/bfloat16 on CUDA -> ``y [M, N]`` through ``quant_gemm``
    (zero points are applied inside the kernel; the bias is added after).
    ``layer.qweight`` is already the kernel's repacked weight."""
    n, k = layer.out_features, layer.in_features
    scales, zeros = _scales_as(layer, x2d.dtype)
    weight = QuantWeight(layer.qweight, scales, layer.wtype, layer.group_size, n, k,
                         weight_bk(layer.group_size, k), zeros)
    y = library_quant_linear(x2d.contiguous(), weight)
    if layer.bias is not None:
        y = y + layer.bias.to(y.dtype)
    return y


#: (id of a layer's scales, dtype) -> (scales, zeros, their versions, converted pair)
_CONVERTED: dict[tuple[int, torch.dtype], tuple] = {}


def _scales_as(layer: PackedLinear, dtype: torch.dtype) -> tuple[torch.Tensor, Any]:
    """The layer's scales and zeros in ``dtype``, cast once per layer and kept until the
    layer's tensors change in place (their version counters) or are freed: a bfloat16
    model must not launch a cast before every GEMM."""
    scales, zeros = layer.scales, layer.zeros
    if scales.dtype == dtype and (zeros is None or zeros.dtype == dtype):
        return scales, zeros
    try:
        versions = (scales._version, None if zeros is None else zeros._version)
    except RuntimeError:  # inference-mode tensors keep no version counter: cast per call
        return scales.to(dtype), None if zeros is None else zeros.to(dtype)
    key = (id(scales), dtype)
    hit = _CONVERTED.get(key)
    if hit is None or hit[0]() is not scales or hit[1] is not zeros or hit[2] != versions:
        if hit is None:  # drop the copy with the layer's scales
            weakref.finalize(scales, _CONVERTED.pop, key, None)
        hit = _CONVERTED[key] = (weakref.ref(scales), zeros, versions,
                                 (scales.to(dtype), None if zeros is None else zeros.to(dtype)))
    return hit[3]


def quant_linear(x2d: torch.Tensor, layer: PackedLinear) -> torch.Tensor:
    """The forward of one layer on the best path available for these activations."""
    if x2d.is_cuda and x2d.dtype in (torch.float16, torch.bfloat16):
        if x2d.dtype == torch.bfloat16 or fits_float16(layer.wtype):
            return cuda_quant_linear(x2d, layer)
        _warn_once(f"f16-{layer.wtype.name}",
                   f"lowvm: {layer.wtype.name} values exceed float16, which the kernel "
                   "converts them to; with float16 activations these layers run on the "
                   "reference path (use bfloat16 for the kernel)")
    elif not x2d.is_cuda:
        _warn_once("cpu", "lowvm: no CUDA device for these activations; quantized layers run "
                   "on the reference path (dequantize + matmul), which is slow")
    return reference_quant_linear(x2d, layer)
