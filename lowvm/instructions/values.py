"""How values of each data type are held on the CPU (the instructions' exact semantics,
the interpreter's storage), and how their bits are reinterpreted.

Register and shared tiles hold *numbers* (float64 for floats, int64 for integers), always
exactly representable in the tile's type: every instruction rounds its result with
:func:`quantize`, as the GPU's instruction would. Bit reinterpretation (``view``) goes
through :func:`to_codes` / :func:`from_codes`, the types' exact bit patterns.
"""

from __future__ import annotations

import numpy as np

from lowvm.dtypes import DType, bfloat16, decode, encode, float16, float32, int32, round_to
from lowvm.ir import BOOL

__all__ = ["storage_dtype", "quantize", "to_codes", "from_codes", "zeros"]


def storage_dtype(dt: DType) -> type:
    """The numpy type that holds values of ``dt`` exactly."""
    return np.float64 if dt.is_float else np.int64


def zeros(shape: tuple[int, ...], dt: DType) -> np.ndarray:
    """A zero-filled array of ``dt``'s storage type."""
    return np.zeros(shape, dtype=storage_dtype(dt))


def quantize(values: np.ndarray, dt: DType, saturate: bool = True) -> np.ndarray:
    """``values`` rounded to ``dt`` by :func:`lowvm.dtypes.round_to`, in storage form.

    With ``saturate=False`` integer results are rounded but not clamped, so that
    :meth:`~lowvm.interpreter.state.BlockState.set` can report the ones that overflow.
    """
    if dt == BOOL:
        return (np.asarray(values) != 0).astype(np.int64)
    if not saturate and dt.is_integer:
        values = np.asarray(values)
        if values.dtype.kind in "iub":
            return values.astype(np.int64)
        # values far outside any integer type (inf, NaN) stay far outside: overflow
        far = 2.0**62
        values = np.nan_to_num(values.astype(np.float64), nan=far, posinf=far, neginf=-far)
        return np.rint(np.clip(values, -far, far)).astype(np.int64)
    out = round_to(values, dt)
    return out if dt.is_float else out.astype(np.int64)


def to_codes(values: np.ndarray, dt: DType) -> np.ndarray:
    """The bit patterns of ``values`` (exactly representable in ``dt``) as uint64."""
    values = np.asarray(values)
    if dt == BOOL:
        return (values != 0).astype(np.uint64)
    if dt.nbits <= 8:
        return encode(values, dt).astype(np.uint64)
    if dt == float16:
        return values.astype(np.float16).view(np.uint16).astype(np.uint64)
    if dt == float32:
        return values.astype(np.float32).view(np.uint32).astype(np.uint64)
    if dt == bfloat16:
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint64)
    if dt == int32:
        return values.astype(np.int64).astype(np.uint32).astype(np.uint64)
    raise NotImplementedError(dt.name)


def from_codes(codes: np.ndarray, dt: DType) -> np.ndarray:
    """Values (storage form) of the bit patterns ``codes`` of ``dt``."""
    codes = np.asarray(codes, dtype=np.uint64)
    if dt == BOOL:
        return (codes != 0).astype(np.int64)
    if dt.nbits <= 8:
        vals = decode(codes.astype(np.uint8), dt)
        return vals.astype(np.float64) if dt.is_float else vals.astype(np.int64)
    if dt == float16:
        return codes.astype(np.uint16).view(np.float16).astype(np.float64)
    if dt == float32:
        return codes.astype(np.uint32).view(np.float32).astype(np.float64)
    if dt == bfloat16:
        return (codes.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if dt == int32:
        return codes.astype(np.uint32).view(np.int32).astype(np.int64)
    raise NotImplementedError(dt.name)


def reinterpret(values: np.ndarray, src: DType, dst: DType) -> np.ndarray:
    """Per row (thread), reinterpret the bit stream of ``values`` as ``dst`` values.

    ``values`` is ``[threads, n]`` of ``src``; local 0 occupies the lowest bits, as in
    the GPU's registers. The row's bit count must be a multiple of ``dst.nbits``.
    """
    threads, n = values.shape
    codes = to_codes(values, src)
    bits = ((codes[..., None] >> np.arange(src.nbits, dtype=np.uint64)) & 1).astype(np.uint8)
    bits = bits.reshape(threads, n * src.nbits)
    m = n * src.nbits // dst.nbits
    bits = bits.reshape(threads, m, dst.nbits).astype(np.uint64)
    new_codes = (bits << np.arange(dst.nbits, dtype=np.uint64)).sum(axis=-1, dtype=np.uint64)
    return from_codes(new_codes, dst)
