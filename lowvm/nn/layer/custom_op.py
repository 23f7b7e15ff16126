"""``torch.ops.lowvm.quant_linear``: the layer's forward as a torch.library custom op.

An opaque op with a fake (meta) implementation lets ``torch.compile(fullgraph=True)``
trace a quantized model without graph breaks, and keeps the kernel launch (which takes
raw pointers) out of the traced graph. Weight type and group size are op arguments, so
one op serves every layer.
"""

from __future__ import annotations

import torch

from lowvm.dtypes import dtype as as_dtype
from lowvm.nn.layer import backend
from lowvm.nn.layer.packed import PackedLinear

__all__ = ["quant_linear_op"]


@torch.library.custom_op("lowvm::quant_linear", mutates_args=())
def quant_linear_op(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                    zeros: torch.Tensor | None, bias: torch.Tensor | None, wtype: str,
                    group_size: int) -> torch.Tensor:
    """``x [M, K]`` -> ``[M, N]``: ``x @ dequant(W)^T + bias`` (see PackedLinear);
    ``qweight`` is in the GPU kernel's repacked layout."""
    layer = PackedLinear(qweight, scales, zeros, bias, as_dtype(wtype), group_size,
                         int(x.shape[1]))
    return backend.quant_linear(x, layer)


@quant_linear_op.register_fake
def _quant_linear_fake(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                       zeros: torch.Tensor | None, bias: torch.Tensor | None, wtype: str,
                       group_size: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], scales.shape[1]))
