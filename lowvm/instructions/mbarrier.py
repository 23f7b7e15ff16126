"""mbarriers: shared-memory barriers that count thread arrivals and copied bytes.

Why: a block barrier (``sync``) makes every thread wait for every other. A pipeline
needs finer order: the consumers of stage ``s`` wait only until *its* bytes have landed,
and the producer refills ``s`` only after the consumers released it. An mbarrier does
both. Each barrier completes a *phase* when it has received ``arrivals`` arrivals and
every transaction byte announced to it (``mbarrier_expect_tx``) has been delivered by
the copies that signal it (``copy_tma``, ``copy_bulk``); it then starts the next phase.
A wait names the parity (0 or 1) of the phase it waits for, as the hardware's does.

Exact meaning (the interpreter's): an arrival counts one per arriving thread;
``mbarrier_arrive`` is every thread of the block arriving once, ``mbarrier_expect_tx``
one thread arriving once and announcing ``nbytes``. A copy's bytes count at its issue
(the interpreter performs copies at once) towards the phase in progress then; the
announced and the delivered bytes may come in either order. ``mbarrier_wait`` returns
once the phase in progress has the other parity than the one asked for (the phase of
that parity completed; before any phase completed, a wait for parity 1 returns at once,
as the hardware's); a wait that no instruction can satisfy any more is a deadlock,
reported with the barrier's counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowvm.expr import Expr
from lowvm.instructions.base import BlockState, Instruction, register_instruction
from lowvm.ir import BarrierTensor

__all__ = ["AllocBarriers", "MbarrierArrive", "MbarrierExpectTx", "MbarrierWait",
           "MAX_ARRIVALS", "MAX_TX_BYTES"]

#: the largest arrival count an mbarrier phase can wait for (PTX: 2^20 - 1)
MAX_ARRIVALS = (1 << 20) - 1
#: the largest number of transaction bytes one phase may expect (PTX: 2^20 - 1)
MAX_TX_BYTES = (1 << 20) - 1


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class AllocBarriers(Instruction):
    """Allocate ``out.count`` mbarriers in shared memory and initialise each to wait for
    ``out.arrivals`` arrivals; the block synchronises after, so every thread sees them."""

    mnemonic = "mbarriers"
    out: BarrierTensor

    def check(self) -> None:
        if not isinstance(self.out.count, int) or self.out.count < 1:
            raise self.error(f"count must be a positive integer, got {self.out.count!r}")
        arrivals = self.out.arrivals
        if not isinstance(arrivals, int) or isinstance(arrivals, bool) or not (
                1 <= arrivals <= MAX_ARRIVALS):
            raise self.error(f"arrivals must be an integer in 1..{MAX_ARRIVALS} (threads "
                             f"that arrive per phase), got {arrivals!r}")

    def interpret(self, st: BlockState) -> None:
        st.alloc_barriers(self.out)

    def format_args(self) -> str:
        return f"count={self.out.count}, arrivals={self.out.arrivals}"


@dataclass(frozen=True, eq=False, kw_only=True)
class _OnBarrier(Instruction):
    """An instruction on barrier ``index`` of ``barriers``."""

    barriers: BarrierTensor
    index: Expr

    def format_args(self) -> str:
        return f"%{self.barriers.name}[{self.index}]"


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class MbarrierArrive(_OnBarrier):
    """Every thread of the block arrives on the barrier once (after its earlier shared
    reads and writes: what it did before is ordered before any wait that sees the phase
    complete)."""

    mnemonic = "mbarrier_arrive"

    def interpret(self, st: BlockState) -> None:
        st.barrier(self.barriers, self.index, self).arrive(st.role_threads)


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class MbarrierExpectTx(_OnBarrier):
    """One thread arrives on the barrier once and announces ``nbytes`` transaction bytes
    the phase must also receive (the bytes of the copies that signal it)."""

    mnemonic = "mbarrier_expect_tx"
    nbytes: int

    def check(self) -> None:
        if (not isinstance(self.nbytes, int) or isinstance(self.nbytes, bool)
                or not 0 <= self.nbytes <= MAX_TX_BYTES):
            raise self.error(f"nbytes must be an integer in 0..{MAX_TX_BYTES}, got "
                             f"{self.nbytes!r}")

    def interpret(self, st: BlockState) -> None:
        barrier = st.barrier(self.barriers, self.index, self)
        barrier.expect(self.nbytes)
        barrier.arrive(1)

    def format_args(self) -> str:
        return f"{super().format_args()}, nbytes={self.nbytes}"


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class MbarrierWait(_OnBarrier):
    """Every thread waits until the barrier's phase of parity ``parity`` (0 or 1) has
    completed, i.e. the phase in progress has the other parity: what was ordered before
    that completion (the threads' work before their arrivals, the bytes of the copies
    that signalled it) is visible after."""

    mnemonic = "mbarrier_wait"
    parity: Expr

    def interpret(self, st: BlockState) -> None:
        st.wait_barrier(self.barriers, self.index, self.parity, self)

    def format_args(self) -> str:
        return f"{super().format_args()}, parity={self.parity}"
