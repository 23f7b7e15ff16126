"""The checks a :class:`~lowvm.nn.layer.quant_linear.QuantLinear`'s tensors get wherever
they come in: ``set_codes``, ``load_state_dict``, transformers' loading, the checkpoint
importers and a bias copied from a dense layer.

A scale, zero point or bias that is not finite once stored (a NaN, or a float32 value
beyond float16's range) makes every output it touches NaN or inf; a ``qweight`` of another
dtype would be cast, changing its bytes; an ``input_perm`` that is not a permutation
reads the wrong inputs, or past the end of x. Each function returns the problem as a
sentence (None when there is none), so every caller raises its own error class with its
own context. They run when tensors are stored, never per forward call.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["storage_problem", "permutation_problem", "bias_problem", "layer_tensors_problem"]


def storage_problem(name: str, value: torch.Tensor, dtype: torch.dtype) -> str | None:
    """Why ``value`` is not finite once stored as ``dtype`` (its first bad element)."""
    if value.is_meta or value.numel() == 0:
        return None
    stored = value.detach().to(dtype)
    bad = ~torch.isfinite(stored)
    if not bool(bad.any()):
        return None
    index = tuple(int(i) for i in bad.nonzero()[0])
    original = value[index].item()
    at = f"{name}[{', '.join(map(str, index))}]"
    count = int(bad.sum())
    more = f" ({count} elements in all)" if count > 1 else ""
    if math.isfinite(original):
        top = torch.finfo(dtype).max
        return (f"{at} = {original:g}{more} is beyond {_name(dtype)}'s range (largest "
                f"{top:g}), the dtype the layer keeps its {name} in")
    return f"{at} is {original}{more}; {name} must be finite"


def permutation_problem(value: Any, size: int) -> str | None:
    """Why ``value`` is not a permutation of ``0..size-1`` (an integer tensor)."""
    if (not isinstance(value, torch.Tensor) or value.dtype.is_floating_point
            or value.dtype.is_complex or value.dtype == torch.bool):
        got = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
        return f"input_perm must be an integer tensor; got {got}"
    if value.is_meta:
        return None
    if tuple(value.shape) != (size,):
        return f"input_perm must have shape ({size},); got {tuple(value.shape)}"
    flat = value.detach().long().cpu()
    outside = (flat < 0) | (flat >= size)
    if bool(outside.any()):
        at = int(outside.nonzero()[0])
        return (f"input_perm[{at}] = {int(flat[at])} lies outside [0, {size}); it must be a "
                f"permutation of 0..{size - 1} (the order of the input channels)")
    counts = torch.bincount(flat, minlength=size)
    if bool((counts != 1).any()):
        twice = int((counts > 1).nonzero()[0])
        return (f"input_perm holds {twice} {int(counts[twice])} times (and lacks "
                f"{int((counts == 0).nonzero()[0])}); it must be a permutation of "
                f"0..{size - 1} (the order of the input channels)")
    return None


def bias_problem(bias: Any, out_features: int, dtype: torch.dtype) -> str | None:
    """Why ``bias`` cannot be a layer's bias of ``out_features`` kept as ``dtype``."""
    if (not isinstance(bias, torch.Tensor) or not bias.dtype.is_floating_point
            or tuple(bias.shape) != (out_features,)):
        got = (f"{bias.dtype} tensor of shape {tuple(bias.shape)}"
               if isinstance(bias, torch.Tensor) else type(bias).__name__)
        return f"bias must be a float tensor of shape ({out_features},); got {got}"
    problem = storage_problem("bias", bias, dtype)
    if problem and "range" in problem:
        other = "bfloat16" if dtype == torch.float16 else "float16"
        problem += f" (it follows the weight's: load the model in {other})"
    return problem


def layer_tensors_problem(layer: Any, tensors: Mapping[str, Any]) -> str | None:
    """Why ``tensors`` (buffer name -> tensor, as a state dict or a loader gives them)
    cannot be ``layer``'s: the first problem found, or None."""
    qweight = tensors.get("qweight")
    if isinstance(qweight, torch.Tensor) and qweight.dtype != torch.uint8:
        return (f"qweight is {qweight.dtype}; it holds the bytes of the kernel's layout and "
                "must be torch.uint8 (a cast would change the codes)")
    stored = {"scales": torch.float16, "zeros": torch.float16}
    if getattr(layer, "bias", None) is not None:
        stored["bias"] = layer.bias.dtype
    for name, dtype in stored.items():
        value = tensors.get(name)
        if isinstance(value, torch.Tensor):
            problem = storage_problem(name, value, dtype)
            if problem:
                return problem
    perm = tensors.get("input_perm")
    if perm is not None and getattr(layer, "input_perm", None) is not None:
        return permutation_problem(perm, layer.in_features)
    return None


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
