"""Place every shared tile at a byte offset, reusing space after ``free_shared``.

A first-fit scan over the instructions in program order (loop bodies once: a tile
allocated in a loop keeps one place). Offsets are 16-byte aligned so that vector and
``cp.async`` accesses stay legal; tiles the tensor cores read in place (``dot_shared``
lowered to ``wgmma``) are 1024-byte aligned, as the hardware's 128-byte swizzle takes
the row within an 8-row group from the address bits.
"""

from __future__ import annotations

from lowvm.instructions import AllocShared, DotShared, FreeShared
from lowvm.ir import Program, SharedTensor

__all__ = ["allocate_shared"]

_ALIGN = 16
_WGMMA_ALIGN = 1024


def _align(n: int, to: int = _ALIGN) -> int:
    return (n + to - 1) // to * to


def allocate_shared(program: Program) -> tuple[dict[SharedTensor, int], int]:
    """``(offset of each shared tile, total bytes)``."""
    live: list[tuple[int, int, SharedTensor]] = []
    offsets: dict[SharedTensor, int] = {}
    total = 0
    wgmma_read = {inst.b for inst in program.instructions()
                  if isinstance(inst, DotShared) and inst.impl is not None}
    for inst in program.instructions():
        if isinstance(inst, AllocShared):
            to = _WGMMA_ALIGN if inst.out in wgmma_read else _ALIGN
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
