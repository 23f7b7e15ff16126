"""Instruction selection: tensor-core and warp-cooperative instructions where layouts allow.

Guarantees (each decided from the layouts alone, checked for every thread):

- ``dot`` -> ``mma.sync`` (:class:`MmaPlan`) when a, b and c are each an outer layout
  composed with the operands of one MMA atom (``outer * atom``, the form
  :func:`lowvm.layouts.mma_tiling.block_mma_layouts` builds), and for every warp the
  atom of a and b feeding each accumulator atom sits at the *same* local position, so
  the schedule is one straight-line list of ``mma.sync`` for all threads.
  f16/bf16 use m16n8k16, int8/uint8 m16n8k32 (then m16n8k16).
- ``load_shared`` of 16-bit elements -> ``ldmatrix`` (:class:`LdmatrixPlan`) when each
  pair of locals is one 32-bit word of an 8x8 matrix whose eight 16-byte rows are
  aligned in shared memory, in the lane order ``ldmatrix`` delivers (``.trans`` when the
  pair runs down a column); four matrices per instruction where they fit.
- ``dot_shared`` -> ``wgmma.mma_async`` (:class:`WgmmaPlan`, sm_90a) when ``a`` and ``c``
  are exactly :func:`lowvm.layouts.wgmma_layouts`' fragments for the block's warpgroups
  and the shared tile is the canonical K-major 128-byte-swizzled operand: rows of 64
  16-bit elements (``swizzle_128b(rows, 64)``, possibly staged), a tile starting at a
  static row multiple of 8 and column multiple of 16 within the row.
- ``copy_async`` with 4/8/16-byte chunks (from the vectorization pass) -> ``cp.async``
  (:class:`CpAsyncPlan`), zero-filling outside the tensor.

Anything else keeps the generic lowering; the program's meaning never changes.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lowvm.dtypes import bfloat16, float16, int8, uint8
from lowvm.errors import LayoutError
from lowvm.expr import Expr, const_value
from lowvm.instructions.dot import Dot, DotShared
from lowvm.instructions.memory import CopyAsync, LoadShared
from lowvm.instructions.plans import CpAsyncPlan, LdmatrixPlan, MmaPlan, VectorAccess, WgmmaPlan
from lowvm.ir import Program, RegisterTensor, SharedTensor
from lowvm.layouts import RegisterLayout, Swizzle, mma_layouts, wgmma_layouts
from lowvm.passes.rewrite import map_instructions
from lowvm.passes.vectorize import runtime_offsets_commute, shared_elem_offsets

__all__ = ["MmaPlan", "LdmatrixPlan", "CpAsyncPlan", "WgmmaPlan", "select_instructions",
           "mma_plan", "ldmatrix_plan", "wgmma_plan", "atom_outer"]

#: operand type -> MMA shapes to try, best first
_MMA_SHAPES = {float16: ("m16n8k16",), bfloat16: ("m16n8k16",),
               int8: ("m16n8k32", "m16n8k16"), uint8: ("m16n8k32", "m16n8k16")}


# ---------------------------------------------------------------------------------------
# dot -> mma.sync


def atom_outer(layout: RegisterLayout, atom: RegisterLayout, atom_shape: tuple[int, int]
               ) -> np.ndarray | None:
    """If ``layout == outer * atom`` (32-lane warps), the atom coordinate of each outer
    (warp, local) as an array ``[warps, outer locals, 2]``; else None."""
    threads, locals_ = layout.num_threads, layout.local_size
    inner = atom.local_size
    if threads % 32 or locals_ % inner or atom.num_threads != 32:
        return None
    table = layout.table.reshape(threads // 32, 32, locals_ // inner, inner, 2)
    shape = np.array(atom_shape)
    outer = table // shape
    first = outer[:, :1, :, :1, :]
    if not np.array_equal(outer, np.broadcast_to(first, outer.shape)):
        return None
    if not np.array_equal(table % shape, np.broadcast_to(atom.table[None, :, None],
                                                          table.shape)):
        return None
    return first[:, 0, :, 0, :]


def _positions(outer: np.ndarray) -> list[dict[tuple[int, int], int]]:
    return [{(int(i), int(j)): loc for loc, (i, j) in enumerate(w)} for w in outer]


def mma_plan(a: RegisterTensor, b: RegisterTensor, c: RegisterTensor) -> MmaPlan | None:
    """The ``mma.sync`` schedule of ``c += a @ b``, or None (see module docstring)."""
    for shape in _MMA_SHAPES.get(a.dtype, ()):
        atom = mma_layouts(shape, a.dtype)
        oa = atom_outer(a.layout, atom.a, (atom.m, atom.k))
        ob = atom_outer(b.layout, atom.b, (atom.k, atom.n))
        oc = atom_outer(c.layout, atom.c, (atom.m, atom.n))
        if oa is None or ob is None or oc is None or not (len(oa) == len(ob) == len(oc)):
            continue
        ksteps = a.shape[1] // atom.k
        pa, pb = _positions(oa), _positions(ob)
        steps, ok = [], True
        for ci in range(oc.shape[1]):
            for kk in range(ksteps):
                found = set()
                for w in range(len(oc)):
                    i, j = (int(v) for v in oc[w, ci])
                    found.add((pa[w].get((i, kk)), pb[w].get((kk, j))))
                if len(found) != 1 or None in next(iter(found)):
                    ok = False
                    break
                la, lb = next(iter(found))
                steps.append((ci, la, lb))
            if not ok:
                break
        if ok:
            return MmaPlan(atom, tuple(steps))
    return None


# ---------------------------------------------------------------------------------------
# dot_shared -> wgmma

#: elements of a 16-bit K-major wgmma operand row (128 bytes) and its swizzle
_WGMMA_ROW = 64
_WGMMA_SWIZZLE = Swizzle(bits=3, base=3, shift=3)


def wgmma_plan(inst: DotShared) -> WgmmaPlan | None:
    """The ``wgmma`` schedule of ``inst``, or None (see module docstring)."""
    a, c, b = inst.a, inst.c, inst.b
    (m, k), (n, _) = a.shape, inst.shape
    threads = a.layout.num_threads
    if threads % 128 or c.layout.num_threads != threads:
        return None
    try:
        want = wgmma_layouts(m, n, k, threads // 128, a.dtype)
    except LayoutError:
        return None
    if a.layout != want.a and not np.array_equal(a.layout.table, want.a.table):
        return None
    if c.layout != want.c and not np.array_equal(c.layout.table, want.c.table):
        return None
    lay = b.layout
    row0, col0 = (const_value(o) for o in inst.offsets[-2:])
    if (b.dtype.nbits != 16 or lay.swizzle != _WGMMA_SWIZZLE or b.shape[-1] != _WGMMA_ROW
            or lay.strides[-1] != 1 or lay.strides[-2] != _WGMMA_ROW
            or any(s % (8 * _WGMMA_ROW) for s in lay.strides[:-2])):
        return None
    if not (isinstance(row0, int) and isinstance(col0, int)) or row0 % 8 or col0 % 16:
        return None
    if col0 + k > _WGMMA_ROW:
        return None
    return WgmmaPlan(n, want.m_tiles, k // 16, col0)


# ---------------------------------------------------------------------------------------
# load_shared -> ldmatrix


def _row_addresses(offs: np.ndarray, trans: bool) -> np.ndarray | None:
    """``rows[warp, reg, 8]`` element offsets of the 8 matrix rows each register reads."""
    threads, locals_ = offs.shape
    warps, regs = threads // 32, locals_ // 2
    lane = np.arange(32)
    o = offs.reshape(warps, 32, regs, 2)
    if not trans:
        # lane holds the word at row lane//4, column pair lane%4 of its matrix
        rows = o[:, ::4, :, 0]  # lanes 0, 4, ..., 28 -> [warps, 8, regs]
        expect0 = rows[:, lane // 4, :] + 2 * (lane % 4)[None, :, None]
        expect1 = expect0 + 1
    else:
        # lane holds rows 2*(lane%4) and +1 of column lane//4
        rows = np.stack([o[:, r // 2, :, r % 2] for r in range(8)], axis=1)  # [w, 8, regs]
        expect0 = rows[:, 2 * (lane % 4), :] + (lane // 4)[None, :, None]
        expect1 = rows[:, 2 * (lane % 4) + 1, :] + (lane // 4)[None, :, None]
    if not (np.array_equal(o[..., 0], expect0) and np.array_equal(o[..., 1], expect1)):
        return None
    if (rows % 8).any():  # 16-byte aligned rows of 8 elements
        return None
    return rows.transpose(0, 2, 1)


def ldmatrix_plan(tile: RegisterTensor, tensor: SharedTensor, offsets: tuple[Expr, ...]
                  ) -> LdmatrixPlan | None:
    """The ``ldmatrix`` calls loading ``tile`` from ``tensor``, or None."""
    lay = tile.layout
    if tensor.dtype.nbits != 16 or lay.num_threads % 32 or lay.local_size % 2:
        return None
    if not runtime_offsets_commute(tensor, offsets, 8):
        return None
    offs = shared_elem_offsets(tensor, offsets, lay.table)
    for trans in (False, True):
        if _row_addresses(offs, trans) is not None:
            regs = lay.local_size // 2
            calls, r = [], 0
            for count in (4, 2, 1):
                while regs - r >= count:
                    calls.append((r, count))
                    r += count
            return LdmatrixPlan(trans, tuple(calls))
    return None


# ---------------------------------------------------------------------------------------


def _select(inst):
    if isinstance(inst, Dot):
        plan = mma_plan(inst.a, inst.b, inst.c)
        return inst if plan is None else dataclasses.replace(inst, impl=plan)
    if isinstance(inst, DotShared):
        plan = wgmma_plan(inst)
        return inst if plan is None else dataclasses.replace(inst, impl=plan)
    if isinstance(inst, LoadShared):
        plan = ldmatrix_plan(inst.out, inst.src, inst.offsets)
        return inst if plan is None else dataclasses.replace(inst, impl=plan)
    if isinstance(inst, CopyAsync) and isinstance(inst.impl, VectorAccess):
        return dataclasses.replace(inst, impl=CpAsyncPlan(inst.impl))
    return inst


def select_instructions(program: Program) -> Program:
    """Attach :class:`MmaPlan`, :class:`WgmmaPlan`, :class:`LdmatrixPlan` and
    :class:`CpAsyncPlan` where legal."""
    return map_instructions(program, _select)
