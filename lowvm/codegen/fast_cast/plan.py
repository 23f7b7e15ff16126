"""Plans: the straight-line list of :class:`~lowvm.codegen.fast_cast.operations.Op` that
casts a thread's 1..8-bit codes to float16/bfloat16, two locals per 32-bit word, built
from one conversion's constants (:class:`~lowvm.layouts.cast_recipe.Recipe`).

Locals ``2j`` and ``2j + 1`` become the low and high halves of one 32-bit word (``__half2``
order), stored with one 32-bit store into the destination array (declared
``__align__(16)``). An odd last local uses the low half only.

Integer codes reach the lanes with shifts, funnel shifts (``__funnelshift_r`` where a
pair straddles two 32-bit words, including widths 3, 5, 6, 7) and ``prmt``; positions
are compile-time constants. Widths 1, 2, 4 use whole words: ``(w >> s) & (mask << t)``
applied to both halves of a word at once picks locals ``i`` and ``i + 16/N``. Every
result lane is recorded against its source local, and the destination's register pairs
are then assembled (:meth:`_Builder.assemble`): one 32-bit store where one value
already holds the pair in order, else a ``prmt`` whose selector picks the two lanes. In
the plain order the whole-word casts need one ``prmt`` per pair; stored in the
:func:`~lowvm.layouts.split_pairs` order (:func:`~lowvm.layouts.cast_recipe.pair_span`)
they need none, and a relayout cast (destination local ``l`` = source local
``perm[l]``) costs nothing more than its permutation. Widths 3, 5, 6, 7 in that order:
codes ``i`` and ``i + span/2`` start ``16 (mod 32)`` bits apart, so most pairs sit at
one position of a low and a high lane of two words; one ``lop3`` (or ``prmt``) splices
the two words and the spliced word decodes like a whole one (:func:`_plan_int_matched`);
a pair that straddles a lane or word boundary gathers its bytes with one ``prmt`` (its
lanes' bit positions may differ: half2 constants are per lane), else takes windows. The
plain order's plan is kept where it is shorter. int8/uint8 to float16 is one ``prmt``
with the magic bytes (``0x64``) per pair, after one XOR per word for int8.

Small floats of 3..7 bits are stored in the :func:`~lowvm.layouts.cast_recipe.pair_span`
order too: a pair's two codes then sit at one bit ``p`` of a low and a high lane of one
word (or two spliced), and two shifts of that word, shared by every pair at ``p``, bring
the signs to bit 15 and the magnitudes to their place (:func:`_plan_float_matched`); in
the plain order each pair first needs its own window, shift and ``prmt`` to put its
codes 16 bits apart.

**Hardware conversion** (sm_89 and later): float8_e4m3 to float16 is one PTX
``cvt.rn.f16x2.e4m3x2`` per pair of codes (two bytes of a word), plus one ``prmt`` and one
``lop3`` that put each code's sign bit on its lane: the instruction returns NaN codes as
the unsigned canonical NaN, and lowvm keeps a NaN's sign. :func:`plan_hardware_cast`
builds that plan; the kernel runs it under ``__CUDA_ARCH__ >= 890`` and the bit
manipulation above on older GPUs (sm_90 main loop of a 4096 x 4096 decode GEMM: 271 ->
139 instructions per K step, against int8's 124).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from lowvm.codegen.fast_cast.operations import OPERATIONS, Op, Operand
from lowvm.dtypes import DType, float8_e4m3, float16
from lowvm.layouts.cast_recipe import LaneBits, Recipe, pair_span, recipe

__all__ = ["plan_cast", "plan_hardware_cast", "plan_work", "HARDWARE_MIN_ARCH",
           "LOP3_AND_XOR", "LOP3_AND_OR", "LOP3_AND", "LOP3_SELECT"]

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


def _scale_and_specials(b: _Builder, x: str) -> str:
    """A placed small-float pattern -> the value: the multiply by the bias difference,
    then the destination's exponent bits where the source code is inf/NaN."""
    rec = b.rec
    r = b.op("hmul2", (x,), (rec.scale,)) if rec.scale else x
    if rec.special_max:
        over = b.op("hgt_mask", (r,), (rec.special_max,))
        r = b.op("lop3", (over, rec.special_bits, r), (LOP3_AND_OR,))
    return r


def _float_finish(b: _Builder, z: str, clean: bool) -> str:
    """Codes at lane bit ``offset`` of ``z`` -> the value in the destination format."""
    rec = b.rec
    if rec.shift == 0:
        x = z if clean else b.op("lop3", (z, rec.sign_mask | rec.mag_mask, 0), (LOP3_AND,))
    else:
        mag = b.op("shr", (z,), (rec.shift,))
        mag = b.op("lop3", (mag, rec.mag_mask, 0), (LOP3_AND,))
        x = b.op("lop3", (z, rec.sign_mask, mag), (LOP3_AND_OR,))
    return _scale_and_specials(b, x)


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
    return _scale_and_specials(b, x)


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
    return sum(OPERATIONS[op.kind].work for op in ops)
