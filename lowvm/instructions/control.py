"""Control instructions: the block barrier.

(Block indices are the scalar variables ``blockIdx.x/y/z``; thread indices come from
``thread_index`` in :mod:`lowvm.instructions.data`; ``static_assert`` is checked when
the program is built and leaves no instruction.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lowvm.instructions.base import Instruction, register_instruction

if TYPE_CHECKING:
    from lowvm.codegen.context import CudaContext
    from lowvm.interpreter.state import BlockState

__all__ = ["Sync"]


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class Sync(Instruction):
    """Block-wide barrier: every shared-memory write before it is visible after it."""

    mnemonic = "sync"

    def interpret(self, st: BlockState) -> None:
        st.sync()

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line("__syncthreads();  // sync")
