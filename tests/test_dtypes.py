"""Tests of lowvm.dtypes: exact float/int semantics, bit packing, look-up, errors, rounding.

Float formats that ml_dtypes also has are checked against it bit for bit; every other
format is checked exhaustively against a slow reference written from the formula below.
"""

from __future__ import annotations

import math
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lowvm import dtypes as D
from lowvm.dtypes import DType, all_dtypes, decode, dtype, encode, pack, round_to, unpack
from lowvm.errors import DTypeError, LowvmError

SMALL_FLOATS = [d for d in all_dtypes() if d.is_float and d.nbits <= 8]
SMALL_INTS = [d for d in all_dtypes() if d.is_integer and d.nbits <= 8]
ML_TYPES = {
    D.float4_e2m1: ml_dtypes.float4_e2m1fn,
    D.float6_e2m3: ml_dtypes.float6_e2m3fn,
    D.float6_e3m2: ml_dtypes.float6_e3m2fn,
    D.float8_e4m3: ml_dtypes.float8_e4m3fn,
    D.float8_e5m2: ml_dtypes.float8_e5m2,
}
IDS = str


# ---------------------------------------------------------------- reference model


def ref_value(d: DType, code: int) -> float:
    """Value of a small-float code, computed with exact fractions from the spec's formula."""
    e, m, n = d.exponent_bits, d.mantissa_bits, d.nbits
    assert e is not None and m is not None
    negative = (code >> (n - 1)) == 1
    exp_field = (code >> m) % 2**e
    frac = code % 2**m
    bias = 2 ** (e - 1) - 1
    if (n, e) == (8, 5) and exp_field == 31:  # IEEE-like e5m2
        if frac:
            return math.nan
        return -math.inf if negative else math.inf
    if (n, e) == (8, 4) and exp_field == 15 and frac == 7:  # e4m3fn: only S.1111.111 is NaN
        return math.nan
    if exp_field == 0:
        mag = Fraction(frac, 2**m) * Fraction(2) ** (1 - bias)
    else:
        mag = (1 + Fraction(frac, 2**m)) * Fraction(2) ** (exp_field - bias)
    return -float(mag) if negative else float(mag)


def max_code(d: DType) -> int:
    """Code of the largest finite value, written out per family."""
    if d == D.float8_e4m3:
        return 0x7E
    if d == D.float8_e5m2:
        return 0x7B
    return 2 ** (d.nbits - 1) - 1


def positive_grid(d: DType) -> np.ndarray:
    """Positive finite values in code order (code i has value grid[i])."""
    vals = np.array([ref_value(d, c) for c in range(max_code(d) + 1)])
    assert np.all(np.diff(vals) > 0)
    return vals


