"""Register layouts of a block tile computed by a grid of warps with ``mma.sync``.

A ``bm x bn`` output tile is split over ``warps_m x warps_n`` warps; each warp repeats
the MMA atom to cover its part. The A operand is the same for every warp of a row of
warps (replicated across ``warps_n``), the B operand for every warp of a column.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowvm.dtypes import DType
from lowvm.errors import LayoutError
from lowvm.layouts.mma import mma_layouts
from lowvm.layouts.register import RegisterLayout, local, reduce, spatial


@dataclass(frozen=True)
class BlockMmaLayouts:
    """Layouts of the A ``[bm, bk]``, B ``[bk, bn]`` and C ``[bm, bn]`` block tiles."""

    a: RegisterLayout
    b: RegisterLayout
    c: RegisterLayout


def block_mma_layouts(bm: int, bn: int, bk: int, warps_m: int, warps_n: int,
                      dtype: DType, shape: str = "m16n8k16") -> BlockMmaLayouts:
    """The A/B/C layouts for a block of ``warps_m x warps_n`` warps (see module doc)."""
    atom = mma_layouts(shape, dtype)
    if bm % (atom.m * warps_m) or bn % (atom.n * warps_n) or bk % atom.k:
        raise LayoutError(
            f"block_mma_layouts: tile {bm}x{bn}x{bk} is not divisible by {warps_m}x{warps_n} "
            f"warps of {shape} atoms ({atom.m}x{atom.n}x{atom.k})"
        )
    rep_m, rep_n, rep_k = bm // (atom.m * warps_m), bn // (atom.n * warps_n), bk // atom.k
    warps = spatial(warps_m, warps_n)
    return BlockMmaLayouts(
        a=reduce(warps, [1], keepdims=True) * local(rep_m, rep_k) * atom.a,
        b=reduce(warps, [0], keepdims=True) * local(rep_k, rep_n) * atom.b,
        c=warps * local(rep_m, rep_n) * atom.c,
    )
