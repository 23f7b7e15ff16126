"""``QuantLinear``: a drop-in replacement for ``torch.nn.Linear`` with low-bit weights.

It holds the packed weights, float16 group scales, optional zero points, an optional
bias and, for GPTQ act-order checkpoints, the input permutation that makes groups
contiguous. Everything is a persistent buffer, so ``state_dict()``, ``save_pretrained``
and ``.to(device)`` work as for any module; scales and zero points keep float16 when the
model is cast (``model.to(torch.bfloat16)`` would otherwise round them a second time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lowvm.dtypes import DType
from lowvm.nn import custom_op  # noqa: F401  (registers torch.ops.lowvm.quant_linear)
from lowvm.nn.errors import ActivationError, QuantizationError
from lowvm.nn.packed import PackedLinear, dequantize
from lowvm.nn.packing import pack_rows
from lowvm.nn.quantize import quantize_weight
from lowvm.nn.spec import QuantSpec, make_spec

__all__ = ["QuantLinear"]

_ACTIVATION_DTYPES = (torch.float16, torch.bfloat16)
_KEEP_DTYPE = ("scales", "zeros")  # quantization data: moved with the model, never re-cast


class QuantLinear(nn.Module):
    """``y = x @ dequant(W)^T + bias`` over any leading dims of float16/bfloat16 ``x``."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    bias: torch.Tensor | None
    input_perm: torch.Tensor | None

    def __init__(self, in_features: int, out_features: int, dtype: Any = "int4",
                 group_size: int | None = 128, zero_point: bool | None = None,
                 bias: bool = False, act_order: bool = False,
                 device: torch.device | str | None = None,
                 bias_dtype: torch.dtype = torch.float16) -> None:
        """An empty layer (zeros) of this format: fill it with ``load_state_dict``."""
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise QuantizationError(f"QuantLinear: {name} must be a positive int; "
                                        f"got {value!r}")
        self.spec: QuantSpec = make_spec(dtype, group_size, zero_point, in_features,
                                         out_features)
        self.in_features, self.out_features = in_features, out_features
        groups = in_features // self.spec.group_size
        row_bytes = in_features * self.spec.wtype.nbits // 8
        kw: dict[str, Any] = {"device": device}
        self.register_buffer("qweight", torch.zeros(out_features, row_bytes, dtype=torch.uint8,
                                                    **kw))
        self.register_buffer("scales", torch.ones(groups, out_features, dtype=torch.float16,
                                                  **kw))
        self.register_buffer("zeros", torch.zeros(groups, out_features, dtype=torch.float16,
                                                  **kw) if self.spec.zero_point else None)
        self.register_buffer("bias", torch.zeros(out_features, dtype=bias_dtype, **kw)
                             if bias else None)
        self.register_buffer("input_perm", torch.arange(in_features, **kw)
                             if act_order else None)
        # the GPU kernel's repacked copy of qweight: derived, never saved, remade whenever
        # qweight changes through this class (set_codes, load_state_dict, .to/.cuda)
        self.register_buffer("kernel_weight", None, persistent=False)
        self._refresh_kernel_weight()

    @property
    def wtype(self) -> DType:
        return self.spec.wtype

    @property
    def group_size(self) -> int:
        return self.spec.group_size

    @classmethod
    def from_linear(cls, linear: nn.Linear, dtype: Any = "int4", group_size: int | None = 128,
                    zero_point: bool | None = None) -> QuantLinear:
        """Quantize ``linear`` round-to-nearest (see :mod:`lowvm.nn.quantize`); it is not changed.

        ``zero_point`` None: on for uintN (min/max with zero points), off for intN/eXmY
        (absmax). The bias keeps the linear's dtype (float32 biases become float16).
        """
        if not isinstance(linear, nn.Linear):
            raise QuantizationError(f"QuantLinear.from_linear: linear must be a torch.nn.Linear;"
                                    f" got {type(linear).__name__}")
        weight = linear.weight
        if weight.is_meta:
            raise QuantizationError("QuantLinear.from_linear: the linear's weight is on the "
                                    "meta device (not loaded yet); load the weights first")
        bias_dtype = _bias_dtype(linear)
        layer = cls(linear.in_features, linear.out_features, dtype, group_size, zero_point,
                    bias=linear.bias is not None, device=weight.device, bias_dtype=bias_dtype)
        codes, scales, zeros = quantize_weight(weight, layer.spec)
        layer.set_codes(codes, scales, zeros)
        if linear.bias is not None:
            assert layer.bias is not None
            layer.bias.copy_(linear.bias.detach())
        return layer

    @torch.no_grad()
    def set_codes(self, codes: torch.Tensor, scales: torch.Tensor,
                  zeros: torch.Tensor | None, input_perm: torch.Tensor | None = None) -> None:
        """Store ``codes [N, K]`` (uint8, in input order after ``input_perm``) and scales."""
        self.qweight.copy_(pack_rows(codes.to(self.qweight.device), self.spec.wtype.nbits))
        self.scales.copy_(scales)
        if self.zeros is not None:
            if zeros is None:
                raise QuantizationError("QuantLinear.set_codes: this layer has zero points; "
                                        "zeros must be given")
            self.zeros.copy_(zeros)
        if self.input_perm is not None and input_perm is not None:
            self.input_perm.copy_(input_perm)
        self._refresh_kernel_weight()

    @torch.no_grad()
    def _refresh_kernel_weight(self) -> None:
        """Repack ``qweight`` for the GPU kernel (on CUDA only; None elsewhere)."""
        from lowvm.nn.backend import repack_for_kernel

        self.kernel_weight = (repack_for_kernel(self.packed()) if self.qweight.is_cuda
                              else None)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._refresh_kernel_weight()

    def packed(self) -> PackedLinear:
        """The tensors every forward path works from (in stored K order)."""
        return PackedLinear(self.qweight, self.scales, self.zeros, self.bias, self.spec.wtype,
                            self.spec.group_size, self.in_features)

    @torch.no_grad()
    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense weight ``[out_features, in_features]`` in the original input order."""
        stored = dequantize(self.packed(), torch.float32)
        if self.input_perm is not None:
            weight = torch.empty_like(stored)
            weight[:, self.input_perm] = stored
            stored = weight
        return stored.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in _ACTIVATION_DTYPES:
            raise ActivationError(f"QuantLinear: x has dtype {x.dtype}; quantized layers take "
                                  "torch.float16 or torch.bfloat16 activations (cast the model,"
                                  " e.g. model.to(torch.float16))")
        if x.device != self.qweight.device:
            raise ActivationError(f"QuantLinear: x is on {x.device} but the layer's weights are"
                                  f" on {self.qweight.device}; move one to the other")
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ActivationError(f"QuantLinear: x has shape {tuple(x.shape)}; its last "
                                  f"dimension must be in_features={self.in_features}")
        if self.input_perm is not None:
            x = x.index_select(-1, self.input_perm)
        lead = x.shape[:-1]
        y = torch.ops.lowvm.quant_linear(x.reshape(-1, self.in_features), self.qweight,
                                         self.scales, self.zeros, self.bias,
                                         self.spec.wtype.name, self.spec.group_size,
                                         self.kernel_weight)
        return y.reshape(*lead, self.out_features)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
               ) -> QuantLinear:
        order = list(self._buffers)
        kept = {name: self._buffers.pop(name) for name in _KEEP_DTYPE if name in self._buffers}
        try:
            super()._apply(fn, recurse)
            for name, tensor in kept.items():
                if tensor is not None:
                    moved = fn(tensor)
                    if moved.dtype != tensor.dtype:  # a cast: keep the stored precision
                        moved = tensor.to(device=moved.device)
                    kept[name] = moved
        finally:
            merged = {**self._buffers, **kept}
            self._buffers.clear()
            self._buffers.update((name, merged[name]) for name in order)
        if (self.kernel_weight is None) == self.qweight.is_cuda:  # moved to or from CUDA
            self._refresh_kernel_weight()
        return self

    def layer_config(self) -> dict[str, Any]:
        """Everything needed to rebuild an empty layer of this format (JSON-able)."""
        return {**self.spec.to_dict(), "bias": self.bias is not None,
                "act_order": self.input_perm is not None}

    def weight_bytes(self) -> int:
        """Bytes held by the layer (packed weights, scales, zeros, bias, permutation; the
        kernel's repacked copy is the same bytes in another order and is not counted)."""
        return sum(b.numel() * b.element_size() for name, b in self.named_buffers(
            recurse=False) if name != "kernel_weight")

    def extra_repr(self) -> str:
        s = self.spec
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"dtype={s.wtype.name}, group_size={s.group_size}, zero_point={s.zero_point}, "
                f"bias={self.bias is not None}, act_order={self.input_perm is not None}")


def _bias_dtype(linear: nn.Linear) -> torch.dtype:
    """The linear's float16/bfloat16 dtype; float32 layers get float16 biases."""
    dt = linear.weight.dtype
    return dt if dt in _ACTIVATION_DTYPES else torch.float16
