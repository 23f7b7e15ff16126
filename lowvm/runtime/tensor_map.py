"""Tensor maps for a launch: the 128-byte descriptors a kernel's tensor copies read.

Code generation names each map a kernel needs (:class:`~lowvm.codegen.tensor_maps.
TensorMapSpec`: a pointer parameter seen with the shape and strides of a global view,
copied in boxes with a swizzle). Here the host evaluates a spec with one launch's
arguments, checks what the driver would refuse (so the error names the view and the
values instead of a bare CUDA_ERROR_INVALID_VALUE), and encodes it with
``cuTensorMapEncodeTiled``. The checks need no GPU and are tested without one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lowvm.codegen.tensor_maps import TensorMapSpec
from lowvm.dtypes import bfloat16, float16, float32, int32
from lowvm.expr import evaluate
from lowvm.runtime.errors import LaunchError

__all__ = ["TensorMapFields", "tensor_map_fields", "encode_tensor_map", "TENSOR_MAP_BYTES"]

#: bytes of one tensor map (CUtensorMap)
TENSOR_MAP_BYTES = 128

#: the driver's element type of each VM type a map can hold (other 1-byte types: codes)
_DATA_TYPES = {float16: "FLOAT16", bfloat16: "BFLOAT16", float32: "FLOAT32", int32: "INT32"}


@dataclass(frozen=True)
class TensorMapFields:
    """What ``cuTensorMapEncodeTiled`` takes, innermost dim first as the driver counts."""

    data_type: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]  # bytes, dims 1.. (rank - 1 entries)
    box: tuple[int, ...]
    swizzle: int


def tensor_map_fields(spec: TensorMapSpec, address: int,
                      scalars: Mapping[str, int | float]) -> TensorMapFields:
    """The encoding of ``spec`` for a launch with pointer ``address`` and these scalar
    arguments; a LaunchError names the view's values the hardware cannot take."""
    shape = [int(evaluate(s, scalars)) for s in spec.shape]
    strides = [int(evaluate(s, scalars)) for s in spec.strides]
    elem = spec.dtype.nbits // 8
    where = (f"the tensor copy of {spec.pointer!r} (a view of shape {shape}, strides "
             f"{strides} elements of {spec.dtype.name})")
    if address % 16:
        raise LaunchError(f"{where}: the address {address:#x} must be a multiple of 16")
    if strides[-1] != 1:
        raise LaunchError(f"{where}: the innermost stride must be 1, got {strides[-1]}")
    for d, size in enumerate(shape):
        if not 1 <= size <= 1 << 32:
            raise LaunchError(f"{where}: size {size} along dim {d}; accepted 1..2^32 (an "
                              "empty tensor launches no copy: skip the launch)")
    for d, stride in enumerate(strides[:-1]):
        nbytes = stride * elem
        if nbytes % 16 or not 0 < nbytes < 1 << 40:
            raise LaunchError(f"{where}: stride {stride} along dim {d} is {nbytes} bytes; "
                              "accepted a positive multiple of 16 below 2^40")
    return TensorMapFields(_DATA_TYPES.get(spec.dtype, "UINT8"), tuple(reversed(shape)),
                           tuple(s * elem for s in reversed(strides[:-1])),
                           tuple(reversed(spec.box)), spec.swizzle)


def encode_tensor_map(spec: TensorMapSpec, address: int,
                      scalars: Mapping[str, int | float]) -> bytes:
    """The 128 bytes of ``spec``'s tensor map for this launch (``cuTensorMapEncodeTiled``:
    zeros outside the view, 256-byte L2 promotion)."""
    from lowvm.runtime.driver import check, cu

    f = tensor_map_fields(spec, address, scalars)
    t = cu.CUtensorMapDataType
    made = check(cu.cuTensorMapEncodeTiled(
        getattr(t, f"CU_TENSOR_MAP_DATA_TYPE_{f.data_type}"), len(f.dims), address,
        [cu.cuuint64_t(d) for d in f.dims], [cu.cuuint64_t(s) for s in f.strides],
        [cu.cuuint32_t(b) for b in f.box], [cu.cuuint32_t(1)] * len(f.dims),
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        _swizzle(cu, f.swizzle),
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        f"cuTensorMapEncodeTiled({spec.pointer!r}, dims {list(f.dims)}, strides "
        f"{list(f.strides)} bytes, box {list(f.box)}, swizzle {f.swizzle})")
    import ctypes

    return ctypes.string_at(int(made.getPtr()), TENSOR_MAP_BYTES)


def _swizzle(cu: Any, span: int) -> Any:
    s = cu.CUtensorMapSwizzle
    return {0: s.CU_TENSOR_MAP_SWIZZLE_NONE, 32: s.CU_TENSOR_MAP_SWIZZLE_32B,
            64: s.CU_TENSOR_MAP_SWIZZLE_64B, 128: s.CU_TENSOR_MAP_SWIZZLE_128B}[span]
