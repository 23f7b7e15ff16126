"""The fuzzer's own arithmetic of lowvm's types: values of every code, rounding, packing.

Why a second implementation: the reference (:mod:`lowvm.fuzz.reference`) must not
share code with what it checks. Everything here is written from the documented formats
(``docs/language.md``): intN two's complement, uintN, ``floatN_eXmY`` with bias
``2^(X-1)-1`` and subnormals (finite-only below 8 bits, ``float8_e4m3`` = e4m3fn,
``float8_e5m2`` IEEE-like), f16/bf16/f32 IEEE; rounding to nearest even, saturating for
the types without an inf code, overflowing to inf for the others (f16, bf16, f32,
``float8_e5m2``); packing as a dense
little-endian bit stream. Only :class:`lowvm.dtypes.DType`'s metadata (width, kind,
exponent and mantissa bits) is taken from lowvm.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from lowvm.dtypes import DType, all_dtypes
from lowvm.dtypes import dtype as as_dtype

__all__ = ["type_by_name", "low_types", "wide_types", "max_value", "min_value",
           "quantum_exp", "mantissa_bits", "code_values", "finite_values", "round_to_type",
           "pack_rows", "unpack_rows", "ulp", "is_saturating", "granule"]


def type_by_name(name: str) -> DType:
    """The lowvm type of this canonical name."""
    return as_dtype(name)


def low_types() -> tuple[DType, ...]:
    """Every type of 1..8 bits: int1..int8, uint1..uint8, the 21 small floats."""
    return tuple(t for t in all_dtypes() if t.nbits <= 8)


def wide_types() -> tuple[DType, ...]:
    """float16, bfloat16, float32, int32."""
    return tuple(t for t in all_dtypes() if t.nbits > 8)


def _ieee_like(dt: DType) -> bool:
    """The all-ones exponent is inf/NaN (wide floats and float8_e5m2)."""
    return dt.is_float and (dt.nbits > 8 or (dt.nbits == 8 and dt.exponent_bits == 5))


def _e4m3fn(dt: DType) -> bool:
    return dt.is_float and dt.nbits == 8 and dt.exponent_bits == 4


def mantissa_bits(dt: DType) -> int:
    """Explicit mantissa bits (floats) or value bits (integers, for ulp purposes)."""
    if dt.is_float:
        return int(dt.mantissa_bits)
    return dt.nbits


def _bias(dt: DType) -> int:
    return 2 ** (int(dt.exponent_bits) - 1) - 1


@functools.cache
def max_value(dt: DType) -> float:
    """The largest finite value of ``dt``."""
    if dt.kind == "int":
        return float(2 ** (dt.nbits - 1) - 1)
    if dt.kind == "uint":
        return float(2**dt.nbits - 1)
    e, m = int(dt.exponent_bits), int(dt.mantissa_bits)
    top = 2**e - 1 - _bias(dt)  # the all-ones exponent field as a power of two
    if _ieee_like(dt):
        return math.ldexp(2 - 2.0**-m, top - 1)
    if _e4m3fn(dt):
        return math.ldexp(2 - 2.0 ** (1 - m), top)
    return math.ldexp(2 - 2.0**-m, top)


def min_value(dt: DType) -> float:
    """The most negative finite value of ``dt``."""
    if dt.kind == "int":
        return -float(2 ** (dt.nbits - 1))
    if dt.kind == "uint":
        return 0.0
    return -max_value(dt)


def quantum_exp(dt: DType) -> int:
    """Every value of ``dt`` is a multiple of ``2 ** quantum_exp(dt)``."""
    if dt.is_integer:
        return 0
    return 1 - _bias(dt) - int(dt.mantissa_bits)


def is_saturating(dt: DType) -> bool:
    """Conversions to ``dt`` clamp at its range: integers and the floats without an inf
    code (every small float but ``float8_e5m2``); the others overflow to inf."""
    return dt.is_integer or not _ieee_like(dt)


def granule(dt: DType) -> int:
    """Elements of ``dt`` per whole number of bytes: a packed row's length divides by it."""
    return 8 // math.gcd(dt.nbits, 8) if dt.nbits < 8 else 1


def _code_value(dt: DType, code: int) -> float:
    n = dt.nbits
    if dt.kind == "int":
        return float(code - 2**n if code >= 2 ** (n - 1) else code)
    if dt.kind == "uint":
        return float(code)
    e, m = int(dt.exponent_bits), int(dt.mantissa_bits)
    negative = code >> (n - 1) & 1
    field, frac = code >> m & (2**e - 1), code & (2**m - 1)
    if _ieee_like(dt) and field == 2**e - 1:
        value = math.inf if frac == 0 else math.nan
    elif _e4m3fn(dt) and field == 2**e - 1 and frac == 2**m - 1:
        value = math.nan
    elif field == 0:
        value = math.ldexp(frac, 1 - _bias(dt) - m)
    else:
        value = math.ldexp(2**m + frac, field - _bias(dt) - m)
    return -value if negative else value