def assert_same_float32(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bit for bit, except that any NaN matches any NaN."""
    with np.errstate(invalid="ignore"):  # random bit patterns include signalling NaNs
        got = np.asarray(got, dtype=np.float32)
        want = np.asarray(want, dtype=np.float32)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))


# ---------------------------------------------------------------- the type table


def test_all_dtypes_table() -> None:
    names = [d.name for d in all_dtypes()]
    assert len(names) == len(set(names)) == 16 + 21 + 4
    assert all_dtypes() == all_dtypes()
    for d in all_dtypes():
        assert getattr(D, d.name) is d
        assert d.name in D.__all__
    for name in ("DType", "dtype", "encode", "decode", "pack", "unpack", "round_to", "all_dtypes"):
        assert name in D.__all__
    for name in D.__all__:
        assert hasattr(D, name)
    widths = {(d.nbits, d.exponent_bits) for d in SMALL_FLOATS}
    assert widths == {(n, e) for n in range(3, 9) for e in range(1, n - 1)}
    for d in SMALL_FLOATS:
        assert d.name == f"float{d.nbits}_e{d.exponent_bits}m{d.mantissa_bits}"


@pytest.mark.parametrize(
    "d, lo, hi, short",
    [
        (D.int1, -1, 0, "i1"),
        (D.int3, -4, 3, "i3"),
        (D.int8, -128, 127, "i8"),
        (D.uint1, 0, 1, "u1"),
        (D.uint4, 0, 15, "u4"),
        (D.int32, -(2**31), 2**31 - 1, "i32"),
        (D.float3_e1m1, -3.0, 3.0, "e1m1"),
        (D.float4_e2m1, -6.0, 6.0, "e2m1"),
        (D.float6_e2m3, -7.5, 7.5, "e2m3"),
        (D.float6_e3m2, -28.0, 28.0, "e3m2"),
        (D.float8_e4m3, -448.0, 448.0, "e4m3"),
        (D.float8_e5m2, -57344.0, 57344.0, "e5m2"),
        (D.float16, -65504.0, 65504.0, "f16"),
        (D.bfloat16, -float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), None, "bf16"),
        (D.float32, -float(np.finfo(np.float32).max), None, "f32"),
    ],
    ids=lambda v: str(v) if isinstance(v, DType) else "",
)
def test_ranges_and_short_names(d: DType, lo: float, hi: float | None, short: str) -> None:
    assert d.min_value == lo
    assert d.max_value == (-lo if hi is None else hi)
    assert d.short_name == short


@pytest.mark.parametrize("d", SMALL_FLOATS, ids=IDS)
def test_float_properties_match_reference(d: DType) -> None:
    assert d.max_value == positive_grid(d)[-1]
    assert d.bias == 2 ** (d.exponent_bits - 1) - 1  # type: ignore[operator]
    assert d.is_float and d.is_signed and not d.is_integer
    assert d.is_subbyte == (d.nbits < 8)
    assert d.has_inf == (d == D.float8_e5m2)
    assert d.has_nan == (d in (D.float8_e4m3, D.float8_e5m2))
    if d in ML_TYPES:
        assert d.max_value == float(ml_dtypes.finfo(ML_TYPES[d]).max)


def test_properties_misc() -> None:
    assert repr(D.int3) == "lowvm.int3" and str(D.int3) == "int3"
    assert repr(D.float6_e3m2) == "lowvm.float6_e3m2"
    assert D.uint3.is_integer and not D.uint3.is_signed and D.int3.is_signed
    assert D.int3.bias is None and D.float16.bias == 15 and D.bfloat16.bias == 127
    assert D.float16.has_inf and D.float16.has_nan and not D.int8.has_nan
    assert not D.uint8.is_subbyte and D.uint7.is_subbyte and not D.float16.is_subbyte
    assert hash(D.int3) == hash(DType("int3", 3, "int"))
    with pytest.raises(DTypeError):
        DType("float6_bad", 6, "float", 2, 2)
    with pytest.raises(DTypeError):
        DType("weird", 4, "complex")


# ---------------------------------------------------------------- look-up


def test_lookup_names_and_aliases() -> None:
    for d in all_dtypes():
        assert dtype(d) is d
        assert dtype(d.name) is d
        assert dtype(d.short_name) is d
    aliases = {
        "e3m2": D.float6_e3m2,
        "float4_e2m1fn": D.float4_e2m1,
        "float6_e2m3fn": D.float6_e2m3,
        "float6_e3m2fn": D.float6_e3m2,
        "float8_e4m3fn": D.float8_e4m3,
        "f16": D.float16,
        "half": D.float16,
        "fp16": D.float16,
        "bf16": D.bfloat16,
        "f32": D.float32,
        "float": D.float32,
        "fp32": D.float32,
        "i32": D.int32,
        "i4": D.int4,
        "u4": D.uint4,
        "BF16": D.bfloat16,
    }
    for name, want in aliases.items():
        assert dtype(name) is want, name


def test_lookup_foreign_dtypes() -> None:
    torch = pytest.importorskip("torch")
    pairs = [
        (np.float16, D.float16),
        (np.dtype("float32"), D.float32),
        (np.int32, D.int32),
        (np.int8, D.int8),
        (np.dtype(np.uint8), D.uint8),
        (ml_dtypes.bfloat16, D.bfloat16),
        (np.dtype(ml_dtypes.float8_e4m3fn), D.float8_e4m3),
        (ml_dtypes.float4_e2m1fn, D.float4_e2m1),
        (torch.float16, D.float16),
        (torch.bfloat16, D.bfloat16),
        (torch.float32, D.float32),
        (torch.int32, D.int32),
        (torch.int8, D.int8),
        (torch.uint8, D.uint8),
        (torch.float8_e5m2, D.float8_e5m2),
    ]
    for obj, want in pairs:
        assert dtype(obj) is want, obj
    # ml_dtypes' float8_e4m3 has inf and a different range: it must not alias ours.
    for obj in (ml_dtypes.float8_e4m3, np.float64, torch.float64, 3.5):
        with pytest.raises(DTypeError, match="unknown data type"):
            dtype(obj)


@pytest.mark.parametrize(
    "name, hint",
    [
        ("int9", "1..8 bits"),
        ("int0", "1..8 bits"),
        ("uint12", "1..8 bits"),
        ("i9", "1..8 bits"),
        ("float9_e5m3", "3..8 bits"),
        ("e5m3", "3..8 bits"),
        ("float6_e2m2", "5 bits, not 6"),
        ("float5_e0m4", "at least 1 exponent"),
        ("nonsense", "accepted: int1..int8"),
        ("float8_e4m3fnuz", "accepted:"),
        ("e4m3fn", "accepted:"),
    ],
)
def test_unknown_names(name: str, hint: str) -> None:
    with pytest.raises(DTypeError) as info:
        dtype(name)
    message = str(info.value)
    assert isinstance(info.value, LowvmError) and isinstance(info.value, ValueError)
    assert f"'{name}'" in message and hint in message and "float6_e3m2" in message


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("d", list(ML_TYPES), ids=IDS)
def test_decode_matches_ml_dtypes(d: DType) -> None:
    codes = np.arange(2**d.nbits, dtype=np.uint8)
    want = codes.view(ML_TYPES[d]).astype(np.float32)
    got = decode(codes, d)
    assert got.dtype == np.float32
    assert_same_float32(got, want)


@pytest.mark.parametrize("d", SMALL_FLOATS, ids=IDS)
def test_decode_matches_reference(d: DType) -> None:
    codes = np.arange(2**d.nbits)
    want = np.array([ref_value(d, int(c)) for c in codes], dtype=np.float32)
    assert_same_float32(decode(codes, d), want)


@pytest.mark.parametrize("d", SMALL_INTS, ids=IDS)
def test_decode_ints(d: DType) -> None:
    codes = np.arange(2**d.nbits)
    if d.kind == "int":
        want = np.where(codes >= 2 ** (d.nbits - 1), codes - 2**d.nbits, codes)
    else:
        want = codes
    got = decode(codes, d)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)


def test_decode_shapes_and_inputs() -> None:
    torch = pytest.importorskip("torch")
    assert decode(3, D.uint4).shape == () and decode(3, D.uint4) == 3
    grid = np.arange(16).reshape(2, 8)
    assert decode(grid, "e2m1").shape == (2, 8)
    np.testing.assert_array_equal(decode(torch.tensor([1, 15]), D.int4), [1, -1])
    np.testing.assert_array_equal(decode([1, 0], D.int1), [-1, 0])
    assert decode([], D.int3).shape == (0,)


# ---------------------------------------------------------------- encode: floats


def ml_candidates(d: DType, rng: np.random.Generator) -> np.ndarray:
    """float32 inputs probing every rounding boundary of d, all with |x| <= max."""
    grid = positive_grid(d)
    mids = ((grid[:-1] + grid[1:]) / 2).astype(np.float32)  # exact in float32
    up = np.nextafter(mids, np.float32(np.inf))
    down = np.nextafter(mids, np.float32(0))
    linear = rng.uniform(-d.max_value, d.max_value, 4000)
    tiny = float(grid[1])
    logs = np.exp2(rng.uniform(math.log2(tiny) - 3, math.log2(d.max_value), 4000))
    logs *= rng.choice([-1.0, 1.0], logs.size)
    parts = [grid, mids, up, down, linear, logs, [0.0, -0.0, d.max_value, tiny / 3]]
    xs = np.concatenate([np.asarray(p, dtype=np.float32) for p in parts])
    xs = np.concatenate([xs, -xs])
    return xs[np.abs(xs) <= d.max_value]


@pytest.mark.parametrize("d", list(ML_TYPES), ids=IDS)
def test_encode_matches_ml_dtypes(d: DType) -> None:
    xs = ml_candidates(d, np.random.default_rng(d.nbits * 100 + d.exponent_bits))  # type: ignore[operator]
    want = xs.astype(ML_TYPES[d]).view(np.uint8) & (2**d.nbits - 1)  # code sits in the low bits
    got = encode(xs, d)
    assert got.dtype == np.uint8
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"first mismatch at x={xs[bad[0]]!r}: {got[bad[0]]} vs {want[bad[0]]}"


@pytest.mark.parametrize("d", SMALL_FLOATS, ids=IDS)
def test_encode_decode_round_trip(d: DType) -> None:
    codes = np.arange(2**d.nbits)
    want = codes.copy()
    sign = 1 << (d.nbits - 1)
    values = np.array([ref_value(d, int(c)) for c in codes])
    nan = np.isnan(values)  # every NaN code becomes the quiet NaN of its sign (ml_dtypes')
    quiet = 0x7E if d == D.float8_e5m2 else 0x7F
    want[nan] = quiet | (codes[nan] & sign)
    np.testing.assert_array_equal(encode(decode(codes, d), d), want)  # inf codes stay inf
    assert encode(0.0, d) == 0 and encode(-0.0, d) == sign  # the sign of zero is kept


@pytest.mark.parametrize("d", SMALL_FLOATS, ids=IDS)
def test_encode_midpoints_and_neighbours(d: DType) -> None:
    grid = positive_grid(d)
    sign = 1 << (d.nbits - 1)
    lower = np.arange(len(grid) - 1)
    mids = (grid[:-1] + grid[1:]) / 2
    even = np.where(lower % 2 == 0, lower, lower + 1)  # ties go to the code with mantissa LSB 0
    np.testing.assert_array_equal(encode(mids, d), even)
    np.testing.assert_array_equal(encode(-mids, d), even | sign)
    np.testing.assert_array_equal(encode(np.nextafter(mids, np.inf), d), lower + 1)
    np.testing.assert_array_equal(encode(np.nextafter(mids, 0.0), d), lower)
    np.testing.assert_array_equal(encode(-np.nextafter(mids, np.inf), d), (lower + 1) | sign)
    # A tiny negative that rounds to zero keeps its sign.
    assert encode(-grid[1] / 4, d) == sign and encode(-grid[1] / 2, d) == sign


@pytest.mark.parametrize("d", SMALL_FLOATS, ids=IDS)
def test_overflow_saturates_without_an_inf_code_and_is_inf_with_one(d: DType) -> None:
    top = max_code(d)
    sign = 1 << (d.nbits - 1)
    assert decode(top, d) == d.max_value
    big = [2 * d.max_value, -2 * d.max_value, 1e300, -1e300, np.inf, -np.inf]
    if d.has_inf:  # e5m2: IEEE, overflow and inf are inf
        inf = top + 1
        np.testing.assert_array_equal(encode(big, d), [inf, inf | sign] * 3)
        np.testing.assert_array_equal(decode(inf, d), np.inf)
    else:  # no inf code: saturation, inf included
        np.testing.assert_array_equal(encode(big, d), [top, top | sign] * 3)


@pytest.mark.parametrize("d", SMALL_FLOATS, ids=IDS)
def test_nan_keeps_its_sign_or_is_refused(d: DType) -> None:
    sign = 1 << (d.nbits - 1)
    if d.has_nan:
        quiet = 0x7E if d.has_inf else 0x7F  # S.11111.10 and S.1111.111, as ml_dtypes
        np.testing.assert_array_equal(encode([np.nan, -np.nan], d), [quiet, quiet | sign])
        assert np.isnan(decode(quiet, d)) and np.isnan(decode(quiet | sign, d))
    else:
        with pytest.raises(DTypeError, match=rf"1 NaN value\(s\) cannot be represented in "
                                             rf"{d.name} \(it has no NaN code"):
            encode([1.0, np.inf, np.nan], d)


def special_candidates(d: DType, rng: np.random.Generator) -> np.ndarray:
    """float32 inputs beyond ``d``'s range: the IEEE overflow threshold (max + half an
    ulp) and its neighbours, larger values up to float32's max, +-inf and NaN."""
    grid = positive_grid(d)
    top = grid[-1] + (grid[-1] - grid[-2]) / 2
    edge = np.float32([top, np.nextafter(np.float32(top), np.float32(0)),
                       np.nextafter(np.float32(top), np.float32(np.inf)), 2 * grid[-1],
                       np.finfo(np.float32).max, np.inf, np.nan])
    far = np.exp2(rng.uniform(np.log2(grid[-1]), 127, 500)).astype(np.float32)
    xs = np.concatenate([edge, far])
    return np.concatenate([xs, -xs])


