"""Hopper's copy engine: tensor copies (TMA) and bulk copies between global and shared
memory, issued by one thread and completed asynchronously.

Why: ``copy_async`` has every thread copy 16 bytes and wait for its own copies; a
pipeline of large tiles then spends its threads' issue slots and registers on copying.
The copy engine moves a whole tile for one instruction of one thread, so a producer can
keep a ring of stages full while the other warps compute, and it counts the bytes it
delivers on an mbarrier (:mod:`lowvm.instructions.mbarrier`) that the consumers wait on.

- ``copy_tma``: the box (the shared tile's trailing dims, one per global dim) at
  ``offsets`` of a global view, as the tensor copy reads it through a tensor map the
  host builds from the view's shape and strides. Elements outside the view read as 0.
  The shared tile is the box row-major, under one of the copy's swizzles
  (:func:`lowvm.layouts.tma_layout`); its bytes count towards the barrier's phase.
- ``copy_bulk``: rows of a global view that are contiguous runs of whole 16-byte
  chunks (packed weights), into a row-major unswizzled shared tile, with no tensor map;
  every element must lie inside the view (the engine has no bounds).
- ``store_tma``: a shared box back to global memory (elements outside the view are
  skipped), after a barrier of the block that orders its threads' writes before the
  copy engine's read; ``store_tma_wait`` waits until every such read is done, after
  which the source may be written again.

Exact meaning (the interpreter's): a copy takes effect at its issue; what it wrote is
unreadable until an ``mbarrier_wait`` returns for the phase its bytes completed (a read
before is reported as a race), and the GPU's layout rules (strides of whole 16-byte
units, an innermost stride of 1, aligned runs) are checked on every execution, as the
hardware would fault on them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from lowvm.expr import Const, Expr, const_value
from lowvm.instructions.base import BlockState, Instruction, register_instruction
from lowvm.instructions.memory import (
    _check_offsets,
    _check_shared_tile,
    _global_positions,
    _shared_positions,
)
from lowvm.ir import BarrierTensor, GlobalTensor, SharedTensor
from lowvm.layouts import tma_swizzle_bytes

__all__ = ["CopyTma", "CopyBulk", "StoreTma", "StoreTmaWait", "TMA_MAX_RANK", "TMA_MAX_BOX",
           "TMA_DTYPE_BYTES"]

#: dims of a tensor copy's tensor map
TMA_MAX_RANK = 5
#: elements per dim of a tensor copy's box
TMA_MAX_BOX = 256
#: element sizes the copy engine moves (every whole-byte VM type: 1, 2 or 4 bytes)
TMA_DTYPE_BYTES = (1, 2, 4)


def _zeros(rank: int) -> tuple[Expr, ...]:
    return tuple(Const(0) for _ in range(rank))


def _box_table(box: tuple[int, ...]) -> np.ndarray:
    """Every index of ``box``, row-major, as ``[1, N, rank]``."""
    return np.indices(box).reshape(len(box), -1).T[None]


def _check_box(inst: Instruction, shared: SharedTensor, glob: GlobalTensor,
               box: tuple[int, ...], shared_start: tuple[Expr, ...]) -> int:
    """Rules of a tensor copy's box (its swizzle span, in bytes, is returned)."""
    _check_shared_tile(inst, shared, shared_start, box, "box")
    if shared.dtype != glob.dtype:
        raise inst.error(f"the shared tile %{shared.name} holds {shared.dtype.name} but "
                         f"%{glob.name} {glob.dtype.name}; the types must match")
    if glob.dtype.nbits % 8 or glob.dtype.nbits // 8 not in TMA_DTYPE_BYTES:
        raise inst.error(f"the copy engine moves elements of {TMA_DTYPE_BYTES} bytes, not "
                         f"{glob.dtype.name}")
    if not 1 <= glob.rank <= TMA_MAX_RANK:
        raise inst.error(f"%{glob.name} has rank {glob.rank}; tensor copies take 1 to "
                         f"{TMA_MAX_RANK} dims")
    if any(b > TMA_MAX_BOX for b in box):
        raise inst.error(f"the box {list(box)} has a dim over {TMA_MAX_BOX} elements, the "
                         "copy engine's limit")
    inner = box[-1] * glob.dtype.nbits // 8
    if inner % 16:
        raise inst.error(f"the box's innermost dim spans {inner} bytes; the copy engine "
                         "moves whole 16-byte units (make it a multiple of "
                         f"{128 // glob.dtype.nbits} {glob.dtype.name})")
    span = tma_swizzle_bytes(shared.layout, shared.dtype, box)
    if span is None:
        raise inst.error(
            f"%{shared.name} (layout {shared.layout}) is not a box {list(box)} as the copy "
            "engine stores one: row-major, under no swizzle or a 32/64/128-byte one whose "
            "span is the box's innermost dim, each leading index a whole box (build it "
            "with lowvm.layouts.tma_layout)")
    for o in shared_start[shared.rank - len(box):]:
        if const_value(o) != 0:
            raise inst.error(f"the box starts at {list(shared_start)} of %{shared.name}; "
                             "only its leading (stage) dims may be offset")
    return span


