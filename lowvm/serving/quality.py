"""What quantization costs: a quantized model's logits and layers against float16's."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

from lowvm.nn.layer.quant_linear import QuantLinear

__all__ = ["logit_errors", "layer_errors"]


def logit_errors(dense: Any, quant: Any, ids: torch.Tensor) -> dict[str, float]:
    """``quant``'s logits for ``ids`` against ``dense``'s: the last position's relative
    error and the top-1 agreement over all positions."""
    with torch.no_grad():
        a = dense(ids, use_cache=False).logits.float()
        b = quant(ids, use_cache=False).logits.float()
    last = ((b[:, -1] - a[:, -1]).norm() / a[:, -1].norm()).item()
    top1 = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    return {"last_logits_rel_error": last, "top1_agreement": top1}


def layer_errors(dense: Any, quant: Any, ids: torch.Tensor) -> dict[str, float]:
    """Each quantized layer's output against its float16 original's, both fed the input the
    float16 model gives that layer for ``ids`` (relative error ``|q(x) - f(x)| / |f(x)|``,
    median and largest over the layers): the quantization's own error, which the last
    logits' error compounds through every layer after it (on random weights, by far).
    Call it before ``fuse_projections``: it pairs the layers by name."""
    errors: list[float] = []
    hooks = []

    def compare(q: Any) -> Callable[..., None]:
        def hook(_module: Any, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            ref = output.float()
            norm = ref.norm().item()
            if norm > 0:
                errors.append((q(inputs[0]).float() - ref).norm().item() / norm)
        return hook

    for name, module in dense.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        try:
            q = quant.get_submodule(name)
        except AttributeError:
            continue
        if isinstance(q, QuantLinear):
            hooks.append(module.register_forward_hook(compare(q)))
    try:
        with torch.no_grad():
            dense(ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    if not errors:
        return {}
    return {"layer_rel_error_median": statistics.median(errors),
            "layer_rel_error_max": max(errors), "layers_compared": len(errors)}
