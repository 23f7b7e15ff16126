"""CUDA of reductions (:mod:`lowvm.instructions.reduce`).

On the GPU (:func:`shuffle_plan`): each thread first combines its own elements, then
warp shuffles combine lanes, then shared memory combines warps; a layout whose thread
bits do not split cleanly into "moves along ``dim``", "moves along the others" and
"replicates" takes the general path (the whole tile through shared memory). The GPU adds
in float32 (the interpreter rounds the exact sum once: the order differs).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from lowvm.codegen.context import CudaContext
from lowvm.codegen.emitters.registry import register_emitter
from lowvm.instructions.reduce import Reduce
from lowvm.layouts import RegisterLayout

__all__ = ["emit_reduce", "shuffle_plan", "ShufflePlan"]


@register_emitter(Reduce)
def emit_reduce(inst: Reduce, cg: CudaContext) -> None:
    plan = shuffle_plan(inst.src.layout, inst.out.layout, inst.dim)
    if plan is not None:
        _emit_shuffles(inst, cg, plan)
        return
    cg.line(f"// {inst}  (through shared scratch)")
    src, out = inst.src, inst.out
    ctype = cg.compute_type(src.dtype)
    cg.scratch(4 * src.layout.size)
    combine = {"sum": "acc + v", "max": "max(acc, v)", "min": "min(acc, v)"}[inst.op]
    if src.dtype.is_float:
        combine = {"sum": "acc + v", "max": "fmaxf(acc, v)", "min": "fminf(acc, v)"}[inst.op]
    with cg.block(""):
        cg.line(f"{ctype}* sc = reinterpret_cast<{ctype}*>(lowvm_smem + lowvm_scratch);")
        cg.line("__syncthreads();")
        cg.line("#pragma unroll")
        with cg.block(f"for (int l = 0; l < {src.layout.local_size}; ++l)"):
            flat = cg.flat_index(src.layout, src.shape)
            cg.line(f"sc[{flat}] = {cg.get(src, 'l')};")
        cg.line("__syncthreads();")
        cg.line("#pragma unroll")
        with cg.block(f"for (int l = 0; l < {out.layout.local_size}; ++l)"):
            index = []
            for d in range(src.rank):
                if d == inst.dim:
                    index.append("j")
                else:
                    od = d if inst.keepdims or d < inst.dim else d - 1
                    index.append(f"({cg.index(out.layout, od)})")
            flat = " + ".join(f"{i} * {cg.row_major_stride(src.shape, d)}"
                              for d, i in enumerate(index))
            cg.line(f"{ctype} acc = sc[{flat.replace('j', '0')}];")
            with cg.block(f"for (int j = 1; j < {src.shape[inst.dim]}; ++j)"):
                cg.line(f"{ctype} v = sc[{flat}];")
                cg.line(f"acc = {combine};")
            cg.line(cg.set(out, "l", "acc", src.dtype.is_float))
        cg.line("__syncthreads();")


def _emit_shuffles(inst: Reduce, cg: CudaContext, plan: ShufflePlan) -> None:
    src, out = inst.src, inst.out
    ctype = cg.compute_type(src.dtype)
    fn = {"sum": "{a} + {b}", "max": "max({a}, {b})", "min": "min({a}, {b})"}[inst.op]
    if src.dtype.is_float:
        fn = {"sum": "{a} + {b}", "max": "fmaxf({a}, {b})",
              "min": "fminf({a}, {b})"}[inst.op]
    where = f"{len(plan.lane_masks)} lane shuffles" + (
        f", {len(plan.warp_masks) + 1} warps through shared" if plan.warp_masks else "")
    cg.line(f"// {inst}  (registers, {where})")
    groups = len(plan.groups)
    with cg.block(""):
        for g, members in enumerate(plan.groups):
            acc = cg.get(src, str(members[0]))
            for m in members[1:]:
                acc = fn.format(a=acc, b=cg.get(src, str(m)))
            cg.line(f"{ctype} p{g} = {acc};")
        for mask in plan.lane_masks:
            for g in range(groups):
                cg.line(f"p{g} = " + fn.format(
                    a=f"p{g}", b=f"__shfl_xor_sync(0xffffffffu, p{g}, {mask})") + ";")
        if plan.warp_masks:
            cg.scratch(4 * groups * src.layout.num_threads)
            cg.line(f"{ctype}* sc = reinterpret_cast<{ctype}*>(lowvm_smem + lowvm_scratch);")
            cg.line("__syncthreads();")
            for g in range(groups):
                cg.line(f"sc[tid * {groups} + {g}] = p{g};")
            cg.line("__syncthreads();")
            for mask in plan.warp_masks:
                for g in range(groups):
                    cg.line(f"p{g} = " + fn.format(
                        a=f"p{g}", b=f"sc[(tid ^ {mask}) * {groups} + {g}]") + ";")
            cg.line("__syncthreads();")
        for lo, g in enumerate(plan.out_groups):
            cg.line(cg.set(out, str(lo), f"p{g}", src.dtype.is_float))


class ShufflePlan(NamedTuple):
    """How a reduction runs in registers: ``groups[g]``, the locals a thread combines into
    partial ``g`` (the same for every thread); ``lane_masks``/``warp_masks``, the thread
    xor-distances combined by shuffles and through shared memory (every nonzero
    combination of the warp bits); ``out_groups[l]``, the partial result local ``l`` takes."""

    groups: tuple[tuple[int, ...], ...]
    lane_masks: tuple[int, ...]
    warp_masks: tuple[int, ...]
    out_groups: tuple[int, ...]


def shuffle_plan(src: RegisterLayout, out: RegisterLayout, dim: int) -> ShufflePlan | None:
    """The register plan of reducing ``src`` over ``dim`` into ``out`` (its reduce layout,
    with or without the kept dim), or None where the layout does not allow one.

    The plan is checked, not trusted: every (thread, output) must combine each logical
    element of its row along ``dim`` exactly once (so sums count nothing twice)."""
    threads, size_d = src.num_threads, src.shape[dim]
    if threads < 32 or threads & (threads - 1) or out.num_threads != threads:
        return None
    table = src.table                                  # [T, L, rank]
    keys = np.delete(table, dim, axis=2)               # what the result is indexed by
    along = table[..., dim]

    def partition(t: int) -> list[tuple[int, ...]]:
        seen: dict[bytes, list[int]] = {}
        for local in range(src.local_size):
            seen.setdefault(keys[t, local].tobytes(), []).append(local)
        return [tuple(v) for v in seen.values()]

    groups = partition(0)
    if any(sorted(partition(t)) != sorted(groups) for t in range(1, threads)):
        return None
    reduce_bits = []
    for bit in range(threads.bit_length() - 1):
        partner = np.arange(threads) ^ (1 << bit)
        same_key = (keys[partner] == keys).all(axis=2)
        same_pos = along[partner] == along
        if same_key.all() and same_pos.all():
            continue                                   # a replication bit
        if same_key.all() and not same_pos.any():
            reduce_bits.append(1 << bit)               # moves along dim only
        elif same_key.any():
            return None                                # mixed: the general path
    combos = [0]
    for b in reduce_bits:
        combos += [c | b for c in combos]
    for t in range(threads):                           # each element exactly once
        for members in groups:
            got = sorted(int(along[t ^ c, m]) for c in combos for m in members)
            if got != list(range(size_d)):
                return None
    out_keys = out.table
    if out.rank == src.rank:                           # keepdims
        out_keys = np.delete(out_keys, dim, axis=2)
    out_groups = []
    for local in range(out.local_size):
        found = None
        for g, members in enumerate(groups):
            if (out_keys[:, local] == keys[:, members[0]]).all():
                found = g
                break
        if found is None:
            return None
        out_groups.append(found)
    lane = tuple(b for b in reduce_bits if b < 32)
    warp_bits = [b for b in reduce_bits if b >= 32]
    warp_combos = [0]
    for b in warp_bits:
        warp_combos += [c | b for c in warp_combos]
    return ShufflePlan(tuple(groups), lane, tuple(warp_combos[1:]), tuple(out_groups))
