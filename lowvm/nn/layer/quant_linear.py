"""``QuantLinear``: a drop-in replacement for ``torch.nn.Linear`` with low-bit weights.

It holds the packed weights (``qweight``: the codes in the GPU kernel's repacked layout,
see :mod:`lowvm.nn.layer.kernel_format`; the one copy of the weight, on every device), float16
group scales, optional zero points, an optional bias and, for GPTQ act-order
checkpoints, the input permutation that makes groups contiguous. These five are the
module's only buffers, all persistent, so ``state_dict()``, ``save_pretrained`` and
``.to(device)`` work as for any module and move each tensor once; scales and zero
points keep float16 when the model is cast (``model.to(torch.bfloat16)`` would otherwise
round them a second time). The reference (CPU) path unpacks the codes on each call.

**Checkpoint format: the repacked layout, with a record of its version.** ``state_dict()``
holds ``qweight`` exactly as stored, not converted to plain bit-stream rows. Why:

- saving and loading are plain copies. Converting would allocate a second copy of every
  weight whenever a state dict is made (on the GPU, for a whole model at once in
  ``save_pretrained``), and transformers' loader assigns checkpoint tensors to buffers
  directly (``setattr``, bypassing ``_load_from_state_dict``), so a converted format would
  need a fix-up pass after every ``from_pretrained``.
- the price: a checkpoint is tied to the kernel's format, which changes with the kernel
  library. So every layer records the format's fingerprint (a hash of the library's own
  output on probe weights, :attr:`KernelFormat.fingerprint`): as ``_extra_state`` (8
  bytes, uint8) in its state dict and as ``kernel_format`` in :meth:`layer_config` (which
  ``LowvmConfig.modules`` saves). A ``qweight`` whose record differs or is missing (a
  checkpoint from before a format change, or from older lowvm, which saved plain
  ``[N, K*bits/8]`` rows) raises :class:`~lowvm.nn.errors.WeightFormatError` before any
  buffer changes, instead of loading bytes the kernel would misread, except an earlier
  layout this lowvm still derives exactly, which is converted while loading
  (:mod:`lowvm.nn.layer.layout_migration` makes these checks and conversions). The codes
  themselves stay portable: :meth:`QuantLinear.codes` gives them, :meth:`set_codes`
  takes them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from lowvm.dtypes import DType
from lowvm.nn.errors import ActivationError, CheckpointError, QuantizationError
from lowvm.nn.layer import custom_op  # noqa: F401  (registers torch.ops.lowvm.quant_linear)
from lowvm.nn.layer import layout_migration as migration
from lowvm.nn.layer.backend import EagerLaunches
from lowvm.nn.layer.backend import quant_linear as backend_quant_linear
from lowvm.nn.layer.kernel_format import KernelFormat, layer_kernel_format
from lowvm.nn.layer.packed import PackedLinear, dequantize, unpack_codes
from lowvm.nn.layer.quantize import quantize_weight
from lowvm.nn.layer.spec import QuantSpec, make_spec
from lowvm.nn.layer.tensor_checks import (
    bias_problem,
    layer_tensors_problem,
    permutation_problem,
    storage_problem,
)

__all__ = ["QuantLinear", "bias_dtype_for"]

_ACTIVATION_DTYPES = (torch.float16, torch.bfloat16)
# what makes a call traced rather than eager (each a C call of well under a microsecond)
_dispatch_modes = torch._C._len_torch_dispatch_stack
_functorch_active = torch._C._are_functorch_transforms_active
_jit_tracing = torch._C._get_tracing_state
# whether x is where the kernels run (one place to ask, so CPU tests can stand in for CUDA)
_on_kernel_device = operator.attrgetter("is_cuda")
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
        """An empty layer (all-zero bytes): fill it with ``load_state_dict`` or
        :meth:`set_codes`."""
        super().__init__()
        for name, value in (("in_features", in_features), ("out_features", out_features)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise QuantizationError(f"QuantLinear: {name} must be a positive int; "
                                        f"got {value!r}")
        self.spec: QuantSpec = make_spec(dtype, group_size, zero_point, in_features,
                                         out_features)
        self.in_features, self.out_features = in_features, out_features
        groups = in_features // self.spec.group_size
        kw: dict[str, Any] = {"device": device}
        shape = self.kernel_format.shape(out_features, in_features)
        self.register_buffer("qweight", torch.zeros(shape, dtype=torch.uint8, **kw))
        self.register_buffer("scales", torch.ones(groups, out_features, dtype=torch.float16,
                                                  **kw))
        self.register_buffer("zeros", torch.zeros(groups, out_features, dtype=torch.float16,
                                                  **kw) if self.spec.zero_point else None)
        self.register_buffer("bias", torch.zeros(out_features, dtype=bias_dtype, **kw)
                             if bias else None)
        self.register_buffer("input_perm", torch.arange(in_features, **kw)
                             if act_order else None)

    @property
    def wtype(self) -> DType:
        return self.spec.wtype

    @property
    def group_size(self) -> int:
        return self.spec.group_size

    @classmethod
    def from_linear(cls, linear: nn.Linear, dtype: Any = "int4", group_size: int | None = 128,
                    zero_point: bool | None = None, *, name: str | None = None) -> QuantLinear:
        """Quantize ``linear`` round-to-nearest (see :mod:`lowvm.nn.layer.quantize`); it is
        not changed.

        ``zero_point`` None: on for uintN (min/max with zero points), off for intN/eXmY
        (absmax). The bias keeps the linear's dtype (float32 biases become float16).
        ``name``: the module's name in its model, for error messages. A weight with a NaN
        or inf, or a group whose scale float16 cannot hold, is refused.
        """
        if not isinstance(linear, nn.Linear):
            raise QuantizationError(f"QuantLinear.from_linear: linear must be a torch.nn.Linear;"
                                    f" got {type(linear).__name__}")
        weight = linear.weight
        if weight.is_meta:
            raise QuantizationError("QuantLinear.from_linear: the linear's weight is on the "
                                    "meta device (not loaded yet); load the weights first")
        return cls.from_weight(weight, dtype, group_size, zero_point, bias=linear.bias,
                               where=f"layer {name!r}" if name else "QuantLinear.from_linear")

    @classmethod
    @torch.no_grad()
    def from_weight(cls, weight: torch.Tensor, dtype: Any = "int4",
                    group_size: int | None = 128, zero_point: bool | None = None, *,
                    bias: torch.Tensor | None = None, where: str = "QuantLinear.from_weight"
                    ) -> QuantLinear:
        """A layer quantizing the dense ``weight [out_features, in_features]`` (round to
        nearest), on its device. ``bias``: copied in; a bias still on the meta device (not
        loaded yet, as while transformers loads a checkpoint) gives the layer a zero bias
        buffer to be loaded later; one float16 cannot hold (a float32 bias beside float16
        weights) is refused. ``where`` names the layer in error messages."""
        if bias is not None and not bias.is_meta:
            problem = bias_problem(bias, weight.shape[0], bias_dtype_for(weight.dtype))
            if problem:
                raise QuantizationError(f"{where}: {problem}")
        layer = cls(weight.shape[1], weight.shape[0], dtype, group_size, zero_point,
                    bias=bias is not None, device=weight.device,
                    bias_dtype=bias_dtype_for(weight.dtype))
        codes, scales, zeros = quantize_weight(weight, layer.spec, where)
        layer.set_codes(codes, scales, zeros)
        if bias is not None and not bias.is_meta:
            assert layer.bias is not None
            layer.bias.copy_(bias.detach())
        return layer

    @property
    def kernel_format(self) -> KernelFormat:
        """The repacked layout ``qweight`` is stored in (it depends on type and group)."""
        return layer_kernel_format(self.spec.wtype, self.spec.group_size, self.in_features)

    @torch.no_grad()
    def set_codes(self, codes: torch.Tensor, scales: torch.Tensor,
                  zeros: torch.Tensor | None, input_perm: torch.Tensor | None = None) -> None:
        """Store ``codes [N, K]`` (integers < 2**bits, in input order after ``input_perm``),
        ``scales [K/group, N]``, ``zeros`` (layers with zero points) and the permutation
        (act-order layers). Everything is checked, and repacked, before any buffer changes."""
        where = "QuantLinear.set_codes"
        n, k, nbits = self.out_features, self.in_features, self.spec.wtype.nbits
        if (not isinstance(codes, torch.Tensor) or codes.shape != (n, k)
                or codes.dtype.is_floating_point or codes.dtype.is_complex):
            raise QuantizationError(f"{where}: codes must be an integer tensor of shape "
                                    f"({n}, {k}); got {migration.describe(codes)}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= 1 << nbits):
            raise QuantizationError(f"{where}: codes of {self.spec.wtype.name} lie in "
                                    f"[0, {(1 << nbits) - 1}]; got values in "
                                    f"[{int(codes.min())}, {int(codes.max())}]")
        _check_like(where, "scales", scales, self.scales)
        _check_stored(where, "scales", scales)
        if self.zeros is None:
            if zeros is not None:
                raise QuantizationError(f"{where}: this {self.spec.wtype.name} layer is "
                                        "symmetric (no zero points); zeros must be None")
        elif zeros is None:
            raise QuantizationError(f"{where}: this layer has zero points; zeros must be "
                                    "given")
        else:
            _check_like(where, "zeros", zeros, self.zeros)
            _check_stored(where, "zeros", zeros)
        if input_perm is not None:
            if self.input_perm is None:
                raise QuantizationError(f"{where}: input_perm given, but the layer was built "
                                        "without act_order=True")
            problem = permutation_problem(input_perm, k)
            if problem:
                raise QuantizationError(f"{where}: {problem}")
        packed = self.kernel_format.repack(codes.to(device=self.qweight.device,
                                                    dtype=torch.uint8))
        self.qweight.copy_(packed)
        self.scales.copy_(scales)
        if self.zeros is not None and zeros is not None:
            self.zeros.copy_(zeros)
        if self.input_perm is not None and input_perm is not None:
            self.input_perm.copy_(input_perm)

    def codes(self) -> torch.Tensor:
        """The codes ``[out_features, in_features]`` (uint8, stored K order, i.e. after
        ``input_perm``), unpacked from ``qweight`` on its device."""
        return unpack_codes(self.packed())

    def get_extra_state(self) -> torch.Tensor:
        """The format record saved beside ``qweight``; loading checks it (see
        :mod:`lowvm.nn.layer.layout_migration`)."""
        return migration.format_record(self.kernel_format)

    def set_extra_state(self, state: Any) -> None:
        migration.check_record(self, state)

    def expect_earlier_layout(self, fingerprint: str | None) -> bool:
        """Whether ``fingerprint`` names an earlier layout this layer converts from. If so,
        the layer takes the ``qweight`` and record assigned next as being in it (as
        transformers' loader assigns them, bypassing :meth:`load_state_dict`), and
        :func:`~lowvm.nn.layer.layout_migration.convert_earlier_layouts` converts them once
        assigned."""
        return migration.expect_earlier_layout(self, fingerprint)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str,
                              *args: Any, **kwargs: Any) -> None:
        state_dict = migration.check_state_dict(self, state_dict, prefix)
        problem = layer_tensors_problem(self, {name: state_dict.get(prefix + name)
                                               for name in self._buffers})
        if problem:
            raise CheckpointError(f"{migration.describe_layer(self)}: the state dict's {problem}")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

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
        """Eager calls on CUDA launch the kernel directly (:class:`~lowvm.nn.layer.backend.
        EagerLaunches`: a few microseconds of host time); all others (traced: torch.compile,
        export, jit, dispatch modes, functorch, autograd through x; or on the CPU) go
        through the custom op ``torch.ops.lowvm.quant_linear``, which tracers see as one
        opaque node. Both make the same checks of x."""
        if (torch.compiler.is_compiling() or type(x) is not torch.Tensor
                or _dispatch_modes() or _functorch_active() or _jit_tracing() is not None):
            return self._op_forward(x)
        buffers = self._buffers
        qweight = buffers["qweight"]
        dtype = x.dtype
        # on the kernel's device, the same device index as the weight's means the same device
        if ((dtype is not torch.float16 and dtype is not torch.bfloat16)
                or not _on_kernel_device(x) or x.get_device() != qweight.get_device()
                or (x.requires_grad and torch.is_grad_enabled())):
            return self._op_forward(x)
        shape = x.shape
        k = self.in_features
        if len(shape) == 2 and shape[1] == k:
            x2d = x
        elif not shape or shape[-1] != k:
            return self._op_forward(x)  # raises the shape's ActivationError
        else:
            x2d = x.reshape(-1, k)
        perm = buffers["input_perm"]
        if perm is not None:
            x2d = x2d.index_select(1, perm)
        launches = self.__dict__.get("_eager_launches")
        if launches is None:
            launches = self.__dict__["_eager_launches"] = EagerLaunches()
        spec = self.spec
        y = launches(x2d, qweight, buffers["scales"], buffers["zeros"], buffers["bias"],
                     spec.wtype, spec.group_size)
        if y is None:
            y = backend_quant_linear(x2d, self.packed())
        return y if x2d is x else y.reshape(*shape[:-1], self.out_features)

    def _check_input(self, x: torch.Tensor) -> None:
        """The activation checks every path makes (ActivationError names what is wrong)."""
        if not isinstance(x, torch.Tensor):
            kind = type(x).__qualname__
            if type(x).__module__ != "builtins":
                kind = f"{type(x).__module__}.{kind}"
            raise ActivationError(f"QuantLinear: x must be a torch.Tensor; got a {kind} "
                                  "(convert it, e.g. torch.as_tensor(x, dtype=torch.float16))")
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

    def _op_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The forward through the custom op (what tracing and torch.compile see)."""
        self._check_input(x)
        if self.input_perm is not None:
            x = x.index_select(-1, self.input_perm)
        lead = x.shape[:-1]
        y = torch.ops.lowvm.quant_linear(x.reshape(-1, self.in_features), self.qweight,
                                         self.scales, self.zeros, self.bias,
                                         self.spec.wtype.name, self.spec.group_size)
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
        return self

    def layer_config(self) -> dict[str, Any]:
        """Everything needed to rebuild an empty layer of this format (JSON-able)."""
        return {**self.spec.to_dict(), "bias": self.bias is not None,
                "act_order": self.input_perm is not None,
                "kernel_format": self.kernel_format.fingerprint}

    def weight_bytes(self) -> int:
        """Bytes the layer holds: packed weights (one copy), scales, zeros, bias and
        permutation, i.e. every buffer."""
        return sum(b.numel() * b.element_size() for b in self.buffers(recurse=False))

    def extra_repr(self) -> str:
        s = self.spec
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"dtype={s.wtype.name}, group_size={s.group_size}, zero_point={s.zero_point}, "
                f"bias={self.bias is not None}, act_order={self.input_perm is not None}")


def bias_dtype_for(dtype: torch.dtype | None) -> torch.dtype:
    """The dtype a layer keeps its bias in, given the source's: float16 or bfloat16 as
    they are, anything else (float32, none) float16."""
    return dtype if dtype in _ACTIVATION_DTYPES else torch.float16


def _check_stored(where: str, name: str, value: torch.Tensor) -> None:
    """``value`` must stay finite as the float16 the layer keeps it in."""
    problem = storage_problem(name, value, torch.float16)
    if problem:
        raise QuantizationError(f"{where}: {problem}")


def _check_like(where: str, name: str, value: Any, buffer: torch.Tensor) -> None:
    """``value`` must be a tensor of ``buffer``'s shape (its dtype is converted on copy)."""
    if not isinstance(value, torch.Tensor) or value.shape != buffer.shape:
        raise QuantizationError(f"{where}: {name} must be a tensor of shape "
                                f"{tuple(buffer.shape)}; got {migration.describe(value)}")
