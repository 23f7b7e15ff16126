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

The two steps are exposed for quantizers that choose a group's parameters themselves
(GPTQ, with error feedback and a clipping search): :func:`group_params` (a group's scale
and zero point), :func:`quantize_with` (codes given them) and :func:`dequantize_with`
(the values lowvm will decode, bit for bit).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from lowvm.dtypes import DType, decode
from lowvm.dtypes import dtype as as_dtype
from lowvm.errors import DTypeError

__all__ = ["round_to_nearest", "required_scales", "quantize_to_codes", "group_params",
           "quantize_with", "dequantize_with", "code_values"]

_FP16_MAX = 65504.0
_FP16_TINY = 2.0**-24  # smallest positive float16 (subnormal)


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


@functools.cache
def _float_grid(wtype: DType) -> tuple[np.ndarray, np.ndarray]:
    """Positive finite values of a small float type, ascending (index == code), and the
    exact midpoints between neighbours (the rounding boundaries of :func:`encode`)."""
    half = decode(np.arange(2 ** (wtype.nbits - 1)), wtype).astype(np.float64)
    values = half[np.isfinite(half)]  # specials sit at the top codes: a prefix remains
    return values, (values[:-1] + values[1:]) / 2


@functools.lru_cache(maxsize=256)
def _device_table(wtype: DType, which: str, device: Any) -> Any:
    """A small constant on ``device``, made once (not copied to the GPU per column):
    ``"values"``, float32 value of every code; ``"mids"``, the float grid's midpoints."""
    import torch

    if which == "values":
        return torch.from_numpy(decode(np.arange(2**wtype.nbits), wtype)).to(device)
    return torch.from_numpy(_float_grid(wtype)[1]).to(device)


def _encode_float(scaled: Any, wtype: DType) -> Any:
    """Codes of a small float type in torch, on ``scaled``'s device: the rounding of
    :func:`lowvm.dtypes.encode` (nearest, ties to the even code, the sign of zero kept),
    compared in float64 so every boundary is exact. Beyond the largest finite value it
    saturates, also for float8_e5m2 (where ``encode`` overflows to inf): a clipped weight
    must decode to the range's end, never to inf."""
    import torch

    bounds = _device_table(wtype, "mids", scaled.device)
    mag = scaled.abs().double()
    idx = torch.searchsorted(bounds, mag)  # nearest code; a tie gives the lower one
    at_mid = bounds[idx.clamp(max=len(bounds) - 1)] == mag
    idx = idx + (at_mid & (idx % 2 == 1)).long()  # tie: the even (mantissa LSB 0) code
    sign = torch.signbit(scaled).long() << (wtype.nbits - 1)
    return (idx | sign).to(torch.uint8)


def code_values(codes: Any, wtype: DType) -> Any:
    """float32 value of each code (a table look-up, as lowvm dequantizes)."""
    return _device_table(wtype, "values", codes.device)[codes.long()]


def required_scales(weight: Any, wtype: DType, group: int, zero_point: bool = False) -> Any:
    """float32 ``[N, K/group]``: the scale each group of ``weight [N, K]`` needs before it is
    rounded to float16 (:func:`round_to_nearest`'s rule; callers check the range with it)."""
    n, k = weight.shape
    return _scales_of(weight.detach().float().reshape(n, k // group, group), wtype, zero_point)


def _scales_of(w: Any, wtype: DType, zero_point: bool, clip: float = 1.0) -> Any:
    """Per group of ``w [..., group]``: ``absmax / max_value``, or with a zero point the
    range ``[min(w, 0), max(w, 0)]`` over the ``2**N - 1`` steps of the codes; ``clip``
    shrinks the range first."""
    if zero_point:
        hi = w.amax(dim=-1).clamp(min=0)
        lo = w.amin(dim=-1).clamp(max=0)
        if clip != 1.0:
            hi, lo = hi * clip, lo * clip
        return (hi - lo) / float(2**wtype.nbits - 1)
    absmax = w.abs().amax(dim=-1)
    return (absmax * clip if clip != 1.0 else absmax) / wtype.max_value


def group_params(w: Any, wtype: DType, zero_point: bool, clip: float = 1.0
                 ) -> tuple[Any, Any]:
    """The stored parameters of each group of ``w [..., group]`` (float32): ``(scale
    float16 [...], zero float32 [...] | None)``; the zero is an integer code in
    ``[0, 2**N - 1]``. ``clip`` < 1 shrinks the group's range (values beyond it saturate)."""
    import torch

    if not zero_point:
        return _to_fp16_scale(_scales_of(w, wtype, False, clip)), None
    lo = w.amin(dim=-1).clamp(max=0)
    if clip != 1.0:
        lo = lo * clip
    scale = _to_fp16_scale(_scales_of(w, wtype, True, clip), round_up=True)
    zero = torch.round(-lo / scale.float()).clamp(0, float(2**wtype.nbits - 1))
    return scale, zero


def quantize_with(w: Any, scale: Any, zero: Any, wtype: DType) -> Any:
    """Codes (uint8, ``w``'s shape) of float32 ``w`` given float16 ``scale`` and float32
    ``zero`` (None for symmetric types), both broadcastable to ``w``: the rounding that
    :func:`round_to_nearest` applies once a group's parameters are chosen."""
    import torch

    s = scale.float()
    if zero is not None:
        qmax = float(2**wtype.nbits - 1)
        return (torch.round(w / s) + zero).clamp(0, qmax).to(torch.uint8)
    scaled = w / s
    if wtype.is_float:
        return _encode_float(scaled, wtype)
    q = torch.round(scaled).clamp(wtype.min_value, wtype.max_value).to(torch.int16)
    return (q & (2**wtype.nbits - 1)).to(torch.uint8)  # two's complement code


def dequantize_with(codes: Any, scale: Any, zero: Any, wtype: DType) -> Any:
    """float32 values of ``codes`` with float16 ``scale`` and ``zero`` (None: symmetric),
    broadcastable: ``(value(code) - zero) * scale``, the operations lowvm's dequantization
    performs, so the result is bit-identical to it."""
    values = code_values(codes, wtype)
    if zero is not None:
        values = values - zero.float()
    return values * scale.float()


def round_to_nearest(weight: Any, wtype: DType, group: int, zero_point: bool = False
                     ) -> tuple[Any, Any, Any]:
    """``weight [N, K]`` (torch) -> ``(codes [N, K] uint8, scales [G, N] fp16,
    zeros [G, N] | None)``, computed in float32 on the weight's device."""
    import torch

    if wtype.name == "int1" and not zero_point:
        raise DTypeError("wtype=int1: it holds only -1 and 0, so a symmetric scale cannot map "
                         "a group onto it (every scale would be inf); use uint1 with zero "
                         "points")
    n, k = weight.shape
    w = weight.detach().float().reshape(n, k // group, group)
    scale, zero = group_params(w, wtype, zero_point)
    codes = quantize_with(w, scale.unsqueeze(-1), None if zero is None else zero.unsqueeze(-1),
                          wtype)
    zeros = None if zero is None else zero.t().contiguous().to(torch.float16)
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
