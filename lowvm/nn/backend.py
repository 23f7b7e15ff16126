"""Where a quantized linear layer meets the GPU kernel: the only file that calls it.

:func:`quant_linear` picks the path for one call: :func:`cuda_quant_linear` (today's
``lowvm.kernels.quant_matmul``) for float16 activations on a CUDA device, otherwise the
reference path (dequantize, then matmul in float32). The layout the kernel wants is the
plain one stored by :class:`~lowvm.nn.quant_linear.QuantLinear`: ``qweight [N, K*bits/8]``
bit-stream rows, ``scales [K/group, N]`` float16. What today's kernel lacks is made up here
with torch (zero points, bias, bfloat16), so that replacing the kernel touches this file
only. :func:`shape_problem` states the kernel's shape rules for the checks made before any
weight is quantized.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from lowvm.nn.packed import PackedLinear, dequantize

__all__ = ["quant_linear", "cuda_quant_linear", "reference_quant_linear", "shape_problem",
           "LowvmFallbackWarning", "IN_FEATURES_MULTIPLE", "OUT_FEATURES_MULTIPLE",
           "GROUP_MULTIPLE"]

# The kernel's tile rules: K runs in steps of bk (at most 64, dividing the group, a
# multiple of the MMA's k=16); N is masked today, but the tuned kernels tile it by 64.
IN_FEATURES_MULTIPLE = 64
OUT_FEATURES_MULTIPLE = 64
GROUP_MULTIPLE = 16
_BK_MAX = 64


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


_programs: dict[tuple[str, int, int], Any] = {}


def _launch(m: int, n: int, k: int, x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor,
            y: torch.Tensor, layer: PackedLinear, bk: int) -> None:
    """One call of today's quant_matmul (compiled once per type/group/bk, then cached)."""
    key = (layer.wtype.name, layer.group_size, bk)
    program = _programs.get(key)
    if program is None:
        import lowvm
        from lowvm.kernels.quant_matmul import quant_matmul

        program = lowvm.compile(quant_matmul, wtype=layer.wtype, group=layer.group_size, bk=bk)
        _programs[key] = program
    program(m, n, k, x, w, scales, y)


def cuda_quant_linear(x2d: torch.Tensor, layer: PackedLinear) -> torch.Tensor:
    """``x2d [M, K]`` float16 on CUDA -> ``y [M, N]`` float16 through the lowvm kernel.

    The kernel computes ``x @ (q * scale)^T``; with zero points this subtracts
    ``(x summed per group) @ (zero * scale)`` in float32, then adds the bias.
    """
    m, k = x2d.shape
    n = layer.out_features
    x = x2d.contiguous()
    y = torch.empty((m, n), dtype=torch.float16, device=x.device)
    _launch(m, n, k, x, layer.qweight, layer.scales, y, layer, math.gcd(_BK_MAX, layer.group_size))
    if layer.zeros is None and layer.bias is None:
        return y
    out = y.float()
    if layer.zeros is not None:
        xg = x.float().view(m, k // layer.group_size, layer.group_size).sum(dim=-1)
        out = out - xg @ (layer.zeros.float() * layer.scales.float())
    if layer.bias is not None:
        out = out + layer.bias.float()
    return out.to(torch.float16)


def quant_linear(x2d: torch.Tensor, layer: PackedLinear) -> torch.Tensor:
    """The forward of one layer on the best path available for these activations."""
    if x2d.is_cuda and x2d.dtype == torch.float16:
        return cuda_quant_linear(x2d, layer)
    if x2d.is_cuda:
        # bfloat16: today's kernel takes float16 activations only, and casting bf16 to fp16
        # would overflow past 65504 and lose small values; the reference path keeps range.
        _warn_once("bf16", "lowvm: bfloat16 activations run on the reference path "
                   "(dequantize + matmul) until the kernel takes bfloat16")
    else:
        _warn_once("cpu", "lowvm: no CUDA device for these activations; quantized layers run "
                   "on the reference path (dequantize + matmul), which is slow")
    return reference_quant_linear(x2d, layer)