@pytest.mark.parametrize("d", list(ML_TYPES), ids=IDS)
def test_specials_and_overflow_against_ml_dtypes(d: DType) -> None:
    """Every input ml_dtypes converts, compared code for code, with the one documented
    difference: float8_e4m3fn overflow and inf saturate here (PTX cvt.rn.satfinite) where
    ml_dtypes gives NaN; and NaN into a type without a NaN code is refused here."""
    rng = np.random.default_rng(d.nbits * 7 + d.exponent_bits)  # type: ignore[operator]
    xs = np.concatenate([special_candidates(d, rng), ml_candidates(d, rng)])
    mask = 2**d.nbits - 1
    if not d.has_nan:
        refused = np.isnan(xs)
        with pytest.raises(DTypeError):
            encode(xs, d)
        xs = xs[~refused]
    reference = xs
    if d == D.float8_e4m3:  # the documented difference: ml_dtypes overflows to NaN
        with np.errstate(over="ignore"):
            assert np.isnan(np.float32([np.inf, 2 * d.max_value]).astype(ML_TYPES[d])
                            .astype(np.float32)).all()
        reference = np.clip(xs, -d.max_value, d.max_value)  # NaN stays NaN
    with np.errstate(over="ignore", invalid="ignore"):
        want = reference.astype(ML_TYPES[d]).view(np.uint8) & mask
    got = encode(xs, d)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"first mismatch at x={xs[bad[0]]!r}: {got[bad[0]]} vs {want[bad[0]]}"


