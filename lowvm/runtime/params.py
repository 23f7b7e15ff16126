"""Kernel parameter declarations and the checks a launch runs on its arguments.

A raw ``cuLaunchKernel`` trusts its arguments: a float16 tensor passed where the kernel
reads float32, a CPU tensor, a strided view or a pointer the kernel's 16-byte vector loads
cannot use, all launch "successfully" and produce garbage or a fault long after the
call. So every launch checks each argument against its :class:`ParamSpec` first, and a
mismatch raises :class:`~lowvm.runtime.errors.LaunchError` naming the argument.

The checks live here, apart from the driver code, so they run (and are tested) on a
machine without a GPU. They are also the host-side hot path of every launch, so each
parameter gets a small converter closure built once: the common, valid case is a handful
of attribute reads, and only a failing argument walks the slow path that works out the
message.
"""

from __future__ import annotations

import ctypes
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lowvm.dtypes import DType, bfloat16, float16, float32, int8, int32, uint8
from lowvm.dtypes import dtype as _dtype
from lowvm.errors import LowvmError
from lowvm.extras import reraise_missing
from lowvm.runtime.errors import LaunchError

try:
    import torch
except ModuleNotFoundError as _exc:  # every launch takes torch tensors
    reraise_missing(_exc, "lowvm.runtime (compiling and launching kernels)")
    raise

__all__ = [
    "ParamSpec",
    "pointer",
    "scalar",
    "normalize_params",
    "torch_dtype_for",
    "ctypes_type_for",
    "make_converter",
    "POINTER_ALIGNMENT",
    "TensorMapSlot",
]

POINTER_ALIGNMENT = 16
"""Bytes every pointer argument must be aligned to (kernels use 16-byte vector accesses)."""

_KINDS = ("pointer", "scalar", "tensor_map")
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_FLOAT32_MAX = float.fromhex("0x1.fffffep+127")
_POINTER_LIMIT = 2**64
_SCALAR_DTYPES = (int32, float32)

# Pointer element types with a torch dtype of their own; every other type of at most 8
# bits (int3, uint4, float6_e3m2, float8_e4m3, ...) travels as a uint8 buffer of codes.
_TORCH_DTYPES: dict[DType, torch.dtype] = {
    float16: torch.float16,
    bfloat16: torch.bfloat16,
    float32: torch.float32,
    int32: torch.int32,
    int8: torch.int8,
    uint8: torch.uint8,
}

Converter = Callable[[Any, "int | None"], "int | float"]


@dataclass(frozen=True)
class ParamSpec:
    """One kernel parameter: its name, ``"pointer"``, ``"scalar"`` or ``"tensor_map"``,
    and its element type.

    A pointer's ``dtype`` is the element type it points to (a low-bit type means a uint8
    buffer of packed codes); a scalar's is its own type, ``int32`` or ``float32``; a
    tensor map's (the 128-byte descriptor of a tensor copy, passed by value) the element
    type of the tensor it describes.
    """

    name: str
    kind: str
    dtype: DType

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise LaunchError(
                f"ParamSpec: name must be a C identifier string such as 'out', "
                f"got {self.name!r}"
            )
        if self.kind not in _KINDS:
            raise LaunchError(
                f"ParamSpec {self.name!r}: kind must be one of {_KINDS}, got {self.kind!r}"
            )
        if not isinstance(self.dtype, DType):
            raise LaunchError(
                f"ParamSpec {self.name!r}: dtype must be a lowvm DType (e.g. lowvm.float16 "
                f"or lowvm.dtype('int4')), got {self.dtype!r}"
            )
        if self.kind == "scalar" and self.dtype not in _SCALAR_DTYPES:
            raise LaunchError(
                f"ParamSpec {self.name!r}: a scalar parameter must be int32 or float32, "
                f"got {self.dtype.name}"
            )
        if self.kind == "pointer" and self.dtype.nbits > 8 and self.dtype not in _TORCH_DTYPES:
            raise LaunchError(
                f"ParamSpec {self.name!r}: pointer element type {self.dtype.name} has no "
                f"buffer type; accepted: float16, bfloat16, float32, int32, or any type of "
                f"at most 8 bits"
            )

    def __str__(self) -> str:
        return f"{self.name}: {self.kind} {self.dtype.name}"


