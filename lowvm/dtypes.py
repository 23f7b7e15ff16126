"""Low-precision data types: names, bit layouts, exact rounding and bit packing.

A value of a 1..8-bit type is held as one *code* per element: a uint8 whose low ``nbits``
bits are the type's bit pattern. :func:`encode` and :func:`decode` map values to codes and
back, :func:`pack` and :func:`unpack` move codes to and from the dense bit stream kernels
read, and :func:`round_to` gives the nearest representable value of any type so the
interpreter can emulate per-op rounding.

Semantics (exact, by construction):

* ``intN`` is two's complement over ``[-2**(N-1), 2**(N-1) - 1]``; ``uintN`` is ``[0, 2**N - 1]``.
* ``floatN_eXmY`` is sign + X exponent bits + Y mantissa bits, bias ``2**(X-1) - 1``, with
  subnormals. Every such format is finite-only (every code is a number, no inf/NaN),
  including the 8-bit ones other than these two:
  ``float8_e4m3`` follows OCP/ml_dtypes ``float8_e4m3fn`` (no inf, ``S.1111.111`` is NaN,
  max 448) and ``float8_e5m2`` is IEEE-like (exponent 31: inf for mantissa 0, else NaN).
  Note that ml_dtypes' own ``float8_e3m4`` and ``float8_e4m3`` carry inf/NaN; ours do not.

Conversion from wider values rounds to nearest, ties to even, keeps the sign of zero, and
then follows one rule per kind of type (:func:`encode`, :func:`round_to`):

* types with an inf code (``float8_e5m2``, ``float16``, ``bfloat16``, ``float32``) are IEEE:
  a magnitude of at least the largest finite value plus half its ulp, and inf itself,
  become inf; NaN stays NaN (``float8_e5m2``: ``S.11111.10``, the sign kept, as ml_dtypes);
* types without one (every other small float) saturate: overflow and +-inf become the
  largest finite magnitude, as PTX ``cvt.rn.satfinite`` does. ``float8_e4m3`` maps NaN to
  ``S.1111.111`` (the sign kept, as ml_dtypes); a type without a NaN code refuses NaN
  with :class:`~lowvm.errors.DTypeError`. One difference from ml_dtypes: its
  ``float8_e4m3fn`` turns overflow and inf into NaN (its fp6/fp4 types saturate, as ours);
* integers round half to even and clamp; NaN and inf are refused.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowvm.errors import DTypeError

# fmt: off
__all__ = [
    "DType", "dtype", "encode", "decode", "pack", "unpack", "round_to", "all_dtypes",
    "int1", "int2", "int3", "int4", "int5", "int6", "int7", "int8",
    "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7", "uint8",
    "float3_e1m1",
    "float4_e1m2", "float4_e2m1",
    "float5_e1m3", "float5_e2m2", "float5_e3m1",
    "float6_e1m4", "float6_e2m3", "float6_e3m2", "float6_e4m1",
    "float7_e1m5", "float7_e2m4", "float7_e3m3", "float7_e4m2", "float7_e5m1",
    "float8_e1m6", "float8_e2m5", "float8_e3m4", "float8_e4m3", "float8_e5m2", "float8_e6m1",
    "float16", "bfloat16", "float32", "int32",
]
# fmt: on

_KINDS = ("int", "uint", "float")
_WIDE_SHORT = {(5, 10): "f16", (8, 7): "bf16", (8, 23): "f32"}


@dataclass(frozen=True, repr=False)
class DType:
    """A scalar data type: width, kind and (for floats) the exponent/mantissa split.

    Immutable and hashable, so it can key caches and name kernels.
    """

    name: str
    nbits: int
    kind: str
    exponent_bits: int | None = None
    mantissa_bits: int | None = None

    def __post_init__(self) -> None:
        e, m = self.exponent_bits, self.mantissa_bits
        if self.kind not in _KINDS:
            raise DTypeError(f"DType: kind must be one of {_KINDS}, got {self.kind!r}")
        if self.kind == "float":
            if e is None or m is None or e < 1 or m < 1 or 1 + e + m != self.nbits:
                raise DTypeError(
                    f"DType: float {self.name!r} needs e >= 1, m >= 1 and 1 + e + m == nbits; "
                    f"got nbits={self.nbits}, e={e}, m={m}"
                )
        elif e is not None or m is not None or self.nbits < 1:
            raise DTypeError(f"DType: integer {self.name!r} takes no e/m and nbits >= 1")

    def __repr__(self) -> str:
        return f"lowvm.{self.name}"

    def __str__(self) -> str:
        return self.name

    @property
    def is_float(self) -> bool:
        """True for floating-point types."""
        return self.kind == "float"

    @property
    def is_integer(self) -> bool:
        """True for signed and unsigned integer types."""
        return self.kind != "float"

    @property
    def is_signed(self) -> bool:
        """True for intN and every float (floats carry a sign bit)."""
        return self.kind != "uint"

    @property
    def is_subbyte(self) -> bool:
        """True when several values share a byte once packed (nbits < 8)."""
        return self.nbits < 8

    @property
    def bias(self) -> int | None:
        """Exponent bias ``2**(e-1) - 1`` of a float type; None for integers."""
        return None if self.exponent_bits is None else 2 ** (self.exponent_bits - 1) - 1

    @property
    def has_inf(self) -> bool:
        """True when some code means +-inf (float8_e5m2 and the 16/32-bit floats)."""
        return self.is_float and (self.nbits > 8 or self.exponent_bits == 5 and self.nbits == 8)

    @property
    def has_nan(self) -> bool:
        """True when some code means NaN (has_inf types and float8_e4m3)."""
        return self.has_inf or (self.is_float and self.nbits == 8 and self.exponent_bits == 4)

    @property
    def max_value(self) -> float:
        """Largest finite value: where conversion to a type without inf saturates."""
        if self.kind == "int":
            return float(2 ** (self.nbits - 1) - 1)
        if self.kind == "uint":
            return float(2**self.nbits - 1)
        e, m, bias = self.exponent_bits, self.mantissa_bits, self.bias
        assert e is not None and m is not None and bias is not None
        # IEEE-like types reserve the all-ones exponent; e4m3 reserves only S.1111.111 (NaN).
        top_exp = 2**e - 1 - (1 if self.has_inf else 0)
        top_frac = 2**m - 1 - (1 if self.has_nan and not self.has_inf else 0)
        return math.ldexp(2**m + top_frac, top_exp - bias - m)

    @property
    def min_value(self) -> float:
        """Smallest (most negative) finite value: -max_value for floats, 0 for uintN."""
        if self.kind == "int":
            return float(-(2 ** (self.nbits - 1)))
        return 0.0 if self.kind == "uint" else -self.max_value

    @property
    def short_name(self) -> str:
        """Compact name for kernel names: i3, u4, e3m2, f16, bf16, f32, i32."""
        if self.kind != "float":
            return ("i" if self.kind == "int" else "u") + str(self.nbits)
        if self.nbits <= 8:
            return f"e{self.exponent_bits}m{self.mantissa_bits}"
        return _WIDE_SHORT[(self.exponent_bits, self.mantissa_bits)]  # type: ignore[index]


def _small_float(e: int, m: int) -> DType:
    return DType(f"float{1 + e + m}_e{e}m{m}", 1 + e + m, "float", e, m)


int1, int2, int3, int4, int5, int6, int7, int8 = _INTS = tuple(
    DType(f"int{n}", n, "int") for n in range(1, 9)
)
uint1, uint2, uint3, uint4, uint5, uint6, uint7, uint8 = _UINTS = tuple(
    DType(f"uint{n}", n, "uint") for n in range(1, 9)
)
# fmt: off
# Every sign + e + m split with e, m >= 1 and total width 3..8, by width then e.
(
    float3_e1m1,
    float4_e1m2, float4_e2m1,
    float5_e1m3, float5_e2m2, float5_e3m1,
    float6_e1m4, float6_e2m3, float6_e3m2, float6_e4m1,
    float7_e1m5, float7_e2m4, float7_e3m3, float7_e4m2, float7_e5m1,
    float8_e1m6, float8_e2m5, float8_e3m4, float8_e4m3, float8_e5m2, float8_e6m1,
) = _SMALL_FLOATS = tuple(_small_float(e, n - 1 - e) for n in range(3, 9) for e in range(1, n - 1))
float16 = DType("float16", 16, "float", 5, 10)
bfloat16 = DType("bfloat16", 16, "float", 8, 7)
float32 = DType("float32", 32, "float", 8, 23)
int32 = DType("int32", 32, "int")

_ALL: tuple[DType, ...] = (*_INTS, *_UINTS, *_SMALL_FLOATS, float16, bfloat16, float32, int32)
_BY_NAME: dict[str, DType] = {d.name: d for d in _ALL}
_BY_NAME.update({d.short_name: d for d in _ALL})
_BY_NAME.update({
    "half": float16, "fp16": float16, "float": float32, "fp32": float32,
    "float4_e2m1fn": float4_e2m1, "float6_e2m3fn": float6_e2m3,
    "float6_e3m2fn": float6_e3m2, "float8_e4m3fn": float8_e4m3,
})
# Names other libraries (numpy, torch, ml_dtypes) give their dtypes, where ours match exactly.
# ml_dtypes' "float8_e4m3" is IEEE-like and differs from ours, so it is deliberately absent.
_FOREIGN: dict[str, DType] = {
    "float16": float16, "bfloat16": bfloat16, "float32": float32, "int32": int32,
    "int8": int8, "uint8": uint8, "float8_e4m3fn": float8_e4m3, "float8_e5m2": float8_e5m2,
    "float4_e2m1fn": float4_e2m1, "float6_e2m3fn": float6_e2m3, "float6_e3m2fn": float6_e3m2,
}
# fmt: on
_ACCEPTED = (
    "int1..int8, uint1..uint8, float{3..8}_eXmY with 1+X+Y = width and X, Y >= 1 "
    "(e.g. float6_e3m2), float16, bfloat16, float32, int32; aliases eXmY, iN, uN, i32, "
    "f16/half/fp16, bf16, f32/float/fp32, float4_e2m1fn, float6_e2m3fn, float6_e3m2fn, "
    "float8_e4m3fn; numpy/torch float16, bfloat16, float32, int32, int8, uint8"
)
_INT_RE = re.compile(r"(?:u?int|[iu])(\d+)")
_FLOAT_RE = re.compile(r"(?:float(\d+)_)?e(\d+)m(\d+)(?:fn)?")


def all_dtypes() -> tuple[DType, ...]:
    """Every built-in type in a stable order: intN, uintN, small floats by width, wide types."""
    return _ALL


def _width_hint(key: str) -> str:
    """Explain why a name that looks like a known pattern is still not a type."""
    if _INT_RE.fullmatch(key):
        return " (integer widths are 1..8 bits, plus int32)"
    match = _FLOAT_RE.fullmatch(key)
    if match:
        width, e, m = (int(g) if g else None for g in match.groups())
        assert e is not None and m is not None
        if width is not None and width != 1 + e + m:
            return f" (1 sign + {e} exponent + {m} mantissa bits is {1 + e + m} bits, not {width})"
        if e < 1 or m < 1:
            return " (small floats need at least 1 exponent and 1 mantissa bit)"
        if not 3 <= 1 + e + m <= 8:
            return f" (small float widths are 3..8 bits; this one is {1 + e + m})"
    return ""


def _foreign_name(obj: Any) -> str:
    """The dtype name of a numpy/ml_dtypes/torch dtype object, or its str."""
    if isinstance(obj, np.dtype):
        return obj.name
    if isinstance(obj, type):
        try:
            return np.dtype(obj).name
        except TypeError:
            return str(obj)
    text = str(obj)
    return text.removeprefix("torch.")


def dtype(name_or_dtype: str | DType | Any) -> DType:
    """Look up a type by name, alias or foreign (numpy/torch) dtype; DTypes pass through."""
    if isinstance(name_or_dtype, DType):
        return name_or_dtype
    if isinstance(name_or_dtype, str):
        key = name_or_dtype.strip().lower()
        if key in _BY_NAME:
            return _BY_NAME[key]
        hint = _width_hint(key)
    else:
        found = _FOREIGN.get(_foreign_name(name_or_dtype))
        if found is not None:
            return found
        hint = ""
    raise DTypeError(f"dtype: unknown data type {name_or_dtype!r}{hint}; accepted: {_ACCEPTED}")


def _small(dt: str | DType | Any, where: str) -> DType:
    d = dtype(dt)
    if d.nbits > 8:
        raise DTypeError(
            f"{where}: {d.name} is {d.nbits} bits; encode/decode/pack/unpack handle "
            "1..8-bit types only"
        )
    return d


def _as_float64(values: Any, where: str) -> np.ndarray:
    """Any real numeric input (scalar, list, numpy, torch) as a float64 array."""
    if hasattr(values, "detach"):  # torch tensor; double() is exact for every float dtype
        values = values.detach().cpu().double().numpy()
    try:
        arr = np.asarray(values)
        if arr.dtype.kind in "cUSMm":
            raise TypeError(arr.dtype)
        with np.errstate(invalid="ignore"):  # signalling NaNs are values like any other
            return np.asarray(arr.astype(np.float64))
    except (TypeError, ValueError) as exc:
        raise DTypeError(
            f"{where}: values must be real numbers; got {type(values).__name__} {values!r:.80}"
        ) from exc


def _require_finite(x: np.ndarray, d: DType, where: str) -> None:
    bad = ~np.isfinite(x)
    if bad.any():
        first = float(x[bad].flat[0])
        raise DTypeError(
            f"{where}: {int(bad.sum())} non-finite value(s) cannot be represented in {d.name} "
            f"(it has no inf/NaN); first: {first!r}"
        )


def _require_number(x: np.ndarray, d: DType, where: str) -> None:
    """Refuse NaN for a float type without a NaN code (+-inf saturate there)."""
    bad = np.isnan(x)
    if bad.any():
        raise DTypeError(
            f"{where}: {int(bad.sum())} NaN value(s) cannot be represented in {d.name} (it has "
            "no NaN code; +-inf and overflow saturate to its largest magnitude); first: nan"
        )


def _as_codes(codes: Any, d: DType, where: str) -> np.ndarray:
    """Validate codes (integers in [0, 2**nbits)) and return them as an intp array."""
    if hasattr(codes, "detach"):
        codes = codes.detach().cpu().numpy()
    arr = np.asarray(codes)
    if arr.size == 0:
        return arr.astype(np.intp)
    if arr.dtype.kind not in "iu":
        raise DTypeError(f"{where}: codes must be integers; got dtype {arr.dtype}")
    limit = 1 << d.nbits
    bad = (arr < 0) | (arr >= limit)
    if bad.any():
        first = int(arr[bad].flat[0])
        raise DTypeError(
            f"{where}: code {first} is out of range for {d.name} (codes are 0..{limit - 1}); "
            f"{int(bad.sum())} bad code(s)"
        )
    return arr.astype(np.intp)


def _float_code_value(d: DType, code: int) -> float:
    """Value of one small-float code, straight from the sign/exponent/mantissa formula."""
    e, m, bias = d.exponent_bits, d.mantissa_bits, d.bias
    assert e is not None and m is not None and bias is not None
    sign = -1.0 if (code >> (e + m)) & 1 else 1.0
    exp_field, frac = (code >> m) & (2**e - 1), code & (2**m - 1)
    if d.has_inf and exp_field == 2**e - 1:
        return sign * math.inf if frac == 0 else math.copysign(math.nan, sign)
    if d.has_nan and exp_field == 2**e - 1 and frac == 2**m - 1:
        return math.copysign(math.nan, sign)
    if exp_field == 0:
        return sign * math.ldexp(frac, 1 - bias - m)
    return sign * math.ldexp(2**m + frac, exp_field - bias - m)


@functools.cache
def _decode_table(d: DType) -> np.ndarray:
    """float32 value of every code 0..2**nbits-1 (read-only)."""
    n = d.nbits
    if d.is_float:
        values = [_float_code_value(d, c) for c in range(2**n)]
    else:
        values = [c - 2**n if d.kind == "int" and c >= 2 ** (n - 1) else c for c in range(2**n)]
    table = np.array(values, dtype=np.float32)
    table.setflags(write=False)
    return table


@functools.cache
def _float_grid(d: DType) -> tuple[np.ndarray, np.ndarray]:
    """Positive finite values ascending (index == code) and their exact float64 midpoints."""
    half = _decode_table(d)[: 2 ** (d.nbits - 1)].astype(np.float64)
    values = half[np.isfinite(half)]  # specials sit at the top codes, so a prefix remains
    assert len(values) >= 2 and np.all(np.diff(values) > 0)
    mids = (values[:-1] + values[1:]) / 2  # exact: both are short dyadic rationals
    values.setflags(write=False)
    mids.setflags(write=False)
    return values, mids


def _special_codes(d: DType) -> tuple[int | None, int | None]:
    """(inf code, NaN code) of a small float's positive half, None where it has none: the
    codes ml_dtypes gives inf and a quiet NaN."""
    e, m = d.exponent_bits, d.mantissa_bits
    assert e is not None and m is not None
    if d.has_inf:
        top = (2**e - 1) << m
        return top, top | 1 << (m - 1)
    return None, (2 ** (e + m) - 1 if d.has_nan else None)


def _encode_float(x: np.ndarray, d: DType) -> np.ndarray:
    inf_code, nan_code = _special_codes(d)
    if nan_code is None:
        _require_number(x, d, "encode")
    values, mids = _float_grid(d)
    mag = np.abs(x)
    with np.errstate(invalid="ignore"):  # NaN is placed below
        idx = np.searchsorted(mids, mag, side="left")  # nearest code; a tie gives the lower one
        at_mid = mids[np.minimum(idx, len(mids) - 1)] == mag
        idx = idx + (at_mid & (idx % 2 == 1))  # tie: move to the even (mantissa LSB 0) code
        # Above max the search ends at the last finite code: saturation (inf included).
        if inf_code is not None:
            # IEEE: from max + half an ulp on (the tie too: max's mantissa is odd) it is inf
            overflow = mag >= values[-1] + (values[-1] - values[-2]) / 2
            idx = np.where(overflow, inf_code, idx)
    if nan_code is not None:
        idx = np.where(np.isnan(x), nan_code, idx)
    return idx | (np.signbit(x).astype(np.intp) << (d.nbits - 1))


def encode(values: Any, dt: str | DType | Any) -> np.ndarray:
    """Round values to a 1..8-bit type and return their codes (uint8, same shape).

    Floats: round to nearest even, keep the sign of zero; ``float8_e5m2`` overflows to
    inf, the types without inf saturate to +-max finite (see the module doc). Ints: round
    half to even, clamp. NaN into a type without a NaN code, and NaN or inf into an
    integer type, raise DTypeError.
    """
    d = _small(dt, "encode")
    x = _as_float64(values, "encode")
    if d.is_float:
        code = _encode_float(x, d)
    else:
        _require_finite(x, d, "encode")
        clamped = np.clip(np.rint(x), d.min_value, d.max_value).astype(np.int64)
        code = clamped & (2**d.nbits - 1)
    return np.asarray(code, dtype=np.uint8)


def decode(codes: Any, dt: str | DType | Any) -> np.ndarray:
    """Values (float32, same shape) of codes of a 1..8-bit type; one table look-up."""
    d = _small(dt, "decode")
    return np.asarray(np.take(_decode_table(d), _as_codes(codes, d, "decode")))


def pack(codes: Any, dt: str | DType | Any) -> np.ndarray:
    """Codes (flattened in C order) as a dense little-endian bit stream (1-D uint8).

    Element i takes buffer bits [i*N, (i+1)*N), buffer bit b being bit b % 8 of byte b // 8;
    the unused high bits of the last byte are 0.
    """
    d = _small(dt, "pack")
    flat = _as_codes(codes, d, "pack").reshape(-1, 1).astype(np.uint8)
    bits = np.unpackbits(flat, axis=1, count=d.nbits, bitorder="little")
    return np.packbits(bits.reshape(-1), bitorder="little")


def _as_buffer(buffer: Any) -> np.ndarray:
    if isinstance(buffer, (bytes, bytearray, memoryview)):
        return np.frombuffer(buffer, dtype=np.uint8)
    if isinstance(buffer, np.ndarray):
        if buffer.dtype != np.uint8:
            raise DTypeError(f"unpack: buffer must hold uint8 bytes; got dtype {buffer.dtype}")
        return buffer.reshape(-1)
    raise DTypeError(
        f"unpack: buffer must be bytes, bytearray or a uint8 array; got {type(buffer).__name__}"
    )


def unpack(buffer: Any, dt: str | DType | Any, count: int) -> np.ndarray:
    """The first ``count`` codes (1-D uint8) of a bit stream written by :func:`pack`."""
    d = _small(dt, "unpack")
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 0:
        raise DTypeError(f"unpack: count must be a non-negative integer; got {count!r}")
    n = int(count)
    data = _as_buffer(buffer)
    needed = (n * d.nbits + 7) // 8
    if data.size < needed:
        raise DTypeError(
            f"unpack: buffer too short for {n} {d.name} codes: needs {needed} bytes, "
            f"got {data.size}"
        )
    bits = np.unpackbits(data[:needed], count=n * d.nbits, bitorder="little")
    return np.packbits(bits.reshape(n, d.nbits), axis=1, bitorder="little").reshape(n)


def _round_binary(x: np.ndarray, mantissa_bits: int, min_exp: int, max_value: float) -> np.ndarray:
    """Round float64 straight to a binary format (no double rounding), IEEE overflow to inf."""
    with np.errstate(invalid="ignore", over="ignore"):
        _, exp = np.frexp(x)  # |x| = f * 2**exp with 0.5 <= f < 1
        ulp_exp = np.maximum(exp - 1, min_exp) - mantissa_bits  # subnormals share min_exp's ulp
        y = np.ldexp(np.rint(np.ldexp(x, -ulp_exp)), ulp_exp)  # scaling by 2**k is exact
        return np.where(np.abs(y) > max_value, np.copysign(np.inf, x), y)


def round_to(values: Any, dt: str | DType | Any) -> np.ndarray:
    """Nearest value of type ``dt`` to each value, as float64: per-op rounding for the VM.

    1..8-bit types follow :func:`encode`; float16/bfloat16/float32 are IEEE
    round-to-nearest-even with overflow to inf; int32 rounds half to even and clamps.
    """
    d = dtype(dt)
    x = _as_float64(values, "round_to")
    if d.nbits <= 8:
        return decode(encode(x, d), d).astype(np.float64)
    if d == bfloat16:
        return np.asarray(_round_binary(x, 7, -126, d.max_value))
    if d.is_float:
        narrow = np.float16 if d == float16 else np.float32
        with np.errstate(over="ignore"):
            return np.asarray(x.astype(narrow).astype(np.float64))
    _require_finite(x, d, "round_to")
    return np.asarray(np.clip(np.rint(x), d.min_value, d.max_value))
