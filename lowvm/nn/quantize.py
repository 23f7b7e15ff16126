"""Round-to-nearest quantization of a layer's weight by its :class:`QuantSpec` (the rule
itself: :func:`lowvm.kernels.quantize.round_to_nearest`)."""

from __future__ import annotations

import torch

from lowvm.kernels.quantize import round_to_nearest
from lowvm.nn.spec import QuantSpec

__all__ = ["quantize_weight"]


def quantize_weight(weight: torch.Tensor, spec: QuantSpec
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``weight [N, K]`` -> ``(codes [N, K] uint8, scales [G, N] fp16, zeros [G, N] | None)``."""
    return round_to_nearest(weight, spec.wtype, spec.group_size, spec.zero_point)
