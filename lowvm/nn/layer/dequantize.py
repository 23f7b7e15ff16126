"""``dequantize_model``: a lowvm model back to dense ``nn.Linear`` layers (what
transformers' ``model.dequantize()`` calls), e.g. to fine-tune or to compare against."""

from __future__ import annotations

import torch
from torch import nn

from lowvm.nn.layer.quant_linear import QuantLinear
from lowvm.nn.swap import set_module

__all__ = ["dequantize_model"]


@torch.no_grad()
def dequantize_model(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """Replace every QuantLinear of ``model`` (in place) by an ``nn.Linear`` holding its
    dequantized weight in ``dtype`` (default: the layer's bias dtype, else float16);
    returns ``model``."""
    if isinstance(dtype, str):  # a config's dtype after save_pretrained, e.g. "float16"
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        from lowvm.nn.errors import QuantizationError

        raise QuantizationError(f"dequantize_model: dtype={dtype!r}; expected a floating "
                                "torch dtype such as torch.float16")
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, QuantLinear)]
    for name, layer in layers:
        dt = dtype or (layer.bias.dtype if layer.bias is not None else torch.float16)
        dense = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None,
                          device=layer.qweight.device, dtype=dt)
        dense.weight.copy_(layer.dequantize(dt))
        if layer.bias is not None:
            dense.bias.copy_(layer.bias)
        set_module(model, name, dense)
    return model
