"""What to benchmark: projection shapes, token counts M, weight types, group sizes.

The defaults are the (K, N) = (in_features, out_features) shapes of the Llama-3-8B and
-70B projections and the M values that separate decode (M <= 16, weight-bandwidth
bound) from prefill (compute bound). Each parser takes the text a user typed and
raises :class:`BenchError` naming the option, the value and what is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowvm.bench.errors import BenchError
from lowvm.dtypes import DType
from lowvm.dtypes import dtype as as_dtype

__all__ = [
    "LLAMA_SHAPES",
    "DEFAULT_M",
    "DEFAULT_DTYPES",
    "DEFAULT_GROUPS",
    "DECODE_MAX_M",
    "Shape",
    "parse_shape",
    "parse_shapes",
    "parse_int_list",
    "parse_dtypes",
    "parse_groups",
]


@dataclass(frozen=True, order=True)
class Shape:
    """A weight of ``k`` input features and ``n`` output features (``W`` is ``[n, k]``)."""

    k: int
    n: int

    def __str__(self) -> str:
        return f"{self.k}x{self.n}"


#: Llama-3-8B: qkv 4096x6144, gate+up 4096x28672, down 14336x4096;
#: Llama-3-70B: qkv 8192x10240, down 28672x8192.
LLAMA_SHAPES: tuple[Shape, ...] = (
    Shape(4096, 6144),
    Shape(4096, 28672),
    Shape(14336, 4096),
    Shape(8192, 10240),
    Shape(28672, 8192),
)
DEFAULT_M: tuple[int, ...] = (1, 4, 16, 64, 256, 4096)
DEFAULT_DTYPES: tuple[str, ...] = ("int4",)
DEFAULT_GROUPS: tuple[int, ...] = (128,)
#: Rows with M up to this are "decode": their floor is the weight bytes over HBM bandwidth.
DECODE_MAX_M = 16


def _positive_int(text: str, option: str, what: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise BenchError(f"{option}: {what} {text.strip()!r} is not an integer") from None
    if value <= 0:
        raise BenchError(f"{option}: {what} {value} must be a positive integer")
    return value


def parse_shape(text: str, option: str = "--shape") -> Shape:
    """``"K,N"`` (or ``"KxN"``) -> :class:`Shape`."""
    parts = text.replace("x", ",").replace("X", ",").split(",")
    if len(parts) != 2:
        raise BenchError(f"{option}: {text!r} is not a shape; give K,N such as 4096,6144")
    k = _positive_int(parts[0], option, "K")
    n = _positive_int(parts[1], option, "N")
    return Shape(k, n)


def parse_shapes(values: list[str] | None) -> tuple[Shape, ...]:
    """Every ``--shape`` given (each may hold several, separated by ``;`` or spaces),
    or the Llama-3 shapes when none is given."""
    if not values:
        return LLAMA_SHAPES
    shapes: list[Shape] = []
    for value in values:
        for item in value.replace(";", " ").split():
            if item.lower() == "llama":
                shapes.extend(LLAMA_SHAPES)
            else:
                shapes.append(parse_shape(item))
    if not shapes:
        raise BenchError(f"--shape: {values!r} names no shape; give K,N such as 4096,6144")
    return tuple(dict.fromkeys(shapes))  # drop repeats, keep order


def parse_int_list(text: str, option: str, what: str = "value") -> tuple[int, ...]:
    """``"1,4,16"`` -> ``(1, 4, 16)``: positive integers, repeats dropped."""
    items = [t for t in text.split(",") if t.strip()]
    if not items:
        raise BenchError(f"{option}: {text!r} holds no {what}; give a comma-separated list")
    return tuple(dict.fromkeys(_positive_int(t, option, what) for t in items))


def parse_dtypes(text: str) -> tuple[DType, ...]:
    """``"int4,int3,e2m1"`` -> the weight types; each a 1..8-bit lowvm type."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise BenchError(f"--dtype: {text!r} names no type; give e.g. int4,int3,e3m2")
    out: list[DType] = []
    for name in items:
        try:
            dt = as_dtype(name)
        except Exception as exc:  # DTypeError: keep lowvm's message, name the option
            raise BenchError(f"--dtype: {name!r} is not a lowvm type ({exc})") from None
        if not 1 <= dt.nbits <= 8:
            raise BenchError(f"--dtype: {name!r} has {dt.nbits} bits; weight types have "
                             "1 to 8 bits (int1..int8, uint1..uint8, eXmY floats)")
        out.append(dt)
    return tuple(dict.fromkeys(out))


def parse_groups(text: str) -> tuple[int, ...]:
    """``"64,128"`` -> group sizes: positive multiples of 16 (an MMA's K)."""
    groups = parse_int_list(text, "--group", "group size")
    for g in groups:
        if g % 16:
            raise BenchError(f"--group: group size {g} must be a multiple of 16 "
                             "(such as 32, 64, 128)")
    return groups
