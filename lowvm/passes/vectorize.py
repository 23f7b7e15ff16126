"""Automatic vectorization: the widest legal access per thread for every memory tile.

Guarantee: an instruction gets a :class:`VectorAccess` only if, for every thread, each
run of ``width`` consecutive locals holds ``width`` consecutive elements along the
tile's last dim, starting at a multiple of ``width`` (so one 16/8/4/2-byte instruction
moves the run), and the memory side is contiguous and aligned there:

- shared memory: proven at compile time from the shared layout (strides and swizzle)
  and the offsets (runtime offsets must be provable multiples of the swizzle period);
- global memory: the last stride is 1 and the base pointer is 16-byte aligned (the
  launcher checks it); what depends on runtime sizes (row strides, the offset along
  the last dim, the last dim's size) becomes a uniform runtime ``condition``. The code
  takes the vector path when it holds and the per-element path otherwise, so any size
  still works.

Sub-byte tiles are loaded as bytes and ``view``-ed, so they always move whole bytes.
float32 ``atomic_add`` runs are planned as global stores are (one vector reduction per
run, up to 16 bytes).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from lowvm.dtypes import float32
from lowvm.expr import Const, Expr, as_expr, const_value, known_multiple
from lowvm.instructions.atomic import AtomicAdd
from lowvm.instructions.memory import CopyAsync, LoadGlobal, LoadShared, StoreGlobal, StoreShared
from lowvm.instructions.plans import VectorAccess
from lowvm.ir import GlobalTensor, Program, SharedTensor
from lowvm.layouts import RegisterLayout, SharedLayout
from lowvm.passes.rewrite import map_instructions

__all__ = ["VectorAccess", "vectorize", "register_run", "shared_run", "global_conditions",
           "MAX_VECTOR_BYTES"]

#: The widest access one thread can make (``ld.global.v4.b32``, ``cp.async`` 16 B).
MAX_VECTOR_BYTES = 16


def _pow2_widths(limit: int) -> list[int]:
    widths, w = [], 2
    while w <= limit:
        widths.append(w)
        w *= 2
    return widths


def register_run(layout: RegisterLayout, elem_bytes: int) -> int:
    """Largest ``width`` whose aligned local runs are consecutive along the last dim."""
    table = layout.table
    threads, locals_, rank = table.shape
    best = 1
    for width in _pow2_widths(min(locals_, MAX_VECTOR_BYTES // max(elem_bytes, 1))):
        if locals_ % width:
            break
        runs = table.reshape(threads, locals_ // width, width, rank)
        first = runs[:, :, :1, :]
        step = np.zeros(rank, dtype=np.int64)
        step[-1] = 1
        expected = first + np.arange(width)[None, None, :, None] * step
        if not np.array_equal(runs, expected) or (first[..., -1] % width).any():
            break
        best = width
    return best


def _shared_index(tensor: SharedTensor, offsets: tuple[Expr, ...], idx: np.ndarray
                  ) -> list[np.ndarray]:
    """Full-rank shared indices of tile indices ``idx [..., r_t]`` (runtime offsets as 0)."""
    lead = tensor.rank - idx.shape[-1]
    values = [const_value(o) if isinstance(as_expr(o), Const) else 0 for o in offsets]
    out = [np.full(idx.shape[:-1], values[d], dtype=np.int64) for d in range(lead)]
    out += [idx[..., d] + values[lead + d] for d in range(idx.shape[-1])]
    return out


def shared_period(layout: SharedLayout) -> int | None:
    """Element offsets that are multiples of this commute with the swizzle (None: any)."""
    sw = layout.swizzle
    return None if sw is None else 1 << (sw.base + sw.shift + sw.bits)


def runtime_offsets_commute(tensor: SharedTensor, offsets: tuple[Expr, ...], unit: int) -> bool:
    """True when every runtime offset moves the tile by a multiple of ``unit`` elements
    and of the swizzle period, so compile-time analysis with offset 0 stays valid."""
    period = shared_period(tensor.layout) or 1
    need = math.lcm(unit, period)
    for off, stride in zip(offsets, tensor.layout.strides):
        if isinstance(as_expr(off), Const):
            continue
        if (known_multiple(off) * stride) % need:
            return False
    return True


def shared_elem_offsets(tensor: SharedTensor, offsets: tuple[Expr, ...], idx: np.ndarray
                        ) -> np.ndarray:
    """Element offsets (after swizzle) of tile indices ``idx``, runtime offsets as 0."""
    full = _shared_index(tensor, offsets, idx)
    lay = tensor.layout
    linear = sum(full[d] * lay.strides[d] for d in range(tensor.rank))
    return lay.swizzle(linear) if lay.swizzle else linear


def shared_run(tensor: SharedTensor, offsets: tuple[Expr, ...], layout: RegisterLayout) -> int:
    """Largest width whose register runs are also contiguous, aligned runs in shared."""
    elem_bytes = tensor.dtype.nbits // 8
    width = register_run(layout, elem_bytes)
    offs = shared_elem_offsets(tensor, offsets, layout.table)
    threads, locals_ = offs.shape
    while width > 1:
        runs = offs.reshape(threads, locals_ // width, width)
        contiguous = np.array_equal(runs, runs[:, :, :1] + np.arange(width))
        if (contiguous and not (runs[:, :, 0] % width).any()
                and runtime_offsets_commute(tensor, offsets, width)):
            return width
        width //= 2
    return 1


def global_conditions(tensor: GlobalTensor, offsets: tuple[Expr, ...], width: int
                      ) -> tuple[Expr, ...] | None:
    """Runtime conditions making ``width``-element accesses aligned; None if impossible."""
    lay = tensor.layout
    if not isinstance(lay.strides[-1], Const) or lay.strides[-1].value != 1:
        return None
    conds: list[Expr] = []
    for what in (*lay.strides[:-1], offsets[-1], lay.shape[-1]):
        cond = (as_expr(what) % width).equals(0)
        if known_multiple(what) % width and not any(cond == c for c in conds):
            conds.append(cond)
    return tuple(conds)


def _vector(width: int, elem_bytes: int, conds: tuple[Expr, ...] = ()) -> VectorAccess | None:
    return VectorAccess(width, width * elem_bytes, conds) if width > 1 else None


def _plan(inst: object) -> VectorAccess | None:
    if isinstance(inst, AtomicAdd) and inst.dst.dtype != float32:
        return None  # (vector reductions exist for float32: red.global.add.v2/v4.f32)
    if isinstance(inst, (LoadGlobal, StoreGlobal, AtomicAdd)):
        tile = inst.out if isinstance(inst, LoadGlobal) else inst.src
        tensor = inst.src if isinstance(inst, LoadGlobal) else inst.dst
        eb = tensor.dtype.nbits // 8
        width = register_run(tile.layout, eb)
        while width > 1:
            conds = global_conditions(tensor, inst.offsets, width)
            if conds is not None:
                return _vector(width, eb, conds)
            width //= 2
        return None
    if isinstance(inst, (LoadShared, StoreShared)):
        tile = inst.out if isinstance(inst, LoadShared) else inst.src
        tensor = inst.src if isinstance(inst, LoadShared) else inst.dst
        return _vector(shared_run(tensor, inst.offsets, tile.layout), tensor.dtype.nbits // 8)
    if isinstance(inst, CopyAsync):
        return copy_chunks(inst)
    return None


def copy_chunks(inst: CopyAsync) -> VectorAccess | None:
    """Chunks of a ``copy_async``: row-major runs along the last dim, 16/8/4 bytes."""
    shape = inst.tile_shape
    eb = inst.dst.dtype.nbits // 8
    if eb == 0:
        return None
    dst_offsets = inst.dst_start
    idx = np.indices(shape).reshape(len(shape), -1).T  # [N, r]
    offs = shared_elem_offsets(inst.dst, dst_offsets, idx)
    width = MAX_VECTOR_BYTES // eb
    while width * eb >= 4:
        if shape[-1] % width == 0:
            runs = offs.reshape(-1, width)
            ok = (np.array_equal(runs, runs[:, :1] + np.arange(width))
                  and not (runs[:, 0] % width).any()
                  and runtime_offsets_commute(inst.dst, dst_offsets, width))
            conds = global_conditions(inst.src, inst.offsets, width) if ok else None
            if conds is not None:
                return VectorAccess(width, width * eb, conds)
        width //= 2
    return None


def vectorize(program: Program) -> Program:
    """Attach a :class:`VectorAccess` to every memory instruction that allows one."""

    def visit(inst):
        if inst.impl is not None or not isinstance(
                inst, (LoadGlobal, StoreGlobal, LoadShared, StoreShared, CopyAsync, AtomicAdd)):
            return inst
        plan = _plan(inst)
        return inst if plan is None else dataclasses.replace(inst, impl=plan)

    return map_instructions(program, visit)
