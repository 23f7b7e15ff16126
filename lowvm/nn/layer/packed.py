"""The tensors of one quantized layer, and their exact dequantization.

:class:`PackedLinear` is what every forward path receives: the GPU backend, the reference
path and the torch custom op all work from it, never from the module, so the op's schema
stays plain tensors and the backend can be replaced without touching the module.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from lowvm.dtypes import DType
from lowvm.kernels.weight_format import layer_weight_format
from lowvm.nn.layer.kernel_format import layer_kernel_format
from lowvm.nn.layer.packing import value_table

__all__ = ["PackedLinear", "unpack_codes", "dequantize"]


class PackedLinear(NamedTuple):
    """``y = x @ dequant(W)^T + bias``; ``dequant(W)[n, k] = (q - zero[g, n]) * scale[g, n]``.

    ``qweight`` uint8: the codes ``q [N, K]`` in the GPU kernel's repacked layout (the
    one copy a layer holds, on any device; see :mod:`lowvm.nn.layer.kernel_format`);
    ``scales [K/group, N]`` float16; ``zeros [K/group, N]`` float16 holding integer codes
    (None for symmetric types); ``bias [N]`` or None.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    bias: torch.Tensor | None
    wtype: DType
    group_size: int
    in_features: int

    @property
    def out_features(self) -> int:
        return int(self.scales.shape[1])

    @property
    def bk(self) -> int:
        """The K tile of the repacked format (it depends on the group size)."""
        return layer_weight_format(self.wtype, self.group_size, self.in_features).bk


def unpack_codes(layer: PackedLinear) -> torch.Tensor:
    """The codes ``[N, K]`` (uint8, stored K order) on the weight's device."""
    fmt = layer_kernel_format(layer.wtype, layer.group_size, layer.in_features)
    return fmt.unpack(layer.qweight, layer.out_features, layer.in_features)


def dequantize(layer: PackedLinear, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The dense weight ``[N, K]``: exact in float32 (codes x fp16 scales fit in 24 bits)."""
    codes = unpack_codes(layer)
    values = value_table(layer.wtype, layer.qweight.device)[codes.long()]  # [N, K] float32
    n, k, group = layer.out_features, layer.in_features, layer.group_size
    values = values.view(n, k // group, group)
    if layer.zeros is not None:
        values = values - layer.zeros.t().float().unsqueeze(-1)
    weight = values * layer.scales.t().float().unsqueeze(-1)
    return weight.reshape(n, k).to(dtype)
