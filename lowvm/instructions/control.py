"""Control instructions: the block barrier, the wait for the grid launched before.

(Block indices are the scalar variables ``blockIdx.x/y/z``; thread indices come from
``thread_index`` in :mod:`lowvm.instructions.data`; ``static_assert`` is checked when
the program is built and leaves no instruction.)
"""

from __future__ import annotations

from dataclasses import dataclass

from lowvm.instructions.base import BlockState, Instruction, register_instruction

__all__ = ["Sync", "WaitPriorGrid"]


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class Sync(Instruction):
    """Block-wide barrier: every shared-memory write before it is visible after it."""

    mnemonic = "sync"

    def interpret(self, st: BlockState) -> None:
        st.sync()


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class WaitPriorGrid(Instruction):
    """Wait until the grid launched before this one on the stream has finished and its
    writes are visible.

    What comes before it may not read anything that grid writes, nor write anything it
    reads. In exchange, a launch that allows overlap (``CompiledProgram(...,
    overlap=True)``, sm_90 and newer: programmatic dependent launch) starts while that
    grid is still finishing, so the work before the wait (loads of weights no kernel
    writes, address set-up) hides the launch and the first DRAM round trip. Without such
    a launch, and before sm_90, it returns at once. The interpreter runs grids in order:
    nothing to wait for.
    """

    mnemonic = "wait_prior_grid"

    def interpret(self, st: BlockState) -> None:
        pass