def _check_tensor_strides(st: BlockState, inst: Instruction, glob: GlobalTensor) -> None:
    """The tensor map's rules on a view's runtime strides: innermost 1, others whole
    16-byte multiples below 2^40 bytes, every size in 1..2^32."""
    shape, strides = st.global_shape(glob)
    elem = glob.dtype.nbits // 8
    if strides[-1] != 1:
        raise st.runtime_error(inst, f"%{glob.name} has innermost stride {strides[-1]}; a "
                               "tensor copy needs 1 (contiguous rows)")
    for d, (size, stride) in enumerate(zip(shape, strides)):
        if not 1 <= size <= 1 << 32:
            raise st.runtime_error(inst, f"%{glob.name} has size {size} along dim {d}; a "
                                   "tensor map takes 1..2^32")
        if d < len(shape) - 1 and (stride * elem % 16 or not 0 < stride * elem < 1 << 40):
            raise st.runtime_error(
                inst, f"%{glob.name} has stride {stride} ({stride * elem} bytes) along dim "
                f"{d}; a tensor map needs a positive multiple of 16 bytes below 2^40")


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class CopyTma(Instruction):
    """Copy the box at ``offsets`` of ``src`` into ``dst`` (at ``dst_offsets``: leading,
    stage dims only), signalling barrier ``index`` of ``barriers`` with its bytes."""

    mnemonic = "copy_tma"
    dst: SharedTensor
    src: GlobalTensor
    offsets: tuple[Expr, ...]
    barriers: BarrierTensor
    index: Expr
    dst_offsets: tuple[Expr, ...] | None = None

    @property
    def box(self) -> tuple[int, ...]:
        """The copied box: ``dst``'s trailing dims, one per global dim."""
        return self.dst.shape[self.dst.rank - self.src.rank:]

    @property
    def dst_start(self) -> tuple[Expr, ...]:
        return self.dst_offsets if self.dst_offsets is not None else _zeros(self.dst.rank)

    @property
    def nbytes(self) -> int:
        """Transaction bytes: the whole box, zero-filled parts included."""
        return math.prod(self.box) * self.src.dtype.nbits // 8

    @property
    def swizzle(self) -> int:
        """The copy's swizzle span in bytes (0, 32, 64, 128)."""
        return tma_swizzle_bytes(self.dst.layout, self.dst.dtype, self.box) or 0

    def check(self) -> None:
        _check_offsets(self, self.offsets, self.src.rank, "global tensor")
        if self.dst.rank < self.src.rank:
            raise self.error(f"the shared tile %{self.dst.name} has {self.dst.rank} dims, "
                             f"fewer than %{self.src.name}'s {self.src.rank}: its trailing "
                             "dims are the box, one per global dim")
        _check_box(self, self.dst, self.src, self.box, self.dst_start)

    def interpret(self, st: BlockState) -> None:
        _check_tensor_strides(st, self, self.src)
        table = _box_table(self.box)
        flat, inside = _global_positions(st, self.src, self.offsets, table)
        values = np.zeros(flat.shape[1], dtype=np.float64 if self.dst.dtype.is_float
                          else np.int64)
        values[inside[0]] = st.global_buffer(self.src, self).read(flat[0][inside[0]])
        pos = _shared_positions(self, st, self.dst, self.dst_start, table,
                                write=True).reshape(-1)
        barrier = st.barrier(self.barriers, self.index, self)
        phase = barrier.deliver(self.nbytes)
        st.shared(self.dst, self).copy_signalled(pos, values, self, st, barrier, phase)

    def format_args(self) -> str:
        dst = f"%{self.dst.name}" + (f"[{', '.join(map(str, self.dst_offsets))}]"
                                      if self.dst_offsets is not None else "")
        return (f"{dst} <- %{self.src.name}[{', '.join(map(str, self.offsets))}], "
                f"box={list(self.box)}, swizzle={self.swizzle}, "
                f"barrier=%{self.barriers.name}[{self.index}]")


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class CopyBulk(Instruction):
    """Copy the ``shape`` tile at ``offsets`` of ``src`` (rows of whole 16-byte chunks,
    contiguous in global memory) into ``dst`` at ``dst_offsets``, signalling barrier
    ``index`` of ``barriers`` with its bytes. One bulk copy per row; rows that continue
    each other in memory become one."""

    mnemonic = "copy_bulk"
    dst: SharedTensor
    src: GlobalTensor
    offsets: tuple[Expr, ...]
    shape: tuple[int, ...]
    barriers: BarrierTensor
    index: Expr
    dst_offsets: tuple[Expr, ...] | None = None

    @property
    def dst_start(self) -> tuple[Expr, ...]:
        return self.dst_offsets if self.dst_offsets is not None else _zeros(self.dst.rank)

    @property
    def nbytes(self) -> int:
        """Transaction bytes of the tile."""
        return math.prod(self.shape) * self.src.dtype.nbits // 8

    def check(self) -> None:
        _check_offsets(self, self.offsets, self.src.rank, "global tensor")
        if len(self.shape) != self.src.rank:
            raise self.error(f"shape {list(self.shape)} has rank {len(self.shape)} but "
                             f"%{self.src.name} has rank {self.src.rank}")
        if self.src.dtype != self.dst.dtype or self.src.dtype.nbits % 8:
            raise self.error(f"copying {self.src.dtype.name} %{self.src.name} into "
                             f"{self.dst.dtype.name} %{self.dst.name}: the types must match "
                             "and be whole bytes")
        _check_shared_tile(self, self.dst, self.dst_start, self.shape, "copied tile")
        row = self.shape[-1] * self.src.dtype.nbits // 8
        if row % 16:
            raise self.error(f"each row of the tile spans {row} bytes; bulk copies move "
                             "whole 16-byte chunks")
        lay = self.dst.layout
        inner = [math.prod(self.shape[d + 1:]) for d in range(len(self.shape))]
        if lay.swizzle is not None or list(lay.strides[lay.rank - len(self.shape):]) != inner:
            raise self.error(f"%{self.dst.name} (layout {lay}) must store the tile "
                             "row-major and unswizzled, as bulk copies write it")
        for o in self.dst_start[lay.rank - len(self.shape):]:
            if const_value(o) != 0:
                raise self.error("only the leading (stage) dims of the destination may be "
                                 "offset")

    def interpret(self, st: BlockState) -> None:
        table = _box_table(self.shape)
        flat, inside = _global_positions(st, self.src, self.offsets, table)
        if not inside.all():
            start = [int(st.eval(o)) for o in self.offsets]
            raise st.runtime_error(
                self, f"the {list(self.shape)} tile at {start} reaches outside "
                f"%{self.src.name} of shape {list(st.global_shape(self.src)[0])}; a bulk "
                "copy has no bounds (use copy_tma, which zero-fills)")
        rows = flat[0].reshape(-1, self.shape[-1])
        elem = self.src.dtype.nbits // 8
        if (np.diff(rows, axis=1) != 1).any() or (rows[:, 0] * elem % 16).any():
            raise st.runtime_error(
                self, f"each row of the tile must be contiguous in %{self.src.name} and "
                "start on a 16-byte boundary of its buffer")
        values = st.global_buffer(self.src, self).read(flat[0])
        pos = _shared_positions(self, st, self.dst, self.dst_start, table,
                                write=True).reshape(-1)
        barrier = st.barrier(self.barriers, self.index, self)
        phase = barrier.deliver(self.nbytes)
        st.shared(self.dst, self).copy_signalled(pos, values, self, st, barrier, phase)


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class StoreTma(Instruction):
    """Synchronise the block, then copy the box of ``src`` at ``src_offsets`` (leading,
    stage dims) to ``offsets`` of ``dst``; parts outside ``dst`` are skipped."""

    mnemonic = "store_tma"
    dst: GlobalTensor
    src: SharedTensor
    offsets: tuple[Expr, ...]
    src_offsets: tuple[Expr, ...] | None = None

    @property
    def box(self) -> tuple[int, ...]:
        return self.src.shape[self.src.rank - self.dst.rank:]

    @property
    def src_start(self) -> tuple[Expr, ...]:
        return self.src_offsets if self.src_offsets is not None else _zeros(self.src.rank)

    @property
    def swizzle(self) -> int:
        return tma_swizzle_bytes(self.src.layout, self.src.dtype, self.box) or 0

    def check(self) -> None:
        _check_offsets(self, self.offsets, self.dst.rank, "global tensor")
        if self.src.rank < self.dst.rank:
            raise self.error(f"the shared tile %{self.src.name} has fewer dims than "
                             f"%{self.dst.name}: its trailing dims are the box")
        _check_box(self, self.src, self.dst, self.box, self.src_start)

    def interpret(self, st: BlockState) -> None:
        _check_tensor_strides(st, self, self.dst)
        st.sync()
        table = _box_table(self.box)
        flat, inside = _global_positions(st, self.dst, self.offsets, table)
        pos = _shared_positions(self, st, self.src, self.src_start, table).reshape(-1)
        values = st.shared(self.src, self).read_bulk(pos, self, st)
        st.global_buffer(self.dst, self).write(flat[0][inside[0]], values[inside[0]])
        st.bulk_stores_pending = True


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class StoreTmaWait(Instruction):
    """Wait until every ``store_tma`` has read its source, then synchronise the block:
    the sources may be written or freed again."""

    mnemonic = "store_tma_wait"

    def interpret(self, st: BlockState) -> None:
        for storage in st.shared_tiles.values():
            storage.release_bulk_reads()
        st.bulk_stores_pending = False
        st.sync()