def test_the_documented_examples() -> None:
    """README/docs: IEEE-like types keep inf for inf and overflow, the others saturate."""
    assert round_to(np.array([1e6]), "float16")[0] == np.inf
    assert round_to(np.array([1e39]), "bfloat16")[0] == np.inf
    assert decode(encode(np.inf, "e5m2"), "e5m2") == np.inf
    assert decode(encode(1e6, "e5m2"), "e5m2") == np.inf
    assert decode(encode(np.inf, "e4m3"), "e4m3") == 448.0
    assert decode(encode(-1e6, "e2m1"), "e2m1") == -6.0


def test_encode_inputs_and_shapes() -> None:
    torch = pytest.importorskip("torch")
    x = np.array([[0.5, -1.5], [3.0, 7.0]])
    assert encode(x, "e2m1").shape == (2, 2)
    assert encode(1.0, "e2m1").shape == ()
    for kind in (np.float16, np.float32, ml_dtypes.bfloat16):
        np.testing.assert_array_equal(encode(x.astype(kind), "e2m1"), encode(x, "e2m1"))
    for tdt in (torch.float32, torch.bfloat16, torch.float64):
        t = torch.tensor(x, dtype=tdt, requires_grad=True)
        np.testing.assert_array_equal(encode(t, "e2m1"), encode(x, "e2m1"))
    np.testing.assert_array_equal(encode([1, 2, 3], D.uint2), [1, 2, 3])
    assert encode([], D.int3).shape == (0,)


