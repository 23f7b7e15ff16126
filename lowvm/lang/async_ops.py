"""The VM functions of Hopper's asynchronous machinery: mbarriers and the copy engine.

A pipeline written with them (see docs/language.md, "Tensor copies and mbarriers"):

    bars = vm.mbarriers(stages)                   # one "full" barrier per stage
    vm.mbarrier_expect_tx(bars[s], nbytes)        # one thread announces the stage's bytes
    vm.copy_tma(ring, gx, [k, row0], bars[s], dst_offsets=[s, 0, 0])
    vm.mbarrier_wait(bars[s], parity)             # the stage has landed
"""

from __future__ import annotations

from collections.abc import Sequence

from lowvm.expr import ExprLike, as_expr
from lowvm.instructions import (
    AllocBarriers,
    CopyBulk,
    CopyTma,
    MbarrierArrive,
    MbarrierExpectTx,
    MbarrierWait,
    StoreTma,
    StoreTmaWait,
)
from lowvm.ir import (
    MBARRIER,
    BarrierRef,
    BarrierTensor,
    GlobalTensor,
    ProgramError,
    SharedTensor,
)
from lowvm.lang.builder import current, user_location
from lowvm.lang.ops import _offsets, _static_shape

__all__ = ["mbarriers", "mbarrier_arrive", "mbarrier_expect_tx", "mbarrier_wait",
           "copy_tma", "copy_bulk", "store_tma", "store_tma_wait"]


def _fail(message: str) -> ProgramError:
    return ProgramError(message, user_location())


def _barrier(barrier: object, what: str) -> BarrierRef:
    if not isinstance(barrier, BarrierRef):
        raise _fail(f"{what}: barrier must be one barrier of vm.mbarriers (bars[i]), got "
                    f"{type(barrier).__name__}")
    return barrier


def mbarriers(count: int, arrivals: int = 1) -> BarrierTensor:
    """``count`` mbarriers in shared memory, each completing a phase after ``arrivals``
    thread arrivals and the transaction bytes announced to it. Index them as
    ``bars[i]``. ``arrivals=1`` suits a barrier that ``mbarrier_expect_tx`` alone
    arrives on (a stage filled by copies); a barrier every thread of a block of T
    threads releases with ``mbarrier_arrive`` needs ``arrivals=T``."""
    b = current()
    if len(b.stack) != 1:
        raise _fail("mbarriers: allocate barriers at the top level of the program, not "
                    "inside a vm.range loop or a vm.if_ branch (they live for the whole "
                    "block)")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise _fail(f"mbarriers: count must be a positive integer, got {count!r}")
    out = BarrierTensor(b.fresh("bar"), MBARRIER, count, arrivals)
    b.emit(AllocBarriers(out=out, loc=user_location()))
    b.take_shared(out.nbytes, "mbarriers")
    return out


def mbarrier_arrive(barrier: BarrierRef) -> None:
    """Every thread arrives once on ``barrier`` (``bars[i]``), after its earlier work:
    how consumers release a stage they have read."""
    ref = _barrier(barrier, "mbarrier_arrive")
    current().emit(MbarrierArrive(barriers=ref.barriers, index=ref.index,
                                  loc=user_location()))


def mbarrier_expect_tx(barrier: BarrierRef, nbytes: int) -> None:
    """One thread arrives once on ``barrier`` and announces ``nbytes`` transaction bytes
    (the bytes of the copies that signal the phase)."""
    ref = _barrier(barrier, "mbarrier_expect_tx")
    current().emit(MbarrierExpectTx(barriers=ref.barriers, index=ref.index, nbytes=nbytes,
                                    loc=user_location()))


def mbarrier_wait(barrier: BarrierRef, parity: ExprLike) -> None:
    """Wait until ``barrier``'s phase of parity ``parity`` (0 or 1, a runtime value: a
    ring's lap count modulo 2) has completed."""
    ref = _barrier(barrier, "mbarrier_wait")
    current().emit(MbarrierWait(barriers=ref.barriers, index=ref.index,
                                parity=as_expr(parity), loc=user_location()))


def copy_tma(dst: SharedTensor, src: GlobalTensor, offsets: Sequence[ExprLike] | None,
             barrier: BarrierRef, dst_offsets: Sequence[ExprLike] | None = None) -> None:
    """Tensor copy of the box at ``offsets`` of ``src`` into ``dst`` (its trailing dims
    are the box, one per dim of ``src``; ``dst_offsets`` select its leading, stage dims),
    signalling ``barrier`` with the box's bytes. Outside ``src`` reads as 0. ``dst``
    must be laid out as the copy writes it: :func:`lowvm.layouts.tma_layout`."""
    if not isinstance(dst, SharedTensor) or not isinstance(src, GlobalTensor):
        raise _fail(f"copy_tma: expects (shared tile, global tensor, offsets, barrier), got "
                    f"({type(dst).__name__}, {type(src).__name__}, ...)")
    ref = _barrier(barrier, "copy_tma")
    current().emit(CopyTma(
        dst=dst, src=src, offsets=_offsets(offsets, src.rank, "copy_tma"),
        barriers=ref.barriers, index=ref.index,
        dst_offsets=None if dst_offsets is None else _offsets(dst_offsets, dst.rank,
                                                              "copy_tma dst_offsets"),
        loc=user_location()))


def copy_bulk(dst: SharedTensor, src: GlobalTensor, offsets: Sequence[ExprLike] | None,
              shape: Sequence[int], barrier: BarrierRef,
              dst_offsets: Sequence[ExprLike] | None = None) -> None:
    """Bulk copy (no tensor map) of the ``shape`` tile at ``offsets`` of ``src``, whose
    rows are contiguous runs of whole 16-byte chunks lying inside ``src``, into the
    row-major unswizzled ``dst``, signalling ``barrier`` with its bytes."""
    if not isinstance(dst, SharedTensor) or not isinstance(src, GlobalTensor):
        raise _fail("copy_bulk: expects (shared tile, global tensor, offsets, shape, barrier)")
    ref = _barrier(barrier, "copy_bulk")
    current().emit(CopyBulk(
        dst=dst, src=src, offsets=_offsets(offsets, src.rank, "copy_bulk"),
        shape=_static_shape(shape, "copy_bulk"), barriers=ref.barriers, index=ref.index,
        dst_offsets=None if dst_offsets is None else _offsets(dst_offsets, dst.rank,
                                                              "copy_bulk dst_offsets"),
        loc=user_location()))


def store_tma(dst: GlobalTensor, src: SharedTensor, offsets: Sequence[ExprLike] | None,
              src_offsets: Sequence[ExprLike] | None = None) -> None:
    """Synchronise the block, then tensor-copy the box of ``src`` (its trailing dims;
    ``src_offsets`` select the leading ones) to ``offsets`` of ``dst``, skipping what
    lies outside. ``src`` may not be written again before :func:`store_tma_wait`."""
    if not isinstance(dst, GlobalTensor) or not isinstance(src, SharedTensor):
        raise _fail("store_tma: expects (global tensor, shared tile, offsets)")
    current().emit(StoreTma(
        dst=dst, src=src, offsets=_offsets(offsets, dst.rank, "store_tma"),
        src_offsets=None if src_offsets is None else _offsets(src_offsets, src.rank,
                                                              "store_tma src_offsets"),
        loc=user_location()))


def store_tma_wait() -> None:
    """Wait until every :func:`store_tma` has read its source (then synchronise the
    block); needed before those sources are written again and before the program ends."""
    current().emit(StoreTmaWait(loc=user_location()))
