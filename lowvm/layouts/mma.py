"""Operand layouts of the warp-level ``mma.sync`` tensor-core instructions.

Each operand's fragment, as drawn in the PTX ISA, is a composition of the register
layout primitives: e.g. the f32 accumulator of m16n8k16 is
``local(2, 1).spatial(8, 4).local(1, 2)``: two row halves held in registers, the
warp's 32 lanes as 8 rows x 4 column pairs, two adjacent columns per lane. Nothing here
is a table: the tests compare these compositions with the ISA's formulas.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowvm.dtypes import DType, bfloat16, float16, float32, int8, int32, uint8
from lowvm.dtypes import dtype as as_dtype
from lowvm.errors import LayoutError
from lowvm.layouts.register import RegisterLayout, column_local, column_spatial, local, spatial

__all__ = ["MmaLayouts", "mma_layouts", "MMA_SHAPES", "WgmmaLayouts", "wgmma_layouts"]


@dataclass(frozen=True)
class MmaLayouts:
    """The three operand layouts of one warp MMA ``D[m,n] = A[m,k] @ B[k,n] + C[m,n]``."""

    name: str
    m: int
    n: int
    k: int
    operand_dtype: DType
    accumulator_dtype: DType
    a: RegisterLayout
    b: RegisterLayout
    c: RegisterLayout


def _accumulator() -> RegisterLayout:
    # rows groupID and groupID + 8 (registers c0,c1 / c2,c3); two adjacent columns each
    return local(2, 1).spatial(8, 4).local(1, 2)


def _build(name: str, dt: DType) -> MmaLayouts:
    c = _accumulator()
    if name == "m16n8k16" and dt in (float16, bfloat16):
        # a0..a7: (row half, column half) in column-major register order, pairs of columns
        a = column_local(2, 2).spatial(8, 4).local(1, 2)
        b = local(2, 1).column_spatial(4, 8).local(2, 1)
        return MmaLayouts(name, 16, 8, 16, dt, float32, a, b, c)
    if name == "m16n8k8" and dt in (float16, bfloat16):
        a = local(2, 1).spatial(8, 4).local(1, 2)
        b = column_spatial(4, 8).local(2, 1)
        return MmaLayouts(name, 16, 8, 8, dt, float32, a, b, c)
    if name == "m16n8k32" and dt in (int8, uint8):
        a = column_local(2, 2).spatial(8, 4).local(1, 4)
        b = local(2, 1).column_spatial(4, 8).local(4, 1)
        return MmaLayouts(name, 16, 8, 32, dt, int32, a, b, c)
    if name == "m16n8k16" and dt in (int8, uint8):
        a = local(2, 1).spatial(8, 4).local(1, 4)
        b = column_spatial(4, 8).local(4, 1)
        return MmaLayouts(name, 16, 8, 16, dt, int32, a, b, c)
    raise LayoutError(
        f"mma_layouts: no mma.sync shape {name!r} for operand type {dt.name}; accepted: "
        + ", ".join(f"{s} with {'/'.join(ts)}" for s, ts in MMA_SHAPES.items())
    )


MMA_SHAPES: dict[str, tuple[str, ...]] = {
    "m16n8k16": ("float16", "bfloat16", "int8", "uint8"),
    "m16n8k8": ("float16", "bfloat16"),
    "m16n8k32": ("int8", "uint8"),
}


def mma_layouts(shape: str, operand_dtype: DType | str) -> MmaLayouts:
    """The A, B and C fragment layouts of ``mma.sync.aligned.<shape>`` for a type.

    ``shape`` is e.g. ``"m16n8k16"``; ``operand_dtype`` the type of A and B
    (float16/bfloat16 accumulate in float32, int8/uint8 in int32).
    """
    return _build(shape, as_dtype(operand_dtype))


@dataclass(frozen=True)
class WgmmaLayouts:
    """Register operands of ``warpgroups`` warpgroups' ``wgmma.m64nNk16`` over a block
    tile ``D[m, n] += A[m, k] @ B[k, n]`` (A in registers, B read from shared memory).

    Warpgroup ``g`` owns rows ``g * m / warpgroups ..`` in ``m_tiles`` tiles of 64 (one
    ``wgmma`` each per 16 of K); within a tile, warp ``w`` of the group holds rows
    ``16 w .. 16 w + 15`` as the A and D fragments of ``mma.sync.m16n8k16``: A's four
    32-bit registers per 16 of K, D's four floats per 8 columns, column blocks in order.
    """

    m: int
    n: int
    k: int
    warpgroups: int
    m_tiles: int
    a: RegisterLayout
    c: RegisterLayout


def wgmma_layouts(m: int, n: int, k: int, warpgroups: int,
                  operand_dtype: DType | str = float16) -> WgmmaLayouts:
    """The A and accumulator layouts of :class:`WgmmaLayouts` (see there)."""
    dt = as_dtype(operand_dtype)
    if dt not in (float16, bfloat16):
        raise LayoutError(f"wgmma_layouts: operand type {dt.name} is not supported; "
                          "accepted: float16, bfloat16")
    if warpgroups < 1 or m % (64 * warpgroups):
        raise LayoutError(f"wgmma_layouts: m={m} must be a multiple of 64 x warpgroups "
                          f"({64 * max(warpgroups, 1)})")
    if n % 8 or not 8 <= n <= 256 or k % 16 or k < 16:
        raise LayoutError(f"wgmma_layouts: n={n} must be a multiple of 8 in 8..256 and "
                          f"k={k} a positive multiple of 16")
    atom = _build("m16n8k16", dt)
    tiles = m // (64 * warpgroups)

    rows = spatial(warpgroups, 1) * local(tiles, 1) * spatial(4, 1)
    return WgmmaLayouts(m, n, k, warpgroups, tiles, rows * local(1, k // 16) * atom.a,
                        rows * local(1, n // 8) * atom.c)