# ---------------------------------------------------------------- encode: ints


@pytest.mark.parametrize("d", SMALL_INTS, ids=IDS)
def test_int_round_trip(d: DType) -> None:
    values = np.arange(d.min_value, d.max_value + 1)
    codes = encode(values, d)
    np.testing.assert_array_equal(codes, values.astype(np.int64) & (2**d.nbits - 1))
    np.testing.assert_array_equal(decode(codes, d), values)
    assert sorted(codes.tolist()) == list(range(2**d.nbits))


def test_int_rounding_and_clamping() -> None:
    np.testing.assert_array_equal(
        decode(encode([2.5, 3.5, -2.5, 0.5, -0.5, 1.49], D.int4), D.int4), [2, 4, -2, 0, 0, 1]
    )
    np.testing.assert_array_equal(decode(encode([100, -100, 3.6], D.int3), D.int3), [3, -4, 3])
    np.testing.assert_array_equal(decode(encode([-5, 9, 1e300], D.uint3), D.uint3), [0, 7, 7])
    np.testing.assert_array_equal(encode([-1, 0, 5, -7], D.int1), [1, 0, 0, 1])


# ---------------------------------------------------------------- pack / unpack


def test_pack_by_hand() -> None:
    # uint3 [1, 2, 3]: 1 -> bits 0..2 = 001 sets bit 0; 2 -> bits 3..5 = 010 sets bit 4;
    # 3 -> bits 6..8 = 011 sets bits 6 and 7. Byte 0 = 1 + 16 + 64 + 128 = 0xD1; bit 8 is 0,
    # so byte 1 = 0x00. 9 bits -> 2 bytes.
    np.testing.assert_array_equal(pack([1, 2, 3], D.uint3), [0xD1, 0x00])
    # uint3 [5, 7, 6]: 5 = 101 sets bits 0, 2; 7 sets bits 3, 4, 5; 6 = 110 sets bits 7, 8.
    # Byte 0 = 1 + 4 + 8 + 16 + 32 + 128 = 0xBD, byte 1 = 0x01.
    np.testing.assert_array_equal(pack([5, 7, 6], D.uint3), [0xBD, 0x01])
    # int4 codes 0x1 then 0xF: element 0 in the low nibble -> 0xF1.
    np.testing.assert_array_equal(pack([0x1, 0xF], D.int4), [0xF1])
    # 6-bit codes 0b111111, 0b000001: bits 0..5 and bit 6 set -> 0x7F; bits 8..11 -> 0x00.
    np.testing.assert_array_equal(pack([63, 1], D.float6_e3m2), [0x7F, 0x00])
    # 2-D codes are flattened in C order.
    np.testing.assert_array_equal(pack([[1, 2], [3, 0]], D.uint2), [0b00_11_10_01])


