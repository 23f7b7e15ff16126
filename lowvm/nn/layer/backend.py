"""Where a quantized linear layer meets the GPU kernel: the only file that calls it.

:func:`quant_linear` picks the path for one call: :func:`cuda_quant_linear` (the
library's ``quant_gemm``, :mod:`lowvm.kernels.library`) for float16/bfloat16 activations
on a CUDA device, otherwise the reference path (dequantize, then matmul in float32).
Weight types whose values float16 cannot hold (``float7_e5m1``, ``float8_e6m1``: the
kernel converts codes to the activation type) run float16 activations through the
bfloat16 kernel (:func:`kernel_dtype`): x is converted to bfloat16, y back to float16,
then the bias is added; x, the scales and y each pass through bfloat16's 8-bit
significand on the way.
:class:`EagerLaunches` is the eager fast path: a layer's calls prepared once per call
shape and stream, so a call issued outside a CUDA graph costs a few microseconds of
host time instead of the custom op's dispatch plus the planning below.
:class:`~lowvm.nn.layer.quant_linear.QuantLinear` stores its codes once, already in the
kernel's repacked layout (:mod:`lowvm.nn.layer.kernel_format`), so the kernel reads the layer's
``qweight`` as it is and the reference path unpacks it on each call.
:func:`shape_problem` states the kernel's shape rules for the checks made before any
weight is quantized.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch

from lowvm.dtypes import DType
from lowvm.kernels.library import (
    GemmLaunch,
    QuantWeight,
    fits_float16,
    prepare_quant_linear,
    weight_bk,
)
from lowvm.kernels.library import quant_linear as library_quant_linear
from lowvm.nn.layer.packed import PackedLinear, dequantize
from lowvm.runtime.launch import eager_stream

__all__ = ["quant_linear", "cuda_quant_linear", "reference_quant_linear", "shape_problem",
           "kernel_dtype", "EagerLaunches", "LowvmFallbackWarning", "IN_FEATURES_MULTIPLE",
           "OUT_FEATURES_MULTIPLE", "GROUP_MULTIPLE"]

# The kernel's tile rules: K runs in steps of bk = min(128, group) (a multiple of the
# MMA's k = 16), and the repacked weight is tiled by 64 along N.
IN_FEATURES_MULTIPLE = 64
OUT_FEATURES_MULTIPLE = 64
GROUP_MULTIPLE = 16


class LowvmFallbackWarning(UserWarning):
    """A quantized layer ran on the (slow) reference path instead of the GPU kernel."""


_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, LowvmFallbackWarning, stacklevel=3)


def shape_problem(in_features: int, out_features: int, group_size: int) -> str | None:
    """Why the kernel cannot run this layer shape (a sentence), or None when it can."""
    if in_features % IN_FEATURES_MULTIPLE:
        return (f"in_features={in_features} is not a multiple of {IN_FEATURES_MULTIPLE}, "
                "the kernel's K tile")
    if out_features % OUT_FEATURES_MULTIPLE:
        return (f"out_features={out_features} is not a multiple of {OUT_FEATURES_MULTIPLE}, "
                "the kernel's N tile")
    if group_size % GROUP_MULTIPLE:
        return (f"group_size={group_size} is not a multiple of {GROUP_MULTIPLE} "
                "(the kernel steps K by a multiple of 16 inside each group)")
    bk = weight_bk(group_size, in_features)
    if group_size % bk or in_features % bk:  # the layer stores its weight in bk-wide tiles
        return (f"group_size={group_size} and in_features={in_features} must both be "
                f"multiples of the kernel's K step bk={bk} (min(128, group_size))")
    return None


def reference_quant_linear(x2d: torch.Tensor, layer: PackedLinear) -> torch.Tensor:
    """Dequantize, then ``x @ W^T + bias`` in float32, rounded once to x's dtype."""
    y = x2d.float() @ dequantize(layer, torch.float32).t()
    if layer.bias is not None:
        y = y + layer.bias.float()
    return y.to(x2d.dtype)


