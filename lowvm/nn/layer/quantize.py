"""Round-to-nearest quantization of a layer's weight by its :class:`QuantSpec` (the rule
itself: :func:`lowvm.kernels.quantize.round_to_nearest`), after checking that the weight
can be quantized at all: a NaN or inf would hide inside a group's scale, and a scale
float16 cannot hold would silently saturate or flush the group to zero."""

from __future__ import annotations

import torch

from lowvm.dtypes import DType
from lowvm.kernels.quantize import dequantize_with, required_scales, round_to_nearest
from lowvm.nn.errors import QuantizationError
from lowvm.nn.layer.spec import QuantSpec

__all__ = ["quantize_weight", "rounded_weight", "check_quantizable", "FP16_SCALE_MAX",
           "FP16_SCALE_MIN"]

#: the largest scale a float16 holds
FP16_SCALE_MAX = 65504.0
#: the smallest positive scale a float16 holds (a subnormal); below it a group's codes
#: would all round to zero
FP16_SCALE_MIN = 2.0**-24


def _smallest_scale(wtype: DType) -> float:
    """The smallest scale a group may need. An integer group needing less than float16's
    smallest scale would round to zero; a small-float group keeps its precision with the
    scale raised to that smallest value as long as its largest value still lands on a
    normal number of the type (wide types such as float8_e6m1, whose largest value is
    6.4e9, need scales far below float16's for ordinary weights)."""
    if not wtype.is_float:
        return FP16_SCALE_MIN
    smallest_normal = 2.0 ** (1 - wtype.bias)
    return FP16_SCALE_MIN * smallest_normal / wtype.max_value


def check_quantizable(weight: torch.Tensor, spec: QuantSpec, where: str) -> None:
    """Raise :class:`QuantizationError` (naming ``where``, the row and column or group) when
    ``weight [N, K]`` holds a non-finite value or a group whose scale float16 cannot hold:
    one rule for every type."""
    w = weight.detach()
    finite = torch.isfinite(w)
    if not bool(finite.all()):
        bad = (~finite).nonzero()
        row, col = (int(i) for i in bad[0])
        raise QuantizationError(
            f"{where}: the weight holds {bad.shape[0]} non-finite value(s), the first "
            f"{float(w[row, col])} at row {row}, column {col}; quantized weights must be "
            "finite (a NaN or inf would make its whole group's scale meaningless)")
    group = spec.group_size
    scale = required_scales(w, spec.wtype, group, spec.zero_point)
    for bad, what in ((scale > FP16_SCALE_MAX, f"above float16's largest, {FP16_SCALE_MAX:g}"),
                      ((scale > 0) & (scale < _smallest_scale(spec.wtype)),
                       f"below float16's smallest positive value, {FP16_SCALE_MIN:.3g}")):
        if bool(bad.any()):
            row, g = (int(i) for i in bad.nonzero()[0])
            raise QuantizationError(
                f"{where}: the group of row {row}, columns {g * group}..{(g + 1) * group - 1} "
                f"needs a scale of {float(scale[row, g]):.3g} for {spec.wtype.name}, {what}; "
                "scales are float16: rescale the weight (or its layer) into float16's range")


def quantize_weight(weight: torch.Tensor, spec: QuantSpec, where: str = "quantize"
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``weight [N, K]`` -> ``(codes [N, K] uint8, scales [G, N] fp16, zeros [G, N] | None)``,
    after :func:`check_quantizable`."""
    check_quantizable(weight, spec, where)
    return round_to_nearest(weight, spec.wtype, spec.group_size, spec.zero_point)


def rounded_weight(weight: torch.Tensor, spec: QuantSpec, where: str = "quantize") -> torch.Tensor:
    """The float32 weight ``[N, K]`` a round-to-nearest layer of ``spec`` decodes to, bit for
    bit, without packing a layer (what measuring a type's error needs)."""
    codes, scales, zeros = quantize_weight(weight, spec, where)
    n, k = codes.shape
    g = spec.group_size
    zero = None if zeros is None else zeros.t().unsqueeze(-1)
    values = dequantize_with(codes.view(n, k // g, g), scales.t().unsqueeze(-1), zero,
                             spec.wtype)
    return values.reshape(n, k)