@pytest.mark.parametrize("nbits", range(1, 9))
@pytest.mark.parametrize("count", [0, 1, 3, 7, 13, 257])
def test_pack_round_trip(nbits: int, count: int) -> None:
    d = dtype(f"uint{nbits}")
    codes = np.random.default_rng(nbits * 1000 + count).integers(0, 2**nbits, count)
    packed = pack(codes, d)
    assert packed.dtype == np.uint8 and packed.ndim == 1
    assert packed.size == math.ceil(count * nbits / 8)
    if packed.size:  # unused high bits of the last byte are zero
        used = count * nbits - 8 * (packed.size - 1)
        assert int(packed[-1]) >> used == 0
    for buf in (packed, packed.tobytes(), bytearray(packed.tobytes())):
        out = unpack(buf, d, count)
        assert out.dtype == np.uint8 and out.shape == (count,)
        np.testing.assert_array_equal(out, codes)
    # Same width, other kinds: the bit stream only depends on the width.
    for other in all_dtypes():
        if other.nbits == nbits:
            np.testing.assert_array_equal(pack(codes, other), packed)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 8).flatmap(
        lambda n: st.tuples(st.just(n), st.lists(st.integers(0, 2**n - 1), max_size=80))
    )
)
def test_pack_property(case: tuple[int, list[int]]) -> None:
    nbits, codes = case
    d = dtype(f"uint{nbits}")
    packed = pack(codes, d)
    assert len(packed) == math.ceil(len(codes) * nbits / 8)
    assert unpack(packed, d, len(codes)).tolist() == codes
    # A longer buffer is fine; only the first count codes come back.
    assert unpack(np.append(packed, 0xFF).astype(np.uint8), d, len(codes)).tolist() == codes


def test_unpack_errors() -> None:
    with pytest.raises(DTypeError, match="needs 2 bytes, got 1"):
        unpack(b"\x00", D.uint3, 5)
    with pytest.raises(DTypeError, match="-1"):
        unpack(b"", D.uint3, -1)
    with pytest.raises(DTypeError, match="int16"):
        unpack(np.zeros(4, dtype=np.int16), D.uint3, 1)
    with pytest.raises(DTypeError, match="list"):
        unpack([1, 2], D.uint3, 1)


