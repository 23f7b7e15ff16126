"""Printing a fast-cast plan as CUDA: each operation through its template in
:data:`~lowvm.codegen.fast_cast.operations.OPERATIONS`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from lowvm.codegen.fast_cast.operations import OPERATIONS, Op, Operand
from lowvm.codegen.fast_cast.plan import HARDWARE_MIN_ARCH, plan_cast, plan_hardware_cast
from lowvm.dtypes import DType, bfloat16, int8, uint8

if TYPE_CHECKING:
    from lowvm.codegen.context import CudaContext
    from lowvm.instructions.data import Cast

__all__ = ["emit_fast_cast"]


def _c_const(c: int) -> str:
    return f"0x{c:08X}u"


class _Printer:
    """Prints operations as CUDA statements; values are ``lowvm_u32`` or the half2 type."""

    def __init__(self, cg: CudaContext, src: str, dst: str, dst_type: DType, size: int,
                 native_src: bool) -> None:
        self.cg, self.src, self.dst = cg, src, dst
        self.size, self.native_src = size, native_src
        bf = dst_type == bfloat16
        self.h2 = "__nv_bfloat162" if bf else "__half2"
        self.raw = "__nv_bfloat162_raw" if bf else "__half2_raw"
        self.low = "__low2bfloat16" if bf else "__low2half"
        self.from_bits = "__ushort_as_bfloat16" if bf else "__ushort_as_half"
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
        if op.kind not in OPERATIONS:
            raise ValueError(f"unknown operation {op.kind!r}")
        kind = OPERATIONS[op.kind]
        self.is_half[op.out] = kind.half
        first = op.args[0] if op.args else None
        half_arg = isinstance(first, str) and self.is_half[first]
        template = kind.cuda_half if kind.cuda_half and half_arg else kind.cuda
        for line in template.format_map(_Fields(self, op)).split("\n"):
            self.cg.line(line)


#: the template fields (see :mod:`lowvm.codegen.fast_cast.operations`), each computed
#: only when a template names it
_FIELD_VALUES: dict[str, Callable[[_Printer, Op], object]] = {
    "out": lambda p, op: p.name(op.out),
    "text": lambda p, op: op.out,
    "a0": lambda p, op: p.u32(op.args[0]),
    "a1": lambda p, op: p.u32(op.args[1]),
    "a2": lambda p, op: p.u32(op.args[2]),
    "h0": lambda p, op: p.half2(op.args[0]),
    "k0": lambda p, op: p.half2(op.imm[0]),
    "k1": lambda p, op: p.half2(op.imm[1]),
    "imm0": lambda p, op: op.imm[0],
    "imm1": lambda p, op: op.imm[1],
    "word": lambda p, op: p.word(op.imm[0]),
    "half": lambda p, op: "hi" if op.imm[0] else "lo",
    "f0": lambda p, op: repr(float(np.array([op.imm[0]], np.uint32).view(np.float32)[0])),
    "h2": lambda p, op: p.h2,
    "dst": lambda p, op: p.dst,
    "low": lambda p, op: p.low,
    "from_bits": lambda p, op: p.from_bits,
}


class _Fields(dict):
    """The fields of one operation's template, filled in as the template asks for them."""

    def __init__(self, printer: _Printer, op: Op) -> None:
        super().__init__()
        self.printer, self.op = printer, op

    def __missing__(self, key: str) -> object:
        return _FIELD_VALUES[key](self.printer, self.op)


def emit_fast_cast(inst: Cast, cg: CudaContext) -> bool:
    """Emit ``inst`` as bit manipulation when covered (see :mod:`lowvm.codegen.fast_cast`).

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
    native = not is_packed(src.dtype)
    assert native == (src.dtype in (int8, uint8))
    hardware = plan_hardware_cast(src.dtype, out.dtype, size, perm)
    cg.line(f"// {inst}  [bit-manipulation cast, two locals per 32-bit word]")
    if hardware is not None:
        cg.line(f"#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= {HARDWARE_MIN_ARCH}")
        _emit_block(_Printer(cg, cg.name(src), cg.name(out), out.dtype, size, native),
                    hardware)
        cg.line("#else")
    _emit_block(_Printer(cg, cg.name(src), cg.name(out), out.dtype, size, native), ops)
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
