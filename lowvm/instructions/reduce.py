"""Reductions of a register tile over one dimension (sum, max, min).

The result's layout is ``layouts.reduce(source layout, [dim])``: the threads that held
the reduced elements end up holding replicas of the result (how the GPU combines them:
:mod:`lowvm.codegen.emitters.reduce`). Sums of floats are accumulated exactly and
rounded once to the result type in the interpreter; the GPU adds in float32 (the order
differs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lowvm.instructions.base import BlockState, Instruction, register_instruction
from lowvm.instructions.values import quantize
from lowvm.ir import RegisterTensor
from lowvm.layouts import reduce as reduce_layout

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
