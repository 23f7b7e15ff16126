"""Where a quantized linear layer meets the GPU kernel: the only file that calls it.

:func:`quant_linear` picks the path for one call: :func:`cuda_quant_linear` (the
library's ``quant_gemm``, :mod:`lowvm.kernels.library`) for float16/bfloat16 activations
on a CUDA device, otherwise the reference path (dequantize, then matmul in float32).
:class:`~lowvm.nn.quant_linear.QuantLinear` stores the plain format (``qweight [N,
K*bits/8]`` bit-stream rows, ``scales``/``zeros [K/group, N]``), which is what checkpoints
hold; the kernel's repacked copy is made on the device the first time a weight is used
(:func:`gpu_weight`) and kept while ``qweight`` is unchanged. :func:`shape_problem`
states the kernel's shape rules for the checks made before any weight is quantized.
"""

from __future__ import annotations

import warnings
import weakref

import torch

from lowvm.kernels.library import QuantWeight, weight_bk
from lowvm.kernels.library import quant_linear as library_quant_linear
from lowvm.nn.packed import PackedLinear, dequantize
from lowvm.nn.packing import pack_rows, unpack_rows

__all__ = ["quant_linear", "cuda_quant_linear", "gpu_weight", "reference_quant_linear",
           "shape_problem",
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
    return None


def reference_quant_linear(x2d: torch.Tensor, layer: PackedLinear) -> torch.Tensor:
    """Dequantize, then ``x @ W^T + bias`` in float32, rounded once to x's dtype."""
    y = x2d.float() @ dequantize(layer, torch.float32).t()
    if layer.bias is not None:
        y = y + layer.bias.float()
    return y.to(x2d.dtype)


_gpu_weights: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _repack_on_device(layer: PackedLinear, bk: int) -> torch.Tensor:
    """The layer's codes repacked for ``quant_gemm`` (torch, on the weight's device)."""
    from lowvm.kernels.quant_gemm import GemmSchedule, repack_index

    k, n, nbits = layer.in_features, layer.out_features, layer.wtype.nbits
    codes = unpack_rows(layer.qweight, nbits, k)  # [N, K] uint8
    rows, cols = repack_index(layer.wtype, n, GemmSchedule(bk=bk))
    rows_t = torch.from_numpy(rows).to(codes.device)
    cols_t = torch.from_numpy(cols).to(codes.device)
    values = cols.shape[1]
    tiles = [pack_rows(codes[rows_t, kt * bk + cols_t].reshape(-1, values), nbits)
             for kt in range(k // bk)]
    return torch.cat(tiles)


def gpu_weight(layer: PackedLinear) -> QuantWeight:
    """The layer's weight in the kernel's repacked format, made once per ``qweight``
    (and again if ``qweight`` is modified in place, e.g. by ``load_state_dict``)."""
    cached = _gpu_weights.get(layer.qweight)
    version = layer.qweight._version
    if cached is None or cached[0] != version:
        n, k = layer.out_features, layer.in_features
        bk = weight_bk(layer.group_size, k)
        weight = QuantWeight(_repack_on_device(layer, bk), layer.scales.to(torch.float16),
                             layer.wtype, layer.group_size, n, k, bk,
                             None if layer.zeros is None else layer.zeros.to(torch.float16))
        cached = (version, weight)
        _gpu_weights[layer.qweight] = cached
    return cached[1]


def cuda_quant_linear(x2d: torch.Tensor, layer: PackedLinear) -> torch.Tensor:
    """``x2d [M, K]`` float16/bfloat16 on CUDA -> ``y [M, N]`` through ``quant_gemm``
    (zero points are applied inside the kernel; the bias is added after)."""
    y = library_quant_linear(x2d.contiguous(), gpu_weight(layer))
    if layer.bias is not None:
        y = y + layer.bias.to(y.dtype)
    return y


def quant_linear(x2d: torch.Tensor, layer: PackedLinear) -> torch.Tensor:
    """The forward of one layer on the best path available for these activations."""
    if x2d.is_cuda and x2d.dtype in (torch.float16, torch.bfloat16):
        return cuda_quant_linear(x2d, layer)
    if not x2d.is_cuda:
        _warn_once("cpu", "lowvm: no CUDA device for these activations; quantized layers run "
                   "on the reference path (dequantize + matmul), which is slow")
    return reference_quant_linear(x2d, layer)
