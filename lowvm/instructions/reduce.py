"""Reductions of a register tile over one dimension (sum, max, min).

The result's layout is ``layouts.reduce(source layout, [dim])``: the threads that held
the reduced elements end up holding replicas of the result (on the GPU: a per-thread
reduction, then warp shuffles, then shared memory across warps). Sums of floats are
accumulated exactly and rounded once to the result type.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lowvm.instructions.base import Instruction, register_instruction
from lowvm.interpreter.values import quantize
from lowvm.ir import RegisterTensor
from lowvm.layouts import reduce as reduce_layout

if TYPE_CHECKING:
    from lowvm.codegen.context import CudaContext
    from lowvm.interpreter.state import BlockState

__all__ = ["Reduce", "REDUCE_OPS"]

REDUCE_OPS = {"sum": np.sum, "max": np.max, "min": np.min}


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class Reduce(Instruction):
    """``out = op(src, axis=dim)``; ``keepdims`` keeps the dim with size 1."""

    mnemonic = "reduce"
    out: RegisterTensor
    src: RegisterTensor
    op: str
    dim: int
    keepdims: bool = False

    def check(self) -> None:
        if self.op not in REDUCE_OPS:
            raise self.error(f"unknown reduction {self.op!r}; accepted: {sorted(REDUCE_OPS)}")
        if not 0 <= self.dim < self.src.rank:
            raise self.error(f"dim {self.dim} is outside the rank-{self.src.rank} tile")
        if self.src.layout is None or self.out.layout is None:
            return  # checked again once layout inference has assigned them
        expected = reduce_layout(self.src.layout, [self.dim], keepdims=self.keepdims)
        if self.out.layout != expected:
            raise self.error(f"result layout must be {expected}")

    def interpret(self, st: BlockState) -> None:
        logical = st.to_logical(self.src)
        result = REDUCE_OPS[self.op](logical, axis=self.dim, keepdims=self.keepdims)
        result = quantize(np.asarray(result), self.out.dtype, saturate=False)
        st.set_logical(self.out, result, inst=self)

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line(f"// {self}  (through shared scratch)")
        src, out = self.src, self.out
        ctype = cg.compute_type(src.dtype)
        cg.scratch(4 * src.layout.size)
        combine = {"sum": "acc + v", "max": "max(acc, v)", "min": "min(acc, v)"}[self.op]
        if src.dtype.is_float:
            combine = {"sum": "acc + v", "max": "fmaxf(acc, v)", "min": "fminf(acc, v)"}[self.op]
        with cg.block(""):
            cg.line(f"{ctype}* sc = reinterpret_cast<{ctype}*>(lowvm_smem + lowvm_scratch);")
            cg.line("__syncthreads();")
            cg.line("#pragma unroll")
            with cg.block(f"for (int l = 0; l < {src.layout.local_size}; ++l)"):
                flat = cg.flat_index(src.layout, src.shape)
                cg.line(f"sc[{flat}] = {cg.get(src, 'l')};")
            cg.line("__syncthreads();")
            cg.line("#pragma unroll")
            with cg.block(f"for (int l = 0; l < {out.layout.local_size}; ++l)"):
                index = []
                for d in range(src.rank):
                    if d == self.dim:
                        index.append("j")
                    else:
                        od = d if self.keepdims or d < self.dim else d - 1
                        index.append(f"({cg.index(out.layout, od)})")
                flat = " + ".join(f"{i} * {cg.row_major_stride(src.shape, d)}"
                                  for d, i in enumerate(index))
                cg.line(f"{ctype} acc = sc[{flat.replace('j', '0')}];")
                with cg.block(f"for (int j = 1; j < {src.shape[self.dim]}; ++j)"):
                    cg.line(f"{ctype} v = sc[{flat}];")
                    cg.line(f"acc = {combine};")
                cg.line(cg.set(out, "l", "acc", src.dtype.is_float))
            cg.line("__syncthreads();")