def kernel_dtype(x_dtype: torch.dtype, wtype: DType) -> torch.dtype:
    """The activation type the kernel runs in for ``x_dtype`` activations: their own,
    except float16 with a weight type float16 cannot hold (``fits_float16`` False), which
    runs in bfloat16 (every type of at most 8 bits fits it) rather than on the slow
    reference path."""
    if x_dtype is torch.float16 and not fits_float16(wtype):
        return torch.bfloat16
    return x_dtype


def cuda_quant_linear(x2d: torch.Tensor, layer: PackedLinear) -> torch.Tensor:
    """``x2d [M, K]`` float16/bfloat16 on CUDA -> ``y [M, N]`` through ``quant_gemm``
    (zero points are applied inside the kernel; the bias is added after, in x's type).
    ``layer.qweight`` is already the kernel's repacked weight; see :func:`kernel_dtype`
    for the type the kernel runs in."""
    run = kernel_dtype(x2d.dtype, layer.wtype)
    y = library_quant_linear(x2d.to(run).contiguous(), _kernel_weight(layer, run))
    if run is not x2d.dtype:
        y = y.to(x2d.dtype)
    if layer.bias is not None:
        y = y + layer.bias.to(y.dtype)
    return y


def _kernel_weight(layer: PackedLinear, dtype: torch.dtype) -> QuantWeight:
    """The library's view of ``layer`` for ``dtype`` activations (its scales cast once)."""
    n, k = layer.out_features, layer.in_features
    scales, zeros = _scales_as(layer, dtype)
    return QuantWeight(layer.qweight, scales, layer.wtype, layer.group_size, n, k,
                       weight_bk(layer.group_size, k), zeros)


#: (id of a layer's scales, dtype) -> (scales, zeros, their versions, converted pair)
_CONVERTED: dict[tuple[int, torch.dtype], tuple] = {}


def _scales_as(layer: PackedLinear, dtype: torch.dtype) -> tuple[torch.Tensor, Any]:
    """The layer's scales and zeros in ``dtype``, cast once per layer and kept until the
    layer's tensors change in place (their version counters) or are freed: a bfloat16
    model must not launch a cast before every GEMM."""
    scales, zeros = layer.scales, layer.zeros
    if scales.dtype == dtype and (zeros is None or zeros.dtype == dtype):
        return scales, zeros
    try:
        versions = (scales._version, None if zeros is None else zeros._version)
    except RuntimeError:  # inference-mode tensors keep no version counter: cast per call
        return scales.to(dtype), None if zeros is None else zeros.to(dtype)
    key = (id(scales), dtype)
    hit = _CONVERTED.get(key)
    if hit is None or hit[0]() is not scales or hit[1] is not zeros or hit[2] != versions:
        if hit is None:  # drop the copy with the layer's scales
            weakref.finalize(scales, _CONVERTED.pop, key, None)
        hit = _CONVERTED[key] = (weakref.ref(scales), zeros, versions,
                                 (scales.to(dtype), None if zeros is None else zeros.to(dtype)))
    return hit[3]


def quant_linear(x2d: torch.Tensor, layer: PackedLinear) -> torch.Tensor:
    """The forward of one layer on the best path available for these activations."""
    if x2d.is_cuda and x2d.dtype in (torch.float16, torch.bfloat16):
        return cuda_quant_linear(x2d, layer)
    if not x2d.is_cuda:
        _warn_once("cpu", "lowvm: no CUDA device for these activations; quantized layers run "
                   "on the reference path (dequantize + matmul), which is slow")
    return reference_quant_linear(x2d, layer)


#: more distinct call shapes than this per layer (prefill at every prompt length): start over
_MAX_LAUNCHES = 64