# ---------------------------------------------------------------- errors


def test_value_errors_name_the_value() -> None:
    with pytest.raises(DTypeError, match=r"1 NaN value.*float6_e3m2.*first: nan") as info:
        encode([1.0, np.inf, np.nan], D.float6_e3m2)
    assert isinstance(info.value, LowvmError)
    with pytest.raises(DTypeError, match=r"2 non-finite.*int4.*first: inf"):
        encode([1.0, np.inf, np.nan], D.int4)
    with pytest.raises(DTypeError, match="first: nan"):
        encode([np.nan], D.int4)
    with pytest.raises(DTypeError, match="code 8 "):
        decode([0, 8, 9], D.uint3)
    with pytest.raises(DTypeError, match="code -1 "):
        pack([-1], D.int3)
    with pytest.raises(DTypeError, match="code 256 "):
        pack(np.array([256], dtype=np.uint16), D.uint8)
    with pytest.raises(DTypeError, match="integers"):
        decode([1.0], D.uint3)
    with pytest.raises(DTypeError, match="1..8-bit types only"):
        encode([1.0], D.float16)
    with pytest.raises(DTypeError, match="int32"):
        pack([1], "int32")
    with pytest.raises(DTypeError, match="'abc'"):
        encode("abc", D.uint3)
    with pytest.raises(DTypeError, match="first: nan"):
        round_to([1.0, np.nan], D.int32)
    with pytest.raises(DTypeError, match="'int9'"):
        encode([1], "int9")


# ---------------------------------------------------------------- round_to


def test_round_to_bfloat16_matches_ml_dtypes() -> None:
    rng = np.random.default_rng(7)
    random_bits = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    bf16_bits = rng.integers(0, 2**16, 5000, dtype=np.uint32) << 16
    ties = bf16_bits | 0x8000  # exactly halfway between two bfloat16 values
    near = np.concatenate([ties - 1, ties + 1])
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.3961e38, 3.4e38, 1e-45, -1e-40])
    x = np.concatenate(
        [np.concatenate([random_bits, ties, near]).view(np.float32), specials.astype(np.float32)]
    )
    with np.errstate(invalid="ignore"):
        want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    got = round_to(x, D.bfloat16)
    assert got.dtype == np.float64
    assert_same_float32(got, want)


def test_round_to_bfloat16_rounds_once_from_float64() -> None:
    # 1 + 2**-8 is a tie (-> 1.0); a hair above it must round up, not through float32 to a tie.
    got = round_to([1 + 2**-8, 1 + 2**-8 + 2**-40, 1 + 3 * 2**-8, -(1 + 2**-8 + 2**-40)], "bf16")
    np.testing.assert_array_equal(got, [1.0, 1 + 2**-7, 1 + 2**-6, -(1 + 2**-7)])


def test_round_to_float16_and_float32() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal(5000) * 10.0 ** rng.integers(-8, 6, 5000)
    x32 = rng.integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    for xs in (x, x32):
        with np.errstate(over="ignore", invalid="ignore"):
            want = xs.astype(np.float16).astype(np.float64)
        assert_same_float32(round_to(xs, D.float16), want)
    np.testing.assert_array_equal(
        round_to([65519.99, 65520.0, 2049.0, 2051.0, 2.0**-25, 1.5 * 2.0**-25], "f16"),
        [65504.0, np.inf, 2048.0, 2052.0, 0.0, 2.0**-24],
    )
    np.testing.assert_array_equal(round_to([0.1, 1e39], D.float32), [np.float32(0.1), np.inf])


def test_round_to_small_types() -> None:
    x = np.random.default_rng(5).uniform(-40, 40, 2000)
    for d in (*SMALL_FLOATS, *SMALL_INTS):
        got = round_to(x, d)
        assert got.dtype == np.float64 and got.shape == x.shape
        np.testing.assert_array_equal(got, decode(encode(x, d), d))
    np.testing.assert_array_equal(
        round_to([2.5, 3.5, 1e20, -1e20], D.int32), [2, 4, 2**31 - 1, -(2**31)]
    )
    assert round_to(np.nan, D.float8_e4m3).shape == () and np.isnan(round_to(np.nan, "e4m3"))
