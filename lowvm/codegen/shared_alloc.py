"""Place every shared tile at a byte offset, reusing space after ``free_shared``.

A first-fit scan over the instructions in program order (loop bodies once: a tile
allocated in a loop keeps one place). Offsets are 16-byte aligned so that vector and
``cp.async`` accesses stay legal; tiles the tensor cores read in place (``dot_shared``
lowered to ``wgmma``) are 1024-byte aligned, as the hardware's 128-byte swizzle takes
the row within an 8-row group from the address bits.
"""

from __future__ import annotations

from lowvm.instructions import (
    AllocBarriers,
    AllocShared,
    CopyTma,
    DotShared,
    FreeShared,
    StoreTma,
)
from lowvm.ir import Program, SharedTensor

__all__ = ["allocate_shared", "reused_space"]

_ALIGN = 16
_WGMMA_ALIGN = 1024
#: a tensor copy's box starts on 128 bytes, a swizzled one on a whole swizzle pattern
_TMA_ALIGN, _TMA_SWIZZLED_ALIGN = 128, 1024


def _align(n: int, to: int = _ALIGN) -> int:
    return (n + to - 1) // to * to


def allocate_shared(program: Program) -> tuple[dict[SharedTensor, int], int]:
    """``(offset of each shared tile, total bytes)``."""
    live: list[tuple[int, int, SharedTensor]] = []
    offsets: dict[SharedTensor, int] = {}
    total = 0
    align: dict[SharedTensor, int] = {}
    for inst in program.instructions():
        if isinstance(inst, DotShared) and inst.impl is not None:
            align[inst.b] = max(align.get(inst.b, _ALIGN), _WGMMA_ALIGN)
        elif isinstance(inst, (CopyTma, StoreTma)):
            tile = inst.dst if isinstance(inst, CopyTma) else inst.src
            to = _TMA_SWIZZLED_ALIGN if inst.swizzle else _TMA_ALIGN
            align[tile] = max(align.get(tile, _ALIGN), to)
    for inst in program.instructions():
        if isinstance(inst, (AllocShared, AllocBarriers)):
            to = align.get(inst.out, _ALIGN)
            size = _align(inst.out.nbytes)
            start = 0
            for begin, end, _ in sorted(live):
                if begin - start >= size:
                    break
                start = _align(max(start, end), to)
            live.append((start, start + size, inst.out))
            offsets[inst.out] = start
            total = max(total, start + size)
        elif isinstance(inst, FreeShared):
            live = [entry for entry in live if entry[2] is not inst.tensor]
    return offsets, total


def reused_space(program: Program, offsets: dict[SharedTensor, int]) -> set[SharedTensor]:
    """The tiles placed (partly) where an earlier, freed tile was. The program's meaning is
    a fresh tile (the interpreter's), so their allocation must wait until every thread is
    done with the old one: the lowering puts a block barrier there."""
    seen: list[tuple[int, int]] = []
    reused = set()
    for inst in program.instructions():
        if isinstance(inst, AllocShared):
            start = offsets[inst.out]
            end = start + inst.out.nbytes
            if any(s < end and start < e for s, e in seen):
                reused.add(inst.out)
            seen.append((start, end))
    return reused