def pointer(name: str, dtype: DType | str) -> ParamSpec:
    """A pointer parameter to elements of ``dtype``."""
    return ParamSpec(name, "pointer", _as_dtype(dtype, name))


def scalar(name: str, dtype: DType | str) -> ParamSpec:
    """A by-value ``int32`` or ``float32`` parameter."""
    return ParamSpec(name, "scalar", _as_dtype(dtype, name))


def _as_dtype(dt: DType | str, name: object) -> DType:
    if isinstance(dt, DType):
        return dt
    try:
        return _dtype(dt)
    except LowvmError as exc:
        raise LaunchError(f"ParamSpec {name!r}: {exc}") from None


def normalize_params(params: Sequence[ParamSpec | tuple[str, str, DType | str]]) -> tuple[
    ParamSpec, ...
]:
    """ParamSpecs from ParamSpecs or ``(name, "pointer" | "scalar", dtype)`` tuples."""
    if isinstance(params, (str, bytes)) or not isinstance(params, Sequence):
        raise LaunchError(
            f"Kernel: params must be a sequence of ParamSpec or (name, kind, dtype) tuples, "
            f"got {params!r}"
        )
    specs: list[ParamSpec] = []
    for i, p in enumerate(params):
        if isinstance(p, ParamSpec):
            specs.append(p)
        elif isinstance(p, tuple) and len(p) == 3:
            name, kind, dt = p
            specs.append(ParamSpec(name, kind, _as_dtype(dt, name)))
        else:
            raise LaunchError(
                f"Kernel: params[{i}] must be a ParamSpec or a (name, 'pointer' | 'scalar', "
                f"dtype) tuple, got {p!r}"
            )
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise LaunchError(f"Kernel: parameter names must be unique, got {dupes} twice")
    return tuple(specs)


def torch_dtype_for(spec: ParamSpec) -> torch.dtype:
    """The torch dtype a tensor passed for pointer parameter ``spec`` must have."""
    return _TORCH_DTYPES.get(spec.dtype, torch.uint8)


class TensorMapSlot(ctypes.Structure):
    """A tensor map's slot in a launch's parameter block (128 bytes, by value)."""

    _fields_ = [("opaque", ctypes.c_uint64 * 16)]

    @property
    def value(self) -> bytes:
        return bytes(self)

    @value.setter
    def value(self, data: bytes) -> None:
        ctypes.memmove(ctypes.addressof(self), data, ctypes.sizeof(self))


def ctypes_type_for(spec: ParamSpec) -> type:
    """The ctypes type cuda-python packs the argument as."""
    if spec.kind == "tensor_map":
        return TensorMapSlot
    if spec.kind == "pointer":
        return ctypes.c_void_p
    return ctypes.c_int if spec.dtype == int32 else ctypes.c_float


# ---------------------------------------------------------------------------------------
# Converters: argument -> value cuLaunchKernel takes, or LaunchError
# ---------------------------------------------------------------------------------------


def _describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return (
            f"a {x.dtype} tensor of shape {tuple(x.shape)} on {x.device} "
            f"(strides {tuple(x.stride())}, data_ptr {x.data_ptr():#x})"
        )
    text = repr(x)
    return f"{type(x).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def _error(kernel: str, spec: ParamSpec, problem: str, x: Any, accepted: str) -> LaunchError:
    return LaunchError(
        f"Kernel {kernel!r}: argument {spec.name!r} ({spec.kind} {spec.dtype.name}) "
        f"{problem}; got {_describe(x)}; accepted: {accepted}"
    )


