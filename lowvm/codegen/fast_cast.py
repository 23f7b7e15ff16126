"""``cast`` from 1..8-bit types to float16/bfloat16 by bit manipulation, two lanes at a time.

The generic lowering converts element by element through ``float`` (``lowvm_get_bits``,
``lowvm_decode_float``, a rounding conversion). Every value of a 1..8-bit type is exactly
representable in float16 (except e5m1/e6m1, see below) and in bfloat16, so the conversion
needs no rounding at all: the code's bits are moved into a 16-bit pattern and one
half2/bfloat162 instruction per *pair* of locals fixes the value. This module builds that
straight-line code as a small list of 32-bit operations (:class:`Op`), from one table of
constants per (source, destination) pair (:class:`Recipe`). The same list is printed as
CUDA (:func:`emit_fast_cast`) and executed in numpy (:func:`simulate`), so the tests prove
the emitted recipe exact on every code without a GPU: model and kernel cannot drift.

Locals ``2j`` and ``2j + 1`` become the low and high halves of one 32-bit word (``__half2``
order), stored with one 32-bit store into the destination array (declared
``__align__(16)``). An odd last local uses the low half only.

**Integers** (``intN``/``uintN``), code ``c``, ``u = c XOR 2^(N-1)`` for ``intN`` (``c`` for
``uintN``), ``b = 2^(N-1)`` for ``intN`` (0 for ``uintN``), so the value is ``u - b``:

* the lane is ``MAGIC | u << t`` with ``MAGIC = 2^P`` (``P`` = 10 mantissa bits for float16,
  pattern ``0x6400``; 7 for bfloat16, ``0x4300`` = 128.0) and ``t + N <= P``. One
  ``lop3`` gives ``(bits & mask) ^ (MAGIC | b << t)``: the mask keeps the code, the XOR
  sets the magic exponent (disjoint bits) and flips the sign bit. The lane's value is
  ``2^P + u * 2^t``: an integer below ``2^(P+1)``, so exact (spacing 1 in ``[2^P,
  2^(P+1))``). ``t = 0``: ``__hsub2(x, 2^P + b)``; ``t > 0``: ``__hfma2(x, 2^-t,
  -(2^(P-t) + b))``. Both compute ``u - b`` exactly: ``x * 2^-t`` is exact, the exact
  result is an integer of at most 8 significant bits, and the constants ``2^(P-t) + b``
  (``b < 2^(P-t)``) fit in ``P + 1`` bits.
* float16 covers N = 1..8 this way. bfloat16 has ``P = 7``: ``128 + u`` is exact only for
  ``u < 128``, i.e. N <= 7. For N = 8 (int8/uint8 to bfloat16) the magic is float32's
  ``2^23`` (``0x4B000000 | u``, exact), one float32 subtraction of ``2^23 + b`` gives the
  exact integer ``u - b`` (|.| <= 255, at most 8 significant bits), whose float32 pattern
  therefore has 16 zero low bits: its high half *is* the bfloat16 pattern (``prmt`` packs
  two high halves), no rounding involved.
* Codes reach the lanes with shifts, funnel shifts (``__funnelshift_r`` where a pair
  straddles two 32-bit words, including widths 3, 5, 6, 7) and ``prmt``; positions are
  compile-time constants. Widths 1, 2, 4 use whole words: ``(w >> s) & (mask << t)``
  applied to both halves of a word at once picks locals ``i`` and ``i + 16/N``. Every
  result lane is recorded against its source local, and the destination's register
  pairs are then assembled (:meth:`_Builder.assemble`): one 32-bit store where one value
  already holds the pair in order, else a ``prmt`` whose selector picks the two lanes.
  In the plain order the whole-word casts need one ``prmt`` per pair; stored in the
  :func:`~lowvm.layouts.split_pairs` order (:func:`pair_span`) they need none, and a
  relayout cast (destination local ``l`` = source local ``perm[l]``) costs nothing more
  than its permutation. Widths 3, 5, 6, 7 in that order: codes ``i`` and ``i + span/2``
  start ``16 (mod 32)`` bits apart, so most pairs sit at one position of a low and a
  high lane of two words; one ``lop3`` (or ``prmt``) splices the two words and the
  spliced word decodes like a whole one (:func:`_plan_int_matched`); a pair that
  straddles a lane or word boundary gathers its bytes with one ``prmt`` (its lanes' bit
  positions may differ: half2 constants are per lane), else takes windows. The plain
  order's plan is kept where it is shorter. int8/uint8 to float16 is one
  ``prmt`` with the magic bytes (``0x64``) per pair, after one XOR per word for int8.

**Small floats** ``eXmY`` (``n = 1 + X + Y`` bits) to a destination with ``Ed`` exponent
and ``Md`` mantissa bits: the code is placed with its sign at bit 15 (``n``-bit field at
``16 - n``), the magnitude shifted right by ``Ed - X`` so the exponent field lands in the
low ``X`` exponent bits and the mantissa at the top of the mantissa field. Read in the
destination format that pattern is ``2^(e - bias_dst) * 1.m`` (``e > 0``) or
``2^(1 - bias_dst) * 0.m`` (``e = 0``, a destination subnormal): exactly the source value
times ``2^(bias_src - bias_dst)`` in both cases, so one ``__hmul2`` by
``2^(bias_dst - bias_src)`` gives the value, exact whenever the value is representable in
the destination (subnormals included: the half/bf16 multiply keeps them). Signed zeros
stay signed. Specials: e5m2 to float16 (same exponent width and bias) is the shift alone,
inf and NaN land on inf and NaN. e4m3's NaN (``S.1111.111``) decodes to +-480 and e5m2's
inf/NaN (to bfloat16) to >= 65536, both above the format's largest finite value, so a
compare (``__hgt2_mask`` of ``|r|`` against it) sets the destination's exponent bits:
inf stays inf (zero mantissa), NaN stays NaN with its sign (payload not canonical).
3..7-bit floats are stored in the :func:`pair_span` order too: a pair's two codes then
sit at one bit ``p`` of a low and a high lane of one word (or two spliced), and two
shifts of that word, shared by every pair at ``p``, bring the signs to bit 15 and the
magnitudes to their place (:func:`_plan_float_matched`); in the plain order each pair
first needs its own window, shift and ``prmt`` to put its codes 16 bits apart.

**Hardware conversion** (sm_89 and later): float8_e4m3 to float16 is one PTX
``cvt.rn.f16x2.e4m3x2`` per pair of codes (two bytes of a word), plus one ``prmt`` and one
``lop3`` that put each code's sign bit on its lane: the instruction returns NaN codes as
the unsigned canonical NaN, and lowvm keeps a NaN's sign. :func:`plan_hardware_cast`
builds that plan; the kernel runs it under ``__CUDA_ARCH__ >= 890`` and the bit
manipulation above on older GPUs (sm_90 main loop of a 4096 x 4096 decode GEMM: 271 ->
139 instructions per K step, against int8's 124).

Not covered (returns False, the generic loop runs): e5m1 and e6m1 to float16 (their
largest values overflow float16 to inf, and e6m1's smallest underflow; the shift would
produce NaN patterns), every other source or destination type.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lowvm.dtypes import (
    DType,
    all_dtypes,
    bfloat16,
    decode,
    float8_e4m3,
    float16,
    int8,
    round_to,
    uint8,
)
from lowvm.instructions.values import from_codes, to_codes

if TYPE_CHECKING:
    from lowvm.codegen.context import CudaContext
    from lowvm.instructions.data import Cast

__all__ = ["Op", "Recipe", "recipe", "plan_cast", "plan_hardware_cast", "plan_work",
           "pair_span", "simulate", "emit_fast_cast", "LOP3_AND_XOR", "HARDWARE_MIN_ARCH"]

#: ``lop3`` truth table of ``(a & b) ^ c`` (a = 0xF0, b = 0xCC, c = 0xAA).
LOP3_AND_XOR = (0xF0 & 0xCC) ^ 0xAA
#: ``(a & b) | c``.
LOP3_AND_OR = (0xF0 & 0xCC) | 0xAA
#: ``a & b`` (c unused).
LOP3_AND = 0xF0 & 0xCC
#: ``c ? a : b`` bit by bit: ``(a & c) | (b & ~c)``.
LOP3_SELECT = (0xF0 & 0xAA) | (0xCC & ~0xAA & 0xFF)

_PRMT_HIGH_HALVES = 0x7632  # high half of a, high half of b
_PRMT_SPLICE = 0x7610  # low half of a, high half of b
_PRMT_SWAP_SPLICE = 0x5432  # high half of a, low half of b
_F32_MAGIC = 0x4B000000  # 2^23


def _lanes(v: int) -> int:
    """A 16-bit pattern in both halves of a 32-bit word."""
    return (v & 0xFFFF) * 0x10001


def _two_lanes(low: int, high: int) -> int:
    """Two 16-bit patterns as the low and high halves of a 32-bit word."""
    return (low & 0xFFFF) | (high & 0xFFFF) << 16


#: a code's bit position in its 16-bit lane: one for both lanes, or ``(lane 0, lane 1)``
LaneBits = int | tuple[int, int]


def _per_lane(t: LaneBits) -> tuple[int, int]:
    return (t, t) if isinstance(t, int) else t


def _bits16(value: float, dst: DType) -> int:
    """The float16/bfloat16 pattern of ``value``, which must be exactly representable."""
    exact = round_to(np.array([value]), dst)
    if not (exact[0] == value or (math.isnan(value) and math.isnan(exact[0]))):
        raise ValueError(f"{value!r} is not exact in {dst.name}")  # a bug in a recipe
    return int(to_codes(exact, dst)[0])


# ---------------------------------------------------------------------------------------
# the table of recipe constants


@dataclass(frozen=True)
class Recipe:
    """The constants of one conversion ``src -> dst``; :func:`plan_cast` reads only these.

    ``method`` is ``"int"`` (magic-number lanes), ``"int8_f32"`` (int8/uint8 to bfloat16
    through float32's magic) or ``"float"`` (placement and one multiply).
    """

    src: DType
    dst: DType
    method: str
    mantissa: int  # destination mantissa bits P (10 or 7)
    magic: int = 0  # pattern of 2^P: 0x6400 or 0x4300 ("int")
    sign_flip: int = 0  # 2^(N-1) for intN, 0 otherwise ("int", "int8_f32")
    offset: int = 0  # bit of the code's lowest bit in its lane ("float": 16 - n)
    shift: int = 0  # right shift of the magnitude, Ed - X ("float")
    sign_mask: int = 0  # both lanes' sign bits ("float")
    mag_mask: int = 0  # both lanes' placed magnitude bits ("float")
    scale: int = 0  # lanes of 2^(bias_dst - bias_src), 0 when it is 1 ("float")
    special_max: int = 0  # lanes of the largest finite value; 0: no specials ("float")
    special_bits: int = 0  # lanes of the destination's exponent field ("float")

    @property
    def nbits(self) -> int:
        return self.src.nbits

    @property
    def code_mask(self) -> int:
        return (1 << self.src.nbits) - 1

    def max_t(self) -> int:
        """Largest lane position of an integer code (``t + N <= P``)."""
        return self.mantissa - self.src.nbits

    def int_mask(self, t: LaneBits) -> int:
        """Both lanes' code bits, codes at lane bit ``t`` (or ``(t0, t1)``, per lane)."""
        t0, t1 = _per_lane(t)
        return _two_lanes(self.code_mask << t0, self.code_mask << t1)

    def int_xor(self, t: LaneBits) -> int:
        """Both lanes' magic exponent and flipped sign bit, codes at lane bit ``t``."""
        t0, t1 = _per_lane(t)
        return _two_lanes(self.magic | (self.sign_flip << t0),
                          self.magic | (self.sign_flip << t1))

    def int_finish(self, t: LaneBits) -> tuple[str, tuple[int, ...]]:
        """The half2 operation and constant lanes turning ``MAGIC | u << t`` into the value
        (a half2 operation takes a constant per lane, so the lanes' ``t`` may differ)."""
        p, b = self.mantissa, self.sign_flip
        t0, t1 = _per_lane(t)
        if t0 == t1 == 0:
            return "hsub2", (_lanes(_bits16(2.0**p + b, self.dst)),)
        return "hfma2", (_two_lanes(*(_bits16(2.0**-u, self.dst) for u in (t0, t1))),
                         _two_lanes(*(_bits16(-(2.0 ** (p - u) + b), self.dst)
                                      for u in (t0, t1))))

    def f32_bias(self) -> int:
        """float32 pattern of ``2^23 + b`` ("int8_f32")."""
        return int(np.array([2.0**23 + self.sign_flip], np.float32).view(np.uint32)[0])


_FORMAT = {float16: (5, 10), bfloat16: (8, 7)}


def _float_exact(src: DType, dst: DType) -> bool:
    """Every finite value of ``src`` is exactly a ``dst`` value (the multiply is then exact)."""
    values = decode(np.arange(1 << src.nbits), src).astype(np.float64)
    finite = values[np.isfinite(values)]
    return bool(np.array_equal(round_to(finite, dst), finite))


def recipe(src: DType, dst: DType) -> Recipe | None:
    """The constants converting ``src`` to ``dst``; None when the conversion is not covered."""
    if dst not in _FORMAT or src not in all_dtypes() or src.nbits > 8:
        return None
    ed, md = _FORMAT[dst]
    if src.is_integer:
        flip = 1 << (src.nbits - 1) if src.kind == "int" else 0
        if dst == bfloat16 and src.nbits == 8:
            return Recipe(src, dst, "int8_f32", md, sign_flip=flip)
        magic = _bits16(2.0**md, dst)
        return Recipe(src, dst, "int", md, magic=magic, sign_flip=flip)
    e, m, n = src.exponent_bits, src.mantissa_bits, src.nbits
    assert e is not None and m is not None and src.bias is not None and dst.bias is not None
    if e > ed or m > md or not _float_exact(src, dst):
        return None
    if e == ed and src.has_inf != dst.has_inf:
        return None  # the top exponent would read as inf/NaN in dst but is finite in src
    offset, shift = 16 - n, ed - e
    mag = ((1 << (n - 1)) - 1) << (offset - shift)
    diff = dst.bias - src.bias
    scale = _lanes(_bits16(2.0**diff, dst)) if diff else 0
    special_max = special_bits = 0
    if src.has_nan and not (e == ed and diff == 0):
        special_max = _lanes(_bits16(src.max_value, dst))
        special_bits = _lanes(((1 << ed) - 1) << md)
    return Recipe(src, dst, "float", md, offset=offset, shift=shift, sign_mask=0x80008000,
                  mag_mask=_lanes(mag), scale=scale, special_max=special_max,
                  special_bits=special_bits)


# ---------------------------------------------------------------------------------------
# the straight-line program


Operand = str | int  # a value's name, or a 32-bit constant


@dataclass(frozen=True)
class Op:
    """One operation on 32-bit values (each holds two 16-bit lanes where that matters).

    kinds: ``word`` (imm: word k of the source bit stream), ``shr``/``shl`` (imm: s),
    ``shf`` (funnel shift right of args (lo, hi) by imm s), ``lop3`` (args a, b, c; imm:
    truth table), ``prmt`` (args a, b; imm: selector), ``hsub2`` / ``hmul2`` (imm: constant
    lanes), ``hfma2`` (imm: multiplier, addend), ``fsub`` (float32 minus imm pattern),
    ``hgt_mask`` (0xFFFF per lane where ``|a| > imm``), ``cvt_e4m3x2`` (imm: h: the
    float16 pair of the two e4m3 bytes in half h of a, NaN as 0x7FFF), ``store2`` /
    ``store1`` (imm: local index: both lanes to locals l, l + 1, or the low lane to local
    l), ``comment``.
    """

    kind: str
    out: str = ""
    args: tuple[Operand, ...] = ()
    imm: tuple[int, ...] = ()


class _Builder:
    """Appends operations, naming their results v1, v2, ..."""

    def __init__(self, rec: Recipe, size: int) -> None:
        self.rec, self.size = rec, size
        self.ops: list[Op] = []
        self.words: dict[int, str] = {}
        self.lanes: dict[int, tuple[str, int]] = {}  # source local -> (value, lane)
        self.count = 0

    def op(self, kind: str, args: tuple[Operand, ...] = (), imm: tuple[int, ...] = ()) -> str:
        self.count += 1
        name = f"v{self.count}"
        self.ops.append(Op(kind, name, args, imm))
        return name

    def note(self, text: str) -> None:
        self.ops.append(Op("comment", text))

    def word(self, k: int) -> str:
        if k not in self.words:
            self.words[k] = self.op("word", imm=(k,))
        return self.words[k]

    def window(self, q: int, lo: int, hi: int) -> str:
        """A value whose bits [lo, hi) are stream bits [q + lo, q + hi) (others: junk)."""
        k, s = q // 32, q % 32
        if s == 0:
            return self.word(k)
        if s + lo >= 32:  # all in the next word (also q < 0: word 0), shifted up
            return self.op("shl", (self.word(k + 1),), (32 - s,))
        if s + hi <= 32:
            return self.op("shr", (self.word(k),), (s,))
        return self.op("shf", (self.word(k), self.word(k + 1)), (s,))

    def store(self, value: str, local: int, pair: bool) -> None:
        """Record that ``value``'s lanes hold locals ``local`` (and ``local + 1``)."""
        self.lanes[local] = (value, 0)
        if pair:
            self.lanes[local + 1] = (value, 1)

    def assemble(self, perm: np.ndarray | None) -> None:
        """The stores: destination locals ``2q, 2q + 1`` are source locals ``perm[2q]``,
        ``perm[2q + 1]``; one 32-bit store where one value already holds them in order,
        else a ``prmt`` of their lanes first."""
        for l0 in range(0, self.size, 2):
            pair = l0 + 1 < self.size
            dst = (l0, l0 + 1)[:1 + pair]
            srcs = [int(perm[d]) if perm is not None else d for d in dst]
            held = [self.lanes[s] for s in srcs]
            if pair and held[0] == (held[1][0], 0) and held[1][1] == 1:
                self.ops.append(Op("store2", "", (held[0][0],), (l0,)))
                continue
            if not pair and held[0][1] == 0:
                self.ops.append(Op("store1", "", (held[0][0],), (l0,)))
                continue
            # byte selectors: lane 0 is bytes 0-1, lane 1 bytes 2-3 (of a; 4-7: of b)
            a = held[0][0]
            b = held[-1][0]
            second = held[-1][1] * 2 + (0 if b == a else 4)
            first = held[0][1] * 2
            sel = first | (first + 1) << 4 | second << 8 | (second + 1) << 12
            self.count += 1
            name = f"v{self.count}"
            self.ops.append(Op("prmt", name, (a, b), (sel,)))
            self.ops.append(Op("store2" if pair else "store1", "", (name,), (l0,)))


def _int_finish(b: _Builder, x: str, t: LaneBits) -> str:
    kind, consts = b.rec.int_finish(t)
    return b.op(kind, (x,), consts)


def _int_lanes(b: _Builder, z: str, t: LaneBits) -> str:
    """Codes at lane bit ``t`` of ``z`` (junk elsewhere) -> the finished half2 value."""
    x = b.op("lop3", (z, b.rec.int_mask(t), b.rec.int_xor(t)), (LOP3_AND_XOR,))
    return _int_finish(b, x, t)


def _plan_int_words(b: _Builder) -> int:
    """Widths 1, 2, 4: whole 32-bit words, two lanes per lop3. Returns locals covered."""
    n = b.rec.nbits
    if 16 % n or n == 8:
        return 0
    half = 16 // n  # locals per lane
    words = b.size // (2 * half)
    for k in range(words):
        b.note(f"locals {2 * half * k}..{2 * half * (k + 1) - 1}: word {k}, two lanes at once")
        w, shift, shifted = b.word(k), 0, b.word(k)
        for i in range(half):
            if i * n - shift > b.rec.max_t():
                shift = i * n
                shifted = b.op("shr", (w,), (shift,))
            value = _int_lanes(b, shifted, i * n - shift)  # locals i, i + half
            b.lanes[2 * half * k + i] = (value, 0)
            b.lanes[2 * half * k + half + i] = (value, 1)
    return words * 2 * half


def _plan_int_pairs(b: _Builder, start: int) -> None:
    """Locals from ``start`` on, a pair at a time (any width 1..7, and 8 to float16)."""
    n, size = b.rec.nbits, b.size
    for l0 in range(start, size, 2):
        pair = l0 + 1 < size
        p0 = l0 * n
        k, q = divmod(p0, 32)
        need = 2 * n if pair else n
        b.note(f"locals {l0}, {l0 + 1}" if pair else f"local {l0}")
        if q <= b.rec.max_t() and q + need <= 32:
            a, t = b.word(k), q  # the codes stay where they are
        else:
            a, t = b.window(p0, 0, need), 0
        if pair:
            moved = b.op("shl", (a,), (16 - n,))  # the second code to lane 1
            a = b.op("prmt", (a, moved), (_PRMT_SPLICE,))
        b.store(_int_lanes(b, a, t), l0, pair)


def _lane_of(n: int, local: int) -> tuple[int, int, int] | None:
    """``(word, lane, position)`` of a code that lies wholly inside one 16-bit lane of its
    32-bit word; None for a code that straddles a lane or word boundary."""
    k, q = divmod(local * n, 32)
    lane, p = divmod(q, 16)
    return (k, lane, p) if p + n <= 16 else None


def _plan_int_matched(b: _Builder, perm: np.ndarray) -> None:
    """Widths 3, 5, 6, 7 in the :func:`pair_span` order: destination pairs by lane match.

    Where a destination pair's two codes sit at the same position ``p`` of two lanes of
    opposite halves (words ``ka``, ``kc``; the :func:`pair_span` order makes this the
    rule), one ``lop3`` (``ka``'s low lane, ``kc``'s high lane) or one ``prmt`` (``ka``'s
    high lane moved down, ``kc``'s low lane moved up) splices the two words, and the
    spliced word decodes like a whole word: one shift per ``max_t + 1`` positions, one
    ``lop3`` and one half2 operation per pair. The other pairs (codes straddling a lane
    or word boundary) are done after: one ``prmt`` gathers each code's two bytes into its
    lane from two words or splices already made (the lanes' bit positions may differ,
    as the constants are per lane), else windows move each code to bit 0 of its lane.
    """
    n, rec = b.rec.nbits, b.rec
    held: dict[str, tuple[int, ...]] = {}  # a spliced value -> the stream bytes it holds
    shifted: dict[tuple[str, int], str] = {}

    def decode_at(word: str, p: int) -> str:
        s = next((s for (w, s) in shifted if w == word and 0 <= p - s <= rec.max_t()),
                 0 if p <= rec.max_t() else None)
        if s is None:
            s = p
            shifted[word, s] = b.op("shr", (word,), (s,))
        return _int_lanes(b, shifted.get((word, s), word), p - s)

    straddling = _decode_spliced_pairs(b, perm, held, decode_at)
    words = -(-b.size * n // 32)
    for l0, a, c in straddling:
        b.note(f"locals {l0}, {l0 + 1}: codes {a}, {c}")
        gathered = _gather_bytes(b, held, words, (a * n, c * n))
        if gathered is not None:
            value = _int_lanes(b, *gathered)
        else:
            low = b.window(a * n, 0, n)  # code a at lane 0, bit 0
            high = b.window(c * n - 16, 16, 16 + n)  # code c at lane 1, bit 0
            value = _int_lanes(b, b.op("lop3", (low, high, 0x0000FFFF), (LOP3_SELECT,)), 0)
        b.lanes[a], b.lanes[c] = (value, 0), (value, 1)


def _decode_spliced_pairs(b: _Builder, perm: np.ndarray, held: dict[str, tuple[int, ...]],
                          decode_at: Callable[[str, int], str]
                          ) -> list[tuple[int, int, int]]:
    """The walk the matched plans share: each destination pair ``(l0, l0 + 1)`` whose
    codes sit at one bit position ``p`` of a low and a high lane is decoded by
    ``decode_at(word, p)`` from that word (or from two words spliced by one ``lop3`` /
    ``prmt``, recorded in ``held`` with the stream bytes they hold); returns the other
    pairs ``(l0, a, c)``, for the caller's straddling-code path."""
    n = b.rec.nbits
    spliced: dict[tuple[int, int], str] = {}
    rest = []
    for l0 in range(0, b.size, 2):
        a, c = int(perm[l0]), int(perm[l0 + 1])
        la, lc = _lane_of(n, a), _lane_of(n, c)
        if not (la and lc and la[1] != lc[1] and la[2] == lc[2]):
            rest.append((l0, a, c))
            continue
        b.note(f"locals {l0}, {l0 + 1}: codes {a}, {c}")
        ka, kc, p = la[0], lc[0], la[2]
        if ka == kc and la[1] == 0:
            word = b.word(ka)
        else:
            if (ka, kc) not in spliced:
                wa, wc = b.word(ka), b.word(kc)
                if la[1] == 0:
                    word = b.op("lop3", (wa, wc, 0x0000FFFF), (LOP3_SELECT,))
                    held[word] = (4 * ka, 4 * ka + 1, 4 * kc + 2, 4 * kc + 3)
                else:
                    word = b.op("prmt", (wa, wc), (_PRMT_SWAP_SPLICE,))
                    held[word] = (4 * ka + 2, 4 * ka + 3, 4 * kc, 4 * kc + 1)
                spliced[ka, kc] = word
            word = spliced[ka, kc]
        value = decode_at(word, p)
        b.lanes[a], b.lanes[c] = (value, 0), (value, 1)
    return rest


def _gather_bytes(b: _Builder, held: dict[str, tuple[int, ...]], words: int,
                  starts: tuple[int, int], max_t: int | None = None
                  ) -> tuple[str, tuple[int, int]] | None:
    """One ``prmt`` putting the bytes of the codes at stream bits ``starts`` into lanes 0
    and 1 (each code at bit ``start % 8`` of its lane), from two values among the spliced
    ones (``held``) and the source words; ``(value, (t0, t1))``, or None when no two
    values hold the bytes or a code's lane bit would exceed ``max_t``."""
    need: list[int | None] = []
    for start in starts:
        first, t = divmod(start, 8)
        if t > (b.rec.max_t() if max_t is None else max_t):
            return None
        second = first + 1 if t + b.rec.nbits > 8 and first + 1 < 4 * words else None
        need += [first, second]
    sources = [(name, held[name]) for name in held] + [
        (k, tuple(range(4 * k, 4 * k + 4))) for k in range(words)]
    for i, (u, ubytes) in enumerate(sources):
        for v, vbytes in sources[i:]:
            pool = ubytes + vbytes
            if all(x is None or x in pool for x in need):
                sel = sum((0 if x is None else pool.index(x)) << 4 * j
                          for j, x in enumerate(need))
                args = tuple(b.word(x) if isinstance(x, int) else x for x in (u, v))
                return b.op("prmt", args, (sel,)), (starts[0] % 8, starts[1] % 8)
    return None


def _byte_pairs(b: _Builder):
    """For int8/uint8 codes: ``(word, j, l0, pair)`` for the byte pairs ``j in (0, 2)`` of
    each 32-bit word (sign bits flipped once per word for int8), locals ``l0, l0 + 1``."""
    for k in range(-(-b.size // 4)):
        w = b.word(k)
        if b.rec.sign_flip:
            w = b.op("lop3", (w, 0xFFFFFFFF, 0x80808080), (LOP3_AND_XOR,))
        for j in (0, 2):
            l0 = 4 * k + j
            if l0 >= b.size:
                break
            pair = l0 + 1 < b.size
            b.note(f"locals {l0}, {l0 + 1}" if pair else f"local {l0}")
            yield w, j, l0, pair


def _plan_int8_f16(b: _Builder) -> None:
    """int8/uint8 -> float16: one prmt with the magic bytes per pair."""
    hi_byte = b.rec.magic >> 8
    for w, j, l0, pair in _byte_pairs(b):
        # bytes: code l0, magic, code l0 + 1, magic
        x = b.op("prmt", (w, hi_byte * 0x01010101), (0x4040 | (j + 1) << 8 | j,))
        b.store(_int_finish(b, x, 0), l0, pair)


def _plan_int8_bf16(b: _Builder) -> None:
    """int8/uint8 -> bfloat16 through float32's 2^23 magic (bfloat16's 7 bits are too few)."""
    bias = b.rec.f32_bias()
    for w, j, l0, pair in _byte_pairs(b):
        halves = []
        for i in (j, j + 1) if pair else (j,):
            # bytes: code, 0, 0, 0x4B  ->  2^23 + u as float32
            f = b.op("prmt", (w, _F32_MAGIC), (0x7540 | i,))
            halves.append(b.op("fsub", (f,), (bias,)))
        lanes = b.op("prmt", (halves[0], halves[-1]), (_PRMT_HIGH_HALVES,))
        b.store(lanes, l0, pair)


def _float_finish(b: _Builder, z: str, clean: bool) -> str:
    """Codes at lane bit ``offset`` of ``z`` -> the value in the destination format."""
    rec = b.rec
    if rec.shift == 0:
        x = z if clean else b.op("lop3", (z, rec.sign_mask | rec.mag_mask, 0), (LOP3_AND,))
    else:
        mag = b.op("shr", (z,), (rec.shift,))
        mag = b.op("lop3", (mag, rec.mag_mask, 0), (LOP3_AND,))
        x = b.op("lop3", (z, rec.sign_mask, mag), (LOP3_AND_OR,))
    r = b.op("hmul2", (x,), (rec.scale,)) if rec.scale else x
    if rec.special_max:
        over = b.op("hgt_mask", (r,), (rec.special_max,))
        r = b.op("lop3", (over, rec.special_bits, r), (LOP3_AND_OR,))
    return r


def _lane_tops(j: int) -> int:
    """``prmt`` selector putting bytes ``j`` and ``j + 1`` of a word at the tops of its two
    16-bit lanes (bytes 1 and 3), zeros below."""
    return ((j + 1) << 12) | 0x0400 | (j << 4) | 0x4


def _plan_float(b: _Builder) -> None:
    rec, n, size = b.rec, b.rec.nbits, b.size
    for l0 in range(0, size, 2):
        pair = l0 + 1 < size
        b.note(f"locals {l0}, {l0 + 1}" if pair else f"local {l0}")
        if n == 8:  # byte codes: prmt them into bytes 1 and 3, zeros below (clean lanes)
            k, j = divmod(l0, 4)
            z = b.op("prmt", (b.word(k), 0), (_lane_tops(j),))
            b.store(_float_finish(b, z, True), l0, pair)
            continue
        o = rec.offset
        a = b.window(l0 * n - o, o, o + (2 * n if pair else n))
        if pair:
            moved = b.op("shl", (a,), (16 - n,))
            a = b.op("prmt", (a, moved), (_PRMT_SPLICE,))
        b.store(_float_finish(b, a, False), l0, pair)


def _shifted(b: _Builder, cache: dict[tuple[str, int], str], word: str, d: int) -> str:
    """``word`` shifted left by ``d`` bits (right for ``d < 0``), made once per amount."""
    if d == 0:
        return word
    if (word, d) not in cache:
        cache[word, d] = b.op("shl" if d > 0 else "shr", (word,), (abs(d),))
    return cache[word, d]


def _float_at(b: _Builder, cache: dict[tuple[str, int], str], word: str, p: int) -> str:
    """Codes at bit ``p`` of both lanes of ``word`` (junk elsewhere) -> the value.

    The sign goes to bit 15 of each lane and the magnitude to ``offset - shift``: two
    32-bit shifts (none where ``p`` is already one of those places), whose bits crossing
    into the other lane fall outside the masks, then one ``lop3`` per part."""
    rec = b.rec
    sign = _shifted(b, cache, word, rec.offset - p)
    mag = _shifted(b, cache, word, rec.offset - rec.shift - p)
    mag = b.op("lop3", (mag, rec.mag_mask, 0), (LOP3_AND,))
    x = b.op("lop3", (sign, rec.sign_mask, mag), (LOP3_AND_OR,))
    r = b.op("hmul2", (x,), (rec.scale,)) if rec.scale else x
    if rec.special_max:
        over = b.op("hgt_mask", (r,), (rec.special_max,))
        r = b.op("lop3", (over, rec.special_bits, r), (LOP3_AND_OR,))
    return r


def _plan_float_matched(b: _Builder, perm: np.ndarray) -> None:
    """Small floats (3..7 bits) in the :func:`pair_span` order, like
    :func:`_plan_int_matched`: a destination pair whose codes sit at one position ``p``
    of a low and a high lane (one word, or two spliced by one ``lop3``/``prmt``) decodes
    from that word with two shifts shared by every pair at ``p`` (:func:`_float_at`); a
    pair straddling a boundary gathers its bytes with one ``prmt`` (in this order both
    codes start at one bit of their bytes), else takes the plain order's windows."""
    n, rec = b.rec.nbits, b.rec
    held: dict[str, tuple[int, ...]] = {}
    cache: dict[tuple[str, int], str] = {}
    rest = _decode_spliced_pairs(b, perm, held,
                                 lambda word, p: _float_at(b, cache, word, p))
    words = -(-b.size * n // 32)
    for l0, a, c in rest:
        b.note(f"locals {l0}, {l0 + 1}: codes {a}, {c}")
        gathered = _gather_bytes(b, held, words, (a * n, c * n), 16 - n)
        if gathered is not None and gathered[1][0] == gathered[1][1]:
            value = _float_at(b, cache, gathered[0], gathered[1][0])
        else:
            o = rec.offset
            low = b.window(a * n - o, o, 16)  # code a at the top of lane 0
            high = b.window(c * n - 16 - o, 16 + o, 32)  # code c at the top of lane 1
            z = b.op("lop3", (low, high, 0x0000FFFF), (LOP3_SELECT,))
            value = _float_finish(b, z, False)
        b.lanes[a], b.lanes[c] = (value, 0), (value, 1)


def plan_cast(src: DType, dst: DType, size: int, perm: np.ndarray | None = None
              ) -> list[Op] | None:
    """The operations casting ``size`` locals of ``src`` to ``dst``; None if not covered.

    ``perm``: destination local ``l`` takes source local ``perm[l]`` (a relayout cast);
    None is the identity.
    """
    rec = recipe(src, dst)
    if rec is None or size < 1:
        return None
    b = _Builder(rec, size)
    if rec.method == "float" and perm is not None and pair_span(src, dst, size) is not None:
        _plan_float_matched(b, perm)
        plain = _Builder(rec, size)  # kept where a permutation matches few lanes
        _plan_float(plain)
        plain.assemble(perm)
        b.assemble(perm)
        return min((b.ops, plain.ops), key=plan_work)
    if rec.method == "float":
        _plan_float(b)
    elif rec.method == "int8_f32":
        _plan_int8_bf16(b)
    elif rec.nbits == 8:
        _plan_int8_f16(b)
    elif 16 % rec.nbits and perm is not None and pair_span(src, dst, size) is not None:
        _plan_int_matched(b, perm)
        plain = _Builder(rec, size)  # kept where a permutation matches few lanes
        _plan_int_pairs(plain, 0)
        plain.assemble(perm)
        b.assemble(perm)
        return min((b.ops, plain.ops), key=plan_work)
    else:
        _plan_int_pairs(b, _plan_int_words(b))
    b.assemble(perm)
    return b.ops


#: the smallest ``__CUDA_ARCH__`` with the PTX e4m3x2 -> f16x2 conversion
HARDWARE_MIN_ARCH = 890


def plan_hardware_cast(src: DType, dst: DType, size: int, perm: np.ndarray | None = None
                       ) -> list[Op] | None:
    """The hardware-conversion plan of ``src -> dst`` (float8_e4m3 to float16), for GPUs of
    ``HARDWARE_MIN_ARCH`` and later; None for every other pair (see the module
    docstring)."""
    rec = recipe(src, dst)
    if rec is None or src != float8_e4m3 or dst != float16 or size < 1:
        return None
    b = _Builder(rec, size)
    for w, j, l0, pair in _byte_pairs(b):
        # signs of bytes j, j + 1 to bits 15 and 31 (the bytes go to bytes 1 and 3)
        signs = b.op("prmt", (w, 0), (_lane_tops(j),))
        r = b.op("cvt_e4m3x2", (w,), (j // 2,))
        b.store(b.op("lop3", (signs, 0x80008000, r), (LOP3_AND_OR,)), l0, pair)
    b.assemble(perm)
    return b.ops


def plan_work(ops: list[Op]) -> int:
    """Instructions of a plan (sources, stores and comments are not)."""
    return sum(op.kind not in ("word", "store1", "store2", "comment") for op in ops)


def pair_span(src: DType, dst: DType, size: int) -> int | None:
    """The ``span`` of :func:`lowvm.layouts.split_pairs` in which ``src`` codes decode
    straight to ``dst`` register pairs, or None when the plain order is already as good:
    1/2/4-bit integers decode whole words (no ``prmt``), the other 1..7-bit integers and
    floats mostly from two words spliced at their lane boundary (:func:`_plan_int_matched`,
    :func:`_plan_float_matched`). A weight is stored once for both activation types, so
    the span is None for both unless both conversions are covered (float7_e5m1 is not
    to float16)."""
    if recipe(src, dst) is None or dst not in _FORMAT:
        return None
    recs = [recipe(src, d) for d in _FORMAT]
    if any(r is None or r.method not in ("int", "float") for r in recs) or src.nbits == 8:
        return None
    # codes i and i + span/2 of a run start N * span/2 bits apart: 16 modulo 32, so the
    # same position of a low and a high lane (of one word for N = 1, 2, 4, else of two)
    half = next(d for d in range(1, 33) if src.nbits * d % 32 == 16)
    span = 2 * half
    return span if size % span == 0 else None


# ---------------------------------------------------------------------------------------
# the numpy model: executes the very same operations


def _lop3(a: np.ndarray, b: np.ndarray, c: np.ndarray, lut: int) -> np.ndarray:
    out = np.zeros_like(a)
    for i in range(8):
        if lut >> i & 1:
            out |= ((a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c))
    return out


def _prmt(a: np.ndarray, b: np.ndarray, sel: int) -> np.ndarray:
    both = a.astype(np.uint64) | (b.astype(np.uint64) << np.uint64(32))
    out = np.zeros_like(a)
    for n in range(4):
        byte = (both >> np.uint64(8 * ((sel >> 4 * n) & 7))) & np.uint64(0xFF)
        out |= byte.astype(np.uint32) << np.uint32(8 * n)
    return out


def _split(v: np.ndarray, dst: DType) -> np.ndarray:
    """[..., 2] float64 lane values of 32-bit patterns."""
    lanes = np.stack([v & 0xFFFF, v >> 16], axis=-1).astype(np.uint64)
    return from_codes(lanes, dst)


def _join(values: np.ndarray, dst: DType) -> np.ndarray:
    codes = to_codes(round_to(values, dst), dst).astype(np.uint32)
    return codes[..., 0] | (codes[..., 1] << np.uint32(16))


def _const_lanes(c: int, dst: DType) -> np.ndarray:
    return _split(np.array([c], np.uint32), dst)[0]


def _cvt_e4m3x2(v: np.ndarray) -> np.ndarray:
    """PTX ``cvt.rn.f16x2.e4m3x2`` of the low 16 bits of ``v``: byte 0 to the low float16
    lane, byte 1 to the high one, exact; NaN codes become the canonical NaN 0x7FFF."""
    lanes = []
    for shift in (0, 8):
        values = decode((v >> np.uint32(shift)) & np.uint32(0xFF), float8_e4m3)
        values = values.astype(np.float64)
        bits = to_codes(round_to(np.nan_to_num(values), float16), float16).astype(np.uint32)
        lanes.append(np.where(np.isnan(values), np.uint32(0x7FFF), bits))
    return lanes[0] | lanes[1] << np.uint32(16)


def simulate(ops: list[Op], words: np.ndarray, dst: DType, size: int) -> np.ndarray:
    """Run ``ops`` on the source words ``[threads, W]`` (uint32); the ``[threads, size]``
    uint16 patterns of the destination, as the emitted CUDA computes them (half2/bf162
    arithmetic is IEEE round-to-nearest-even, subnormals kept)."""
    words = np.asarray(words, dtype=np.uint32)
    out = np.zeros((words.shape[0], size), np.uint16)
    vals: dict[str, np.ndarray] = {}

    def get(x: Operand) -> np.ndarray:
        if isinstance(x, int):
            return np.full(words.shape[0], x, np.uint32)
        return vals[x]

    with np.errstate(all="ignore"):
        for op in ops:
            a = [get(x) for x in op.args]
            if op.kind == "word":
                r = words[:, op.imm[0]].copy()
            elif op.kind == "shr":
                r = a[0] >> np.uint32(op.imm[0])
            elif op.kind == "shl":
                r = a[0] << np.uint32(op.imm[0])
            elif op.kind == "shf":
                both = a[0].astype(np.uint64) | (a[1].astype(np.uint64) << np.uint64(32))
                r = (both >> np.uint64(op.imm[0])).astype(np.uint32)
            elif op.kind == "lop3":
                r = _lop3(a[0], a[1], a[2], op.imm[0])
            elif op.kind == "prmt":
                r = _prmt(a[0], a[1], op.imm[0])
            elif op.kind == "hsub2":
                r = _join(_split(a[0], dst) - _const_lanes(op.imm[0], dst), dst)
            elif op.kind == "hmul2":
                r = _join(_split(a[0], dst) * _const_lanes(op.imm[0], dst), dst)
            elif op.kind == "hfma2":
                mul, add = (_const_lanes(c, dst) for c in op.imm)
                r = _join(_split(a[0], dst) * mul + add, dst)
            elif op.kind == "hgt_mask":
                over = np.abs(_split(a[0], dst)) > _const_lanes(op.imm[0], dst)
                r = np.where(over[:, 0], 0xFFFF, 0) | np.where(over[:, 1], 0xFFFF0000, 0)
                r = r.astype(np.uint32)
            elif op.kind == "cvt_e4m3x2":
                r = _cvt_e4m3x2(a[0] >> np.uint32(16 * op.imm[0]))
            elif op.kind == "fsub":
                c = np.array([op.imm[0]], np.uint32).view(np.float32)
                r = (a[0].view(np.float32) - c).view(np.uint32)
            elif op.kind == "store2":
                out[:, op.imm[0]] = a[0] & 0xFFFF
                out[:, op.imm[0] + 1] = a[0] >> 16
                continue
            elif op.kind == "store1":
                out[:, op.imm[0]] = a[0] & 0xFFFF
                continue
            elif op.kind == "comment":
                continue
            else:
                raise ValueError(f"unknown operation {op.kind!r}")
            vals[op.out] = r.astype(np.uint32)
    return out


# ---------------------------------------------------------------------------------------
# CUDA emission


_HALF_OPS = ("hsub2", "hmul2", "hfma2")


def _c_const(c: int) -> str:
    return f"0x{c:08X}u"


class _Printer:
    """Prints operations as CUDA statements; values are ``lowvm_u32`` or the half2 type."""

    def __init__(self, cg: CudaContext, src: str, dst: str, rec: Recipe, size: int,
                 native_src: bool) -> None:
        self.cg, self.src, self.dst, self.rec = cg, src, dst, rec
        self.size, self.native_src = size, native_src
        bf = rec.dst == bfloat16
        self.h2 = "__nv_bfloat162" if bf else "__half2"
        self.raw = "__nv_bfloat162_raw" if bf else "__half2_raw"
        self.low = "__low2bfloat16" if bf else "__low2half"
        self.from_bits = "__ushort_as_bfloat16" if bf else "__ushort_as_half"
        self.names: dict[str, str] = {}
        self.is_half: dict[str, bool] = {}
        self.prefix = cg.fresh("fc")

    def name(self, v: str) -> str:
        return f"{self.prefix}_{v}"

    def u32(self, x: Operand) -> str:
        if isinstance(x, int):
            return _c_const(x)
        if self.is_half[x]:
            return f"*reinterpret_cast<const lowvm_u32*>(&{self.name(x)})"
        return self.name(x)

    def half2(self, x: Operand) -> str:
        if isinstance(x, int):
            return f"{self.h2}({self.raw}{{0x{x & 0xFFFF:04X}, 0x{x >> 16:04X}}})"
        if self.is_half[x]:
            return self.name(x)
        return f"*reinterpret_cast<const {self.h2}*>(&{self.name(x)})"

    def word(self, k: int) -> str:
        if not self.native_src:
            return f"{self.src}[{k}]"
        if 4 * k + 4 <= self.size:
            return f"*reinterpret_cast<const lowvm_u32*>(&{self.src}[{4 * k}])"
        parts = [f"((lowvm_u32)(lowvm_u8){self.src}[{i}] << {8 * (i - 4 * k)})"
                 for i in range(4 * k, self.size)]
        return " | ".join(parts)

    def emit(self, op: Op) -> None:
        cg, out = self.cg, self.name(op.out)
        a = op.args
        self.is_half[op.out] = op.kind in _HALF_OPS
        if op.kind == "comment":
            cg.line(f"// {op.out}")
        elif op.kind == "word":
            cg.line(f"const lowvm_u32 {out} = {self.word(op.imm[0])};")
        elif op.kind in ("shr", "shl"):
            sym = ">>" if op.kind == "shr" else "<<"
            cg.line(f"const lowvm_u32 {out} = {self.u32(a[0])} {sym} {op.imm[0]};")
        elif op.kind == "shf":
            cg.line(f"const lowvm_u32 {out} = __funnelshift_r({self.u32(a[0])}, "
                    f"{self.u32(a[1])}, {op.imm[0]});")
        elif op.kind == "lop3":
            cg.line(f"lowvm_u32 {out};")
            cg.line(f'asm("lop3.b32 %0, %1, %2, %3, 0x{op.imm[0]:02X};" : "=r"({out}) : '
                    + ", ".join(f'"r"({self.u32(x)})' for x in a) + ");")
        elif op.kind == "prmt":
            cg.line(f"const lowvm_u32 {out} = __byte_perm({self.u32(a[0])}, {self.u32(a[1])}, "
                    f"0x{op.imm[0]:04X});")
        elif op.kind == "hsub2":
            cg.line(f"const {self.h2} {out} = __hsub2({self.half2(a[0])}, "
                    f"{self.half2(op.imm[0])});")
        elif op.kind == "hmul2":
            cg.line(f"const {self.h2} {out} = __hmul2({self.half2(a[0])}, "
                    f"{self.half2(op.imm[0])});")
        elif op.kind == "hfma2":
            cg.line(f"const {self.h2} {out} = __hfma2({self.half2(a[0])}, "
                    f"{self.half2(op.imm[0])}, {self.half2(op.imm[1])});")
        elif op.kind == "hgt_mask":
            cg.line(f"const lowvm_u32 {out} = __hgt2_mask(__habs2({self.half2(a[0])}), "
                    f"{self.half2(op.imm[0])});")
        elif op.kind == "cvt_e4m3x2":
            # the word's halves as 16-bit registers: ptxas reads the high one in place
            half = "hi" if op.imm[0] else "lo"
            cg.line(f"lowvm_u32 {out};")
            cg.line(f'asm("{{ .reg .b16 lo, hi; mov.b32 {{lo, hi}}, %1; '
                    f'cvt.rn.f16x2.e4m3x2 %0, {half}; }}" : "=r"({out}) : '
                    f'"r"({self.u32(a[0])}));')
        elif op.kind == "fsub":
            c = float(np.array([op.imm[0]], np.uint32).view(np.float32)[0])
            cg.line(f"const lowvm_u32 {out} = __float_as_uint(__uint_as_float("
                    f"{self.u32(a[0])}) - {c!r}f);")
        elif op.kind == "store2":
            x = a[0]
            if isinstance(x, str) and self.is_half[x]:
                cg.line(f"*reinterpret_cast<{self.h2}*>(&{self.dst}[{op.imm[0]}]) = "
                        f"{self.name(x)};")
            else:
                cg.line(f"*reinterpret_cast<lowvm_u32*>(&{self.dst}[{op.imm[0]}]) = "
                        f"{self.u32(x)};")
        elif op.kind == "store1":
            x = a[0]
            if isinstance(x, str) and self.is_half[x]:
                cg.line(f"{self.dst}[{op.imm[0]}] = {self.low}({self.name(x)});")
            else:
                cg.line(f"{self.dst}[{op.imm[0]}] = {self.from_bits}("
                        f"(unsigned short)({self.u32(x)} & 0xFFFFu));")
        else:
            raise ValueError(f"unknown operation {op.kind!r}")


def emit_fast_cast(inst: Cast, cg: CudaContext) -> bool:
    """Emit ``inst`` as bit manipulation when covered (see the module docstring).

    Returns False, emitting nothing, for the casts the generic per-element loop handles.
    """
    from lowvm.codegen.context import is_packed

    src, out = inst.src, inst.out
    if src.layout is None or out.layout is None:
        return False
    perm = inst.permutation()
    if perm is None:
        return False
    size = out.layout.local_size
    ops = plan_cast(src.dtype, out.dtype, size, perm)
    if ops is None:
        return False
    rec = recipe(src.dtype, out.dtype)
    assert rec is not None
    native = not is_packed(src.dtype)
    assert native == (src.dtype in (int8, uint8))
    hardware = plan_hardware_cast(src.dtype, out.dtype, size, perm)
    cg.line(f"// {inst}  [bit-manipulation cast, two locals per 32-bit word]")
    if hardware is not None:
        cg.line(f"#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= {HARDWARE_MIN_ARCH}")
        _emit_block(_Printer(cg, cg.name(src), cg.name(out), rec, size, native), hardware)
        cg.line("#else")
    _emit_block(_Printer(cg, cg.name(src), cg.name(out), rec, size, native), ops)
    if hardware is not None:
        cg.line("#endif")
    return True


def _emit_block(printer: _Printer, ops: list[Op]) -> None:
    cg = printer.cg
    cg.line("{")
    cg.depth += 1
    for op in ops:
        printer.emit(op)
    cg.depth -= 1
    cg.line("}")
