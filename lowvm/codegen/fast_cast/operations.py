"""The operations a fast-cast plan is made of, and the one table that gives each kind its
numpy meaning and its CUDA template.

:func:`simulate` runs a plan through the table's numpy side and
:mod:`lowvm.codegen.fast_cast.emit` prints it through the CUDA side, so the tests that
prove a plan exact on every code prove the kernel's code exact: a kind has one entry,
and nothing else says what it does.

Templates are ``str.format`` strings (one line per ``\\n``) over the fields the printer
fills in: ``out`` (the result's name), ``a0``..``a2`` (the arguments as 32-bit words),
``h0`` (argument 0 as the half2 type), ``k0``/``k1`` (``imm`` as half2 constants),
``imm0``/``imm1`` (``imm`` as integers), ``word`` (source word ``imm0``), ``half``
(``lo``/``hi`` by ``imm0``), ``f0`` (``imm0`` as a float32 literal), ``text`` (a
comment's text), ``h2`` (the half2 type), ``dst`` (the destination array), ``low`` and
``from_bits`` (the destination type's low-lane and from-bits intrinsics).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lowvm.dtypes import DType, decode, float8_e4m3, float16, round_to
from lowvm.instructions.values import from_codes, to_codes

__all__ = ["Operand", "Op", "OpKind", "OPERATIONS", "simulate"]

Operand = str | int  # a value's name, or a 32-bit constant


@dataclass(frozen=True)
class Op:
    """One operation on 32-bit values (each holds two 16-bit lanes where that matters):
    a ``kind`` of :data:`OPERATIONS`, the name of its result, its arguments and its
    immediates (what each kind takes is in its table entry)."""

    kind: str
    out: str = ""
    args: tuple[Operand, ...] = ()
    imm: tuple[int, ...] = ()


@dataclass
class _Machine:
    """What the numpy side of an operation reads and writes besides its arguments."""

    words: np.ndarray  # [threads, W] uint32: the source bit stream
    dst: DType  # float16 or bfloat16
    out: np.ndarray  # [threads, size] uint16: the destination patterns


#: numpy meaning: (machine, argument values, immediates) -> the uint32 result, or None
Meaning = Callable[[_Machine, list[np.ndarray], tuple[int, ...]], "np.ndarray | None"]


@dataclass(frozen=True)
class OpKind:
    """One kind of operation: what it computes and what it prints as."""

    #: arguments and immediates, in words
    takes: str
    numpy: Meaning
    cuda: str
    #: the template where argument 0 is a half2 value ("": ``cuda``)
    cuda_half: str = ""
    #: the result is a half2/bfloat162 value (else a 32-bit word)
    half: bool = False
    #: a machine instruction (:func:`~lowvm.codegen.fast_cast.plan.plan_work` counts it)
    work: bool = True


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


def _shf(lo: np.ndarray, hi: np.ndarray, s: int) -> np.ndarray:
    both = lo.astype(np.uint64) | (hi.astype(np.uint64) << np.uint64(32))
    return (both >> np.uint64(s)).astype(np.uint32)


def _split(v: np.ndarray, dst: DType) -> np.ndarray:
    """[..., 2] float64 lane values of 32-bit patterns."""
    lanes = np.stack([v & 0xFFFF, v >> 16], axis=-1).astype(np.uint64)
    return from_codes(lanes, dst)


def _join(values: np.ndarray, dst: DType) -> np.ndarray:
    codes = to_codes(round_to(values, dst), dst).astype(np.uint32)
    return codes[..., 0] | (codes[..., 1] << np.uint32(16))


def _const_lanes(c: int, dst: DType) -> np.ndarray:
    return _split(np.array([c], np.uint32), dst)[0]


def _half2(m: _Machine, x: np.ndarray, fn: Callable[[np.ndarray], np.ndarray]
           ) -> np.ndarray:
    """``fn`` on the lane values of ``x``, rounded back to the destination type."""
    return _join(fn(_split(x, m.dst)), m.dst)


def _hgt_mask(m: _Machine, x: np.ndarray, limit: int) -> np.ndarray:
    over = np.abs(_split(x, m.dst)) > _const_lanes(limit, m.dst)
    return (np.where(over[:, 0], 0xFFFF, 0) | np.where(over[:, 1], 0xFFFF0000, 0)
            ).astype(np.uint32)


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


def _fsub(x: np.ndarray, pattern: int) -> np.ndarray:
    c = np.array([pattern], np.uint32).view(np.float32)
    return (x.view(np.float32) - c).view(np.uint32)


def _store(m: _Machine, x: np.ndarray, local: int, pair: bool) -> None:
    m.out[:, local] = x & 0xFFFF
    if pair:
        m.out[:, local + 1] = x >> 16


#: every kind of operation: its numpy meaning and its CUDA template
OPERATIONS: dict[str, OpKind] = {
    "word": OpKind(
        "imm: k, word k of the source bit stream",
        lambda m, a, imm: m.words[:, imm[0]].copy(),
        "const lowvm_u32 {out} = {word};", work=False),
    "shr": OpKind(
        "a; imm: s",
        lambda m, a, imm: a[0] >> np.uint32(imm[0]),
        "const lowvm_u32 {out} = {a0} >> {imm0};"),
    "shl": OpKind(
        "a; imm: s",
        lambda m, a, imm: a[0] << np.uint32(imm[0]),
        "const lowvm_u32 {out} = {a0} << {imm0};"),
    "shf": OpKind(
        "lo, hi; imm: s (funnel shift right)",
        lambda m, a, imm: _shf(a[0], a[1], imm[0]),
        "const lowvm_u32 {out} = __funnelshift_r({a0}, {a1}, {imm0});"),
    "lop3": OpKind(
        "a, b, c; imm: truth table",
        lambda m, a, imm: _lop3(a[0], a[1], a[2], imm[0]),
        'lowvm_u32 {out};\n'
        'asm("lop3.b32 %0, %1, %2, %3, 0x{imm0:02X};" : "=r"({out}) : "r"({a0}), '
        '"r"({a1}), "r"({a2}));'),
    "prmt": OpKind(
        "a, b; imm: byte selector",
        lambda m, a, imm: _prmt(a[0], a[1], imm[0]),
        "const lowvm_u32 {out} = __byte_perm({a0}, {a1}, 0x{imm0:04X});"),
    "hsub2": OpKind(
        "a; imm: constant lanes",
        lambda m, a, imm: _half2(m, a[0], lambda x: x - _const_lanes(imm[0], m.dst)),
        "const {h2} {out} = __hsub2({h0}, {k0});", half=True),
    "hmul2": OpKind(
        "a; imm: constant lanes",
        lambda m, a, imm: _half2(m, a[0], lambda x: x * _const_lanes(imm[0], m.dst)),
        "const {h2} {out} = __hmul2({h0}, {k0});", half=True),
    "hfma2": OpKind(
        "a; imm: multiplier lanes, addend lanes",
        lambda m, a, imm: _half2(m, a[0], lambda x: x * _const_lanes(imm[0], m.dst)
                                 + _const_lanes(imm[1], m.dst)),
        "const {h2} {out} = __hfma2({h0}, {k0}, {k1});", half=True),
    "hgt_mask": OpKind(
        "a; imm: limit lanes; 0xFFFF per lane where |a| > limit",
        lambda m, a, imm: _hgt_mask(m, a[0], imm[0]),
        "const lowvm_u32 {out} = __hgt2_mask(__habs2({h0}), {k0});"),
    "cvt_e4m3x2": OpKind(
        "a; imm: h; the float16 pair of the two e4m3 bytes in half h of a, NaN as 0x7FFF",
        lambda m, a, imm: _cvt_e4m3x2(a[0] >> np.uint32(16 * imm[0])),
        # the word's halves as 16-bit registers: ptxas reads the high one in place
        'lowvm_u32 {out};\n'
        'asm("{{ .reg .b16 lo, hi; mov.b32 {{lo, hi}}, %1; cvt.rn.f16x2.e4m3x2 %0, '
        '{half}; }}" : "=r"({out}) : "r"({a0}));'),
    "fsub": OpKind(
        "a; imm: a float32 pattern; a - imm as float32",
        lambda m, a, imm: _fsub(a[0], imm[0]),
        "const lowvm_u32 {out} = __float_as_uint(__uint_as_float({a0}) - {f0}f);"),
    "store2": OpKind(
        "a; imm: l; both lanes to locals l, l + 1",
        lambda m, a, imm: _store(m, a[0], imm[0], True),
        "*reinterpret_cast<lowvm_u32*>(&{dst}[{imm0}]) = {a0};",
        cuda_half="*reinterpret_cast<{h2}*>(&{dst}[{imm0}]) = {h0};", work=False),
    "store1": OpKind(
        "a; imm: l; the low lane to local l",
        lambda m, a, imm: _store(m, a[0], imm[0], False),
        "{dst}[{imm0}] = {from_bits}((unsigned short)({a0} & 0xFFFFu));",
        cuda_half="{dst}[{imm0}] = {low}({h0});", work=False),
    "comment": OpKind(
        "out: the text",
        lambda m, a, imm: None,
        "// {text}", work=False),
}


def simulate(ops: list[Op], words: np.ndarray, dst: DType, size: int) -> np.ndarray:
    """Run ``ops`` on the source words ``[threads, W]`` (uint32); the ``[threads, size]``
    uint16 patterns of the destination, as the emitted CUDA computes them (half2/bf162
    arithmetic is IEEE round-to-nearest-even, subnormals kept)."""
    words = np.asarray(words, dtype=np.uint32)
    machine = _Machine(words, dst, np.zeros((words.shape[0], size), np.uint16))
    vals: dict[str, np.ndarray] = {}

    def get(x: Operand) -> np.ndarray:
        if isinstance(x, int):
            return np.full(words.shape[0], x, np.uint32)
        return vals[x]

    with np.errstate(all="ignore"):
        for op in ops:
            if op.kind not in OPERATIONS:
                raise ValueError(f"unknown operation {op.kind!r}")
            r = OPERATIONS[op.kind].numpy(machine, [get(x) for x in op.args], op.imm)
            if r is not None:
                vals[op.out] = r.astype(np.uint32)
    return machine.out