@functools.cache
def code_values(dt: DType) -> np.ndarray:
    """The value of every code ``0 .. 2**nbits - 1`` of a type of at most 8 bits."""
    if dt.nbits > 8:
        raise ValueError(f"code_values: {dt.name} has more than 8 bits")
    table = np.array([_code_value(dt, c) for c in range(2**dt.nbits)], dtype=np.float64)
    table.setflags(write=False)
    return table


@functools.cache
def finite_values(dt: DType) -> np.ndarray:
    """The distinct finite values of a type of at most 8 bits, ascending."""
    table = code_values(dt)
    return np.unique(table[np.isfinite(table)])


def _round_binary(x: np.ndarray, m: int, min_exp: int) -> np.ndarray:
    """Nearest value with ``m`` mantissa bits and exponent >= ``min_exp`` (no range limit),
    ties to even: scale so the ulp is 1, ``rint``, scale back (powers of two: exact)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        exp = np.floor(np.log2(np.abs(x)))
    exp = np.where(np.isfinite(exp), exp, min_exp)
    # log2 may be off by one next to a power of two: correct it
    exp = np.where(np.abs(x) < np.ldexp(1.0, exp.astype(np.int64)), exp - 1, exp)
    exp = np.where(np.abs(x) >= np.ldexp(1.0, exp.astype(np.int64) + 1), exp + 1, exp)
    ulp_exp = (np.maximum(exp, min_exp) - m).astype(np.int64)
    return np.ldexp(np.rint(np.ldexp(x, -ulp_exp)), ulp_exp)


def round_to_type(x: np.ndarray | float, dt: DType) -> np.ndarray:
    """Each value rounded to ``dt`` as lowvm documents it: nearest, ties to even;
    saturating for integers and the floats without inf, overflow to inf for
    float16/bfloat16/float32/float8_e5m2. Float64 in, float64 out; NaN stays NaN."""
    x = np.asarray(x, dtype=np.float64)
    if dt.is_integer:
        return np.clip(np.rint(x), min_value(dt), max_value(dt))
    top = max_value(dt)
    finite = np.where(np.isfinite(x), x, 0.0)
    y = _round_binary(finite, int(dt.mantissa_bits), 1 - _bias(dt))
    y = np.where(np.signbit(x) & (y == 0), -0.0, y)
    if is_saturating(dt):
        y = np.clip(y, -top, top)
        y = np.where(np.isinf(x), np.copysign(top, x), y)
    else:
        y = np.where(np.abs(y) > top, np.copysign(np.inf, x), y)
        y = np.where(np.isinf(x), x, y)
    return np.where(np.isnan(x), np.nan, y)


def ulp(x: np.ndarray, dt: DType) -> np.ndarray:
    """The spacing of ``dt``'s values at magnitude ``|x|`` (1 for integers)."""
    x = np.abs(np.asarray(x, dtype=np.float64))
    if dt.is_integer:
        return np.ones_like(x)
    with np.errstate(divide="ignore"):
        exp = np.floor(np.log2(np.where(x > 0, x, 1.0)))
    exp = np.maximum(exp, 1 - _bias(dt))
    return np.ldexp(1.0, (exp - int(dt.mantissa_bits)).astype(np.int64))


def pack_rows(codes: np.ndarray, nbits: int) -> np.ndarray:
    """``[R, C]`` codes as ``[R, C * nbits / 8]`` bytes: each row a dense little-endian bit
    stream (element ``i`` in bits ``[i * nbits, (i + 1) * nbits)``)."""
    rows, cols = codes.shape
    if cols * nbits % 8:
        raise ValueError(f"pack_rows: {cols} values of {nbits} bits are not whole bytes")
    shifts = np.arange(nbits, dtype=np.uint64)
    bits = (codes.astype(np.uint64)[..., None] >> shifts) & 1  # [R, C, nbits]
    bits = bits.reshape(rows, cols * nbits // 8, 8)
    return (bits << np.arange(8, dtype=np.uint64)).sum(axis=-1).astype(np.uint8)


def unpack_rows(data: np.ndarray, nbits: int, cols: int) -> np.ndarray:
    """The inverse of :func:`pack_rows`: ``[R, cols]`` codes (int64)."""
    rows = data.shape[0]
    bits = (data.astype(np.uint64)[..., None] >> np.arange(8, dtype=np.uint64)) & 1
    bits = bits.reshape(rows, -1)[:, : cols * nbits].reshape(rows, cols, nbits)
    return (bits << np.arange(nbits, dtype=np.uint64)).sum(axis=-1).astype(np.int64)
