"""Place every shared tile at a byte offset, reusing space after ``free_shared``.

A first-fit scan over the instructions in program order (loop bodies once: a tile
allocated in a loop keeps one place). Offsets are 16-byte aligned so that vector and
``cp.async`` accesses stay legal.
"""

from __future__ import annotations

from lowvm.instructions import AllocShared, FreeShared
from lowvm.ir import Program, SharedTensor

__all__ = ["allocate_shared"]

_ALIGN = 16


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def allocate_shared(program: Program) -> tuple[dict[SharedTensor, int], int]:
    """``(offset of each shared tile, total bytes)``."""
    live: list[tuple[int, int, SharedTensor]] = []
    offsets: dict[SharedTensor, int] = {}
    total = 0
    for inst in program.instructions():
        if isinstance(inst, AllocShared):
            size = _align(inst.out.nbytes)
            start = 0
            for begin, end, _ in sorted(live):
                if begin - start >= size:
                    break
                start = max(start, end)
            live.append((start, start + size, inst.out))
            offsets[inst.out] = start
            total = max(total, start + size)
        elif isinstance(inst, FreeShared):
            live = [entry for entry in live if entry[2] is not inst.tensor]
    return offsets, total
