"""How the lowering implements an instruction (``inst.impl``): plain data the passes
attach (:mod:`lowvm.passes.vectorize`, :mod:`lowvm.passes.instruction_selection`) and the
CUDA emitters read, defined here so that neither side imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowvm.expr import Expr
from lowvm.layouts import MmaLayouts

__all__ = ["VectorAccess", "MmaPlan", "LdmatrixPlan", "WgmmaPlan", "CpAsyncPlan"]


@dataclass(frozen=True)
class VectorAccess:
    """Move ``width`` elements (``nbytes`` bytes) per access; vector path iff ``condition``."""

    width: int
    nbytes: int
    condition: tuple[Expr, ...] = ()

    def __str__(self) -> str:
        cond = f" if {' && '.join(str(c) for c in self.condition)}" if self.condition else ""
        return f"vector {self.nbytes}B{cond}"


@dataclass(frozen=True)
class MmaPlan:
    """Straight-line ``mma.sync`` list: ``steps[i] = (c atom, a atom, b atom)`` locals."""

    atom: MmaLayouts
    steps: tuple[tuple[int, int, int], ...]

    def __str__(self) -> str:
        return f"mma.sync.{self.atom.name} x{len(self.steps)}"


@dataclass(frozen=True)
class LdmatrixPlan:
    """``ldmatrix`` calls: ``(first 32-bit register, matrices)`` each; ``trans`` for .trans."""

    trans: bool
    calls: tuple[tuple[int, int], ...]

    def __str__(self) -> str:
        counts = sorted({n for _, n in self.calls})
        kind = "/".join(f"x{n}" for n in counts)
        return f"ldmatrix.{kind}{'.trans' if self.trans else ''} x{len(self.calls)}"


@dataclass(frozen=True)
class WgmmaPlan:
    """``wgmma.mma_async.m64{n}k16``: ``m_tiles`` x ``k_slices`` of them per warpgroup."""

    n: int
    m_tiles: int
    k_slices: int
    col0: int  # first column of the tile within its 64-element (128-byte) rows

    def __str__(self) -> str:
        return f"wgmma.m64n{self.n}k16 x{self.m_tiles * self.k_slices}"


@dataclass(frozen=True)
class CpAsyncPlan:
    """``cp.async`` of ``access.nbytes``-byte chunks."""

    access: VectorAccess

    def __str__(self) -> str:
        return f"cp.async {self.access}"