def _pointer_converter(kernel: str, spec: ParamSpec) -> Converter:
    want = torch_dtype_for(spec)
    tensor_type = torch.Tensor
    mask = POINTER_ALIGNMENT - 1
    packed = "" if spec.dtype in _TORCH_DTYPES else f" (packed {spec.dtype.name} codes)"

    def accepted(device: int | None) -> str:
        where = "a CUDA device" if device is None else f"cuda:{device}"
        return (
            f"a contiguous {want}{packed} tensor on {where} whose data_ptr() is a multiple "
            f"of {POINTER_ALIGNMENT}, or an int device address that is a multiple of "
            f"{POINTER_ALIGNMENT}"
        )

    def slow(x: Any, device: int | None) -> int:
        if isinstance(x, tensor_type):
            if x.dtype != want:
                problem = f"must be a {want} tensor{packed}"
            elif not x.is_contiguous():
                problem = "must be contiguous (call .contiguous() first)"
            elif x.data_ptr() & mask:
                problem = (
                    f"must start at an address aligned to {POINTER_ALIGNMENT} bytes "
                    f"(a view offset into a buffer is not)"
                )
            elif not x.is_cuda:
                problem = "must be on a CUDA device, not the CPU"
            elif device is not None and x.get_device() != device:
                problem = f"must be on the current device cuda:{device}"
            else:  # pragma: no cover - the fast path accepts everything else
                return int(x.data_ptr())
        elif isinstance(x, numbers.Integral) and not isinstance(x, bool):
            value = int(x)
            if not 0 <= value < _POINTER_LIMIT:
                problem = "as an int device address must be in [0, 2**64)"
            elif value & mask:
                problem = f"as an int device address must be a multiple of {POINTER_ALIGNMENT}"
            else:
                return value
        else:
            problem = "must be a torch tensor or an int device address"
        raise _error(kernel, spec, problem, x, accepted(device))

    def convert(x: Any, device: int | None) -> int:
        if isinstance(x, tensor_type):
            ptr = x.data_ptr()
            # get_device() is -1 on the CPU, so matching a device index implies CUDA.
            if (
                x.dtype is want
                and not ptr & mask
                and x.is_contiguous()
                and (x.get_device() == device if device is not None else x.is_cuda)
            ):
                return ptr
        elif type(x) is int and 0 <= x < _POINTER_LIMIT and not x & mask:
            return x
        return slow(x, device)

    return convert


def _int32_converter(kernel: str, spec: ParamSpec) -> Converter:
    accepted = f"a Python int in [{_INT32_MIN}, {_INT32_MAX}]"

    def slow(x: Any) -> int:
        if isinstance(x, torch.Tensor):
            problem = "must be a Python int, not a tensor (reading a CUDA tensor would sync)"
        elif isinstance(x, bool) or not isinstance(x, numbers.Integral):
            problem = "must be an int"
        else:
            value = int(x)
            if _INT32_MIN <= value <= _INT32_MAX:
                return value
            problem = "is out of the int32 range"
        raise _error(kernel, spec, problem, x, accepted)

    def convert(x: Any, device: int | None) -> int:
        if type(x) is int and _INT32_MIN <= x <= _INT32_MAX:
            return x
        return slow(x)

    return convert


def _float32_converter(kernel: str, spec: ParamSpec) -> Converter:
    accepted = f"a real number (int or float) of magnitude at most {_FLOAT32_MAX:.8g}, inf or nan"

    def slow(x: Any) -> float:
        if isinstance(x, torch.Tensor):
            problem = "must be a Python number, not a tensor (reading a CUDA tensor would sync)"
        elif isinstance(x, bool) or not isinstance(x, numbers.Real):
            problem = "must be a real number"
        else:
            try:
                value: float | None = float(x)
            except OverflowError:  # an int beyond even float64
                value = None
            if value is not None and (not math.isfinite(value) or abs(value) <= _FLOAT32_MAX):
                return value
            problem = "overflows float32"
        raise _error(kernel, spec, problem, x, accepted)

    def convert(x: Any, device: int | None) -> float:
        if type(x) is float and -_FLOAT32_MAX <= x <= _FLOAT32_MAX:
            return x
        return slow(x)

    return convert


def _tensor_map_converter(kernel: str, spec: ParamSpec) -> Converter:
    size = ctypes.sizeof(TensorMapSlot)

    def convert(x: Any, device: int | None) -> bytes:
        if type(x) is bytes and len(x) == size:
            return x
        raise _error(kernel, spec, "must be an encoded tensor map", x,
                     f"the {size} bytes of lowvm.runtime.tensor_map.encode_tensor_map")

    return convert


def make_converter(kernel: str, spec: ParamSpec) -> Converter:
    """A function ``(argument, device) -> launch value`` that raises LaunchError on a bad one.

    ``device`` is the CUDA device index tensors must be on, or None to accept any CUDA
    device (checking without a GPU).
    """
    if spec.kind == "pointer":
        return _pointer_converter(kernel, spec)
    if spec.kind == "tensor_map":
        return _tensor_map_converter(kernel, spec)
    if spec.dtype == int32:
        return _int32_converter(kernel, spec)
    return _float32_converter(kernel, spec)
