"""Tile matrix multiply with accumulation: ``out = a @ b + c``.

f16/bf16 operands accumulate in float32, int8/uint8 in int32 (the tensor cores'
types). The interpreter forms the exact products and sums in float64 (int64) and rounds
once to the accumulator type; the GPU's fp32 accumulation order differs by at most
float32 rounding, which the GPU tests allow for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lowvm.dtypes import bfloat16, float16, float32, int8, int32, uint8
from lowvm.instructions.base import Instruction, register_instruction
from lowvm.interpreter.values import quantize
from lowvm.ir import RegisterTensor

if TYPE_CHECKING:
    from lowvm.codegen.context import CudaContext
    from lowvm.interpreter.state import BlockState

__all__ = ["Dot", "DOT_TYPES"]

#: operand type -> accumulator type
DOT_TYPES = {float16: float32, bfloat16: float32, int8: int32, uint8: int32}


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class Dot(Instruction):
    """``out[M, N] = a[M, K] @ b[K, N] + c[M, N]``."""

    mnemonic = "dot"
    out: RegisterTensor
    a: RegisterTensor
    b: RegisterTensor
    c: RegisterTensor

    def check(self) -> None:
        a, b, c = self.a, self.b, self.c
        if a.rank != 2 or b.rank != 2 or c.rank != 2:
            raise self.error("a, b and c must be 2-D tiles")
        (m, k), (k2, n) = a.shape, b.shape
        if k != k2 or c.shape != (m, n):
            raise self.error(
                f"shape mismatch: a {list(a.shape)} @ b {list(b.shape)} + c "
                f"{list(c.shape)}; need a [M, K], b [K, N], c [M, N]"
            )
        if a.dtype != b.dtype or a.dtype not in DOT_TYPES:
            raise self.error(
                f"operand types {a.dtype.name} and {b.dtype.name} are not supported; "
                f"accepted: both {', '.join(t.name for t in DOT_TYPES)}"
            )
        acc = DOT_TYPES[a.dtype]
        if c.dtype != acc or self.out.dtype != acc:
            raise self.error(
                f"{a.dtype.name} operands accumulate in {acc.name}; c is {c.dtype.name}"
            )
        known = self.out.layout is not None and c.layout is not None
        if known and self.out.layout != c.layout:
            raise self.error("the result has the layout of c")

    def interpret(self, st: BlockState) -> None:
        a = st.to_logical(self.a)
        b = st.to_logical(self.b)
        c = st.to_logical(self.c)
        st.set_logical(self.out, quantize(a @ b + c, self.out.dtype, saturate=False), inst=self)

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line(f"// {self}  (through shared scratch)")
        (m, k), n = self.a.shape, self.b.shape[1]
        ctype = cg.compute_type(self.a.dtype)
        cg.scratch(4 * (m * k + k * n))
        with cg.block(""):
            cg.line(f"{ctype}* sa = reinterpret_cast<{ctype}*>(lowvm_smem + lowvm_scratch);")
            cg.line(f"{ctype}* sb = sa + {m * k};")
            cg.line("__syncthreads();")
            for tile, buf in ((self.a, "sa"), (self.b, "sb")):
                cg.line("#pragma unroll")
                with cg.block(f"for (int l = 0; l < {tile.layout.local_size}; ++l)"):
                    flat = cg.flat_index(tile.layout, tile.shape)
                    cg.line(f"{buf}[{flat}] = {cg.get(tile, 'l')};")
            cg.line("__syncthreads();")
            cg.line("#pragma unroll")
            with cg.block(f"for (int l = 0; l < {self.c.layout.local_size}; ++l)"):
                lay = self.c.layout
                cg.line(f"const int i = {cg.index(lay, 0)};")
                cg.line(f"const int j = {cg.index(lay, 1)};")
                acc_t = "float" if self.c.dtype.is_float else "int"
                cg.line(f"{acc_t} acc = {cg.get(self.c, 'l')};")
                with cg.block(f"for (int kk = 0; kk < {k}; ++kk)"):
                    if acc_t == "float":
                        cg.line(f"acc = fmaf(sa[i * {k} + kk], sb[kk * {n} + j], acc);")
                    else:
                        cg.line(f"acc += sa[i * {k} + kk] * sb[kk * {n} + j];")
                cg.line(cg.set(self.out, "l", "acc", acc_t == "float"))
            cg.line("__syncthreads();")