class EagerLaunches:
    """One layer's eager CUDA calls, each call shape prepared once.

    Issued one by one, outside a CUDA graph, a call through the custom op and
    :func:`cuda_quant_linear` spends tens of microseconds on the host (the dispatcher,
    building the weight, choosing and looking up the plan, checking and packing every
    launch argument) for a kernel that may take less. Here each (rows, activation type,
    stream) gets a :class:`~lowvm.kernels.dispatch.GemmLaunch` once; a call then checks
    that the layer still holds the tensors the launches were made from (the same
    objects at the same addresses, and the same versions, since a cast copy of the scales
    or bias must follow in-place changes), allocates y and launches.

    A call returns None where it cannot serve (the stream is capturing a CUDA graph, x is
    not 16-byte aligned, a cast copy would be needed of tensors that keep no version
    counter): the caller then takes the general path, which raises the same errors as
    ever. A copy or pickle of a layer starts with no launches.
    """

    __slots__ = ("_stamp", "_weights", "_biases", "_launches", "_fits16")

    def __init__(self) -> None:
        self._fits16 = True
        self._stamp: tuple | None = None
        self._weights: dict[torch.dtype, QuantWeight] = {}
        self._biases: dict[torch.dtype, torch.Tensor] = {}
        self._launches: dict[tuple, GemmLaunch] = {}

    def __reduce__(self) -> tuple:
        return (EagerLaunches, ())

    def __call__(self, x2d: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 zeros: torch.Tensor | None, bias: torch.Tensor | None, wtype: DType,
                 group_size: int) -> torch.Tensor | None:
        """``x2d [M, K]`` (float16/bfloat16, on the layer's CUDA device, checked by the
        caller) times the layer of these tensors (see :class:`PackedLinear`) -> ``y [M,
        N]``, or None (take the general path)."""
        stream = eager_stream(x2d.get_device())
        if stream is None:
            return None
        try:
            state: tuple = (qweight.data_ptr(), scales.data_ptr(), scales._version,
                            None if zeros is None else (zeros.data_ptr(), zeros._version),
                            None if bias is None else (bias.data_ptr(), bias._version))
        except RuntimeError:  # inference-mode tensors keep no version counter
            state = (qweight.data_ptr(), scales.data_ptr(), None,
                     None if zeros is None else zeros.data_ptr(),
                     None if bias is None else bias.data_ptr())
        stamp = self._stamp
        if (stamp is None or stamp[0] is not qweight or stamp[1] is not scales
                or stamp[2] is not zeros or stamp[3] is not bias or stamp[4] != state
                or stamp[5] is not wtype or stamp[6] != group_size):
            self._stamp = (qweight, scales, zeros, bias, state, wtype, group_size)
            self._fits16 = fits_float16(wtype)
            self._weights.clear()
            self._biases.clear()
            self._launches.clear()
        dtype = x2d.dtype
        run = dtype if dtype is torch.bfloat16 or self._fits16 else torch.bfloat16
        if run is not dtype:
            x2d = x2d.to(run)
        x2d = x2d.contiguous()
        if x2d.data_ptr() & 15:
            return None
        key = (x2d.size(0), run, stream)
        launch = self._launches.get(key)
        y = None if launch is None else launch(x2d, stream)
        if y is None:  # not prepared yet, or the library's plans were cleared: prepare
            if launch is not None:
                self._launches.clear()
            layer = PackedLinear(qweight, scales, zeros, bias, wtype, group_size,
                                 x2d.size(1))
            launch = self._prepare(x2d, layer, key, state[2] is not None)
            if launch is None:
                return None
            y = launch(x2d, stream)
        if run is not dtype:
            y = y.to(dtype)
        if bias is not None:
            b = self._biases.get(dtype)
            if b is None:
                if bias.dtype is not dtype and state[2] is None:
                    b = bias.to(dtype)  # no version to watch: cast per call
                else:
                    b = self._biases[dtype] = bias.to(dtype)
            y += b
        return y

    def _prepare(self, x2d: torch.Tensor, layer: PackedLinear, key: tuple, versioned: bool
                 ) -> GemmLaunch | None:
        """The launch for ``key`` (made now), or None where the scales would need a cast
        copy that no version counter could keep in step with the layer."""
        run = key[1]
        weight = self._weights.get(run)
        if weight is None:
            if not versioned and layer.scales.dtype is not run:
                return None
            weight = self._weights[run] = _kernel_weight(layer, run)
        if len(self._launches) >= _MAX_LAUNCHES:
            self._launches.clear()
        launch = self._launches[key] = prepare_quant_linear(x2d, weight)
        return launch
