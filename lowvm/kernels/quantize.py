"""Round-to-nearest quantization of a dense weight into codes, scales and zero points.

One implementation, :func:`round_to_nearest` (torch, float32, on the weight's device:
what :mod:`lowvm.nn` stores); :func:`quantize_to_codes` is its numpy adapter (symmetric,
on the host: what the kernel tests and benchmarks feed ``prepare_weight``).

Symmetric types (intN, eXmY): per group, ``scale = absmax / max_value`` and each value is
rounded to the type (ints: half to even and clamp; small floats: lowvm.dtypes' own round
to nearest even with saturation). Unsigned types with a zero point: per group the range
``[min(w, 0), max(w, 0)]`` maps onto ``[0, 2**N - 1]`` with an integer zero point, so 0.0
stays exact. Scales are rounded to float16 *before* the weights are divided by them, so
that dequantization with the stored scale is the rounding the codes were chosen for.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lowvm.dtypes import DType, encode
from lowvm.dtypes import dtype as as_dtype

__all__ = ["round_to_nearest", "required_scales", "quantize_to_codes"]

_FP16_MAX = 65504.0
_FP16_TINY = 2.0**-24  # smallest positive float16 (subnormal)
_ROWS_PER_CHUNK = 256  # bounds the float64 copy numpy's exact float encoder makes


def _to_fp16_scale(scale: Any, round_up: bool = False) -> Any:
    """fp32 scales as float16: never 0 (an all-zero group gets 1), never inf.

    ``round_up``: never below the fp32 scale, so a min/max range still fits the codes.
    """
    import torch

    scale = torch.where(scale > 0, scale.clamp(min=_FP16_TINY, max=_FP16_MAX),
                        torch.ones_like(scale))
    half = scale.to(torch.float16)
    if round_up:
        up = torch.nextafter(half, torch.full_like(half, _FP16_MAX))
        half = torch.where(half.float() < scale, up, half)
    return half


def _encode_float(scaled: Any, wtype: DType) -> Any:
    """Codes of a small float type, chunked over rows (exact RNE from lowvm.dtypes)."""
    import torch

    parts = [torch.from_numpy(encode(chunk.numpy(), wtype))
             for chunk in scaled.split(_ROWS_PER_CHUNK)]
    return torch.cat(parts).to(scaled.device)


def required_scales(weight: Any, wtype: DType, group: int, zero_point: bool = False) -> Any:
    """float32 ``[N, K/group]``: the scale each group of ``weight [N, K]`` needs before it is
    rounded to float16 (:func:`round_to_nearest`'s rule; callers check the range with it)."""
    n, k = weight.shape
    return _scales_of(weight.detach().float().reshape(n, k // group, group), wtype, zero_point)


def _scales_of(w: Any, wtype: DType, zero_point: bool) -> Any:
    """Per group of ``w [N, G, group]``: ``absmax / max_value``, or with a zero point the
    range ``[min(w, 0), max(w, 0)]`` over the ``2**N - 1`` steps of the codes."""
    if zero_point:
        hi = w.amax(dim=-1).clamp(min=0)
        lo = w.amin(dim=-1).clamp(max=0)
        return (hi - lo) / float(2**wtype.nbits - 1)
    return w.abs().amax(dim=-1) / wtype.max_value


def round_to_nearest(weight: Any, wtype: DType, group: int, zero_point: bool = False
                     ) -> tuple[Any, Any, Any]:
    """``weight [N, K]`` (torch) -> ``(codes [N, K] uint8, scales [G, N] fp16,
    zeros [G, N] | None)``, computed in float32 on the weight's device."""
    import torch

    wt = wtype
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group, group)
    if zero_point:
        qmax = float(2**wt.nbits - 1)
        lo = w.amin(dim=-1).clamp(max=0)
        scale = _to_fp16_scale(_scales_of(w, wt, True), round_up=True)
        s = scale.float().unsqueeze(-1)
        zero = torch.round(-lo / scale.float()).clamp(0, qmax)
        q = (torch.round(w / s) + zero.unsqueeze(-1)).clamp(0, qmax)
        codes = q.to(torch.uint8)
        zeros = zero.t().contiguous().to(torch.float16)
    else:
        scale = _to_fp16_scale(_scales_of(w, wt, False))
        scaled = w / scale.float().unsqueeze(-1)
        if wt.is_float:
            codes = _encode_float(scaled.reshape(n, k).cpu(), wt).to(weight.device)
        else:
            q = torch.round(scaled).clamp(wt.min_value, wt.max_value).to(torch.int16)
            codes = (q & (2**wt.nbits - 1)).to(torch.uint8)  # two's complement code
        zeros = None
    return codes.reshape(n, k), scale.t().contiguous(), zeros


def quantize_to_codes(weight: np.ndarray, wtype: DType | str, group: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`round_to_nearest` (symmetric) for numpy weights: ``(codes [N, K] uint8,
    scales [K/g, N] float16)``, computed on the host in float32; an all-zero group's
    scale is 1."""
    import torch

    w = torch.from_numpy(np.ascontiguousarray(weight))
    codes, scales, _ = round_to_nearest(w, as_dtype(wtype), group)
    return codes.numpy(), scales.numpy()
