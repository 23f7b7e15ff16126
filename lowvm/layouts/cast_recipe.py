"""Where a 1..8-bit code sits in a 16-bit lane so that one half2/bfloat162 instruction
turns it into its float16/bfloat16 value: the constants of the bit-manipulation cast
(:class:`Recipe`, :func:`recipe`) and the :func:`~lowvm.layouts.split_pairs` order that
cast reads best (:func:`pair_span`).

Both sides of that order import it from here: the weight format
(:mod:`lowvm.kernels.weight_format`) stores codes in the :func:`pair_span` order, and the
cast (:mod:`lowvm.codegen.fast_cast`) plans its operations from a :class:`Recipe`.

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

Not covered (:func:`recipe` returns None, the generic per-element loop runs): e5m1 and
e6m1 to float16 (their largest values overflow float16 to inf, and e6m1's smallest
underflow; the shift would produce NaN patterns), every other source or destination type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lowvm.dtypes import DType, all_dtypes, bfloat16, decode, float16, round_to

__all__ = ["Recipe", "recipe", "pair_span", "LaneBits"]


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
    if dst == float16:
        return int(exact.astype(np.float16).view(np.uint16)[0])
    return int(exact.astype(np.float32).view(np.uint32)[0] >> 16)  # bfloat16's high half


@dataclass(frozen=True)
class Recipe:
    """The constants of one conversion ``src -> dst``; the cast's plans
    (:func:`lowvm.codegen.fast_cast.plan_cast`) read only these.

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


def pair_span(src: DType, dst: DType, size: int) -> int | None:
    """The ``span`` of :func:`lowvm.layouts.split_pairs` in which ``src`` codes decode
    straight to ``dst`` register pairs, or None when the plain order is already as good:
    1/2/4-bit integers decode whole words (no ``prmt``), the other 1..7-bit integers and
    floats mostly from two words spliced at their lane boundary (the matched plans of
    :mod:`lowvm.codegen.fast_cast.plan`). A weight is stored once for both activation types, so
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
