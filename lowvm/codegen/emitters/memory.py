"""CUDA of the memory instructions (:mod:`lowvm.instructions.memory`): the per-element
code, and :func:`global_ref`, the address and bounds test of a global element that the
vector lowerings share."""

from __future__ import annotations

import numpy as np

from lowvm.codegen.context import CudaContext
from lowvm.codegen.emitters.control import emit_sync
from lowvm.codegen.emitters.registry import register_emitter
from lowvm.expr import const_value, is_const
from lowvm.instructions.control import Sync
from lowvm.instructions.memory import (
    AllocShared,
    CommitGroup,
    CopyAsync,
    FreeShared,
    GlobalView,
    LoadGlobal,
    LoadShared,
    LoadUniform,
    PrefetchL2,
    StoreGlobal,
    StoreShared,
    WaitGroup,
)
from lowvm.ir import GlobalTensor, RegisterTensor, SharedTensor

__all__ = ["global_ref", "PREFETCH_BYTES"]

#: bytes per ``prefetch.global.L2``: one 32-byte sector, the L2's unit of DRAM traffic,
#: so the hint covers every byte of a run that starts on a sector (a run that does not
#: may leave its last sector to the load)
PREFETCH_BYTES = 32


@register_emitter(GlobalView)
def emit_global_view(inst: GlobalView, cg: CudaContext) -> None:
    cg.line(f"// {inst}")


@register_emitter(LoadGlobal)
def emit_load_global(inst: LoadGlobal, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    _emit_global_access(cg, inst.src, inst.offsets, inst.out, load=True,
                        coherent=inst.coherent, inbounds=bool(inst.inbounds))


@register_emitter(LoadUniform)
def emit_load_uniform(inst: LoadUniform, cg: CudaContext) -> None:
    cg.line(f"// {inst.var.name} = {inst}")
    cg.line(f"int {inst.var.name};")
    with cg.block(""):  # its own scope: global_ref's index names stay local
        ref, _ = global_ref(cg, inst.src, inst.offsets, ["0"] * inst.src.rank)
        cg.line(f"{inst.var.name} = {ref};")


@register_emitter(StoreGlobal)
def emit_store_global(inst: StoreGlobal, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    _emit_global_access(cg, inst.dst, inst.offsets, inst.src, load=False)


@register_emitter(AllocShared)
def emit_alloc_shared(inst: AllocShared, cg: CudaContext) -> None:
    cg.line(f"// {inst} at shared byte {cg.shared_offsets[inst.out]}")
    if inst.out in cg.reused_tiles:  # freed space: every thread is done with it first
        emit_sync(Sync(loc=inst.loc), cg)


@register_emitter(FreeShared)
def emit_free_shared(inst: FreeShared, cg: CudaContext) -> None:
    cg.line(f"// free_shared %{inst.tensor.name}")


@register_emitter(LoadShared)
def emit_load_shared(inst: LoadShared, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    _emit_shared_access(cg, inst.src, inst.offsets, inst.out, load=True)


@register_emitter(StoreShared)
def emit_store_shared(inst: StoreShared, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    _emit_shared_access(cg, inst.dst, inst.offsets, inst.src, load=False)


@register_emitter(PrefetchL2)
def emit_prefetch_l2(inst: PrefetchL2, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    per = max(1, PREFETCH_BYTES * 8 // inst.src.dtype.nbits)  # elements per sector
    shape = inst.shape
    # rows that continue each other in memory (whole rows of a dense tensor) form one
    # run, so a sector is never asked for twice
    layout, width = inst.src.layout, shape[-1]
    merged = (len(shape) >= 2 and const_value(layout.shape[-1]) == width
              and const_value(layout.strides[-1]) == 1
              and const_value(layout.strides[-2]) == width)
    outer = shape[:-2] if merged else shape[:-1]
    run = shape[-2] * width if merged else width
    sectors = -(-run // per)
    total = int(np.prod(outer)) * sectors
    threads = cg.program.num_threads
    # whole 16-byte chunks, contiguous (merged runs are; a row must have stride 1)
    bulk = (run * inst.src.dtype.nbits % 128 == 0
            and const_value(layout.strides[-1]) == 1)
    if bulk:  # sm_90: one bulk prefetch per run, where it is aligned and inside
        cg.line("#if __CUDA_ARCH__ >= 900")
        _emit_prefetch_bulk(inst, cg, outer, merged, run * inst.src.dtype.nbits // 8)
        cg.line("#else")
    with cg.block(f"for (int e = tid; e < {total}; e += {threads})"):
        cg.line(f"const int f = (e % {sectors}) * {per};")
        index = _unravel(cg, f"e / {sectors}", outer) + (
            [f"f / {width}", f"f % {width}"] if merged else ["f"])
        ref, inside = global_ref(cg, inst.src, inst.offsets, index)
        cg.line(f'if ({inside}) asm volatile("prefetch.global.L2 [%0];" :: '
                f'"l"(&{ref}));')
    if bulk:
        cg.line("#endif")


def _emit_prefetch_bulk(inst: PrefetchL2, cg: CudaContext, outer, merged: bool,
                        nbytes: int) -> None:
    """Each run (a row, or whole rows merged) as one ``cp.async.bulk.prefetch.L2``:
    one instruction per run instead of one per sector. A run not wholly inside the
    tensor, or not 16-byte aligned, is skipped (a hint may be dropped)."""
    count = int(np.prod(outer))
    with cg.block(f"for (int e = tid; e < {count}; e += {cg.program.num_threads})"):
        index = _unravel(cg, "e", outer) + ["0"] * (2 if merged else 1)
        ref, inside = global_ref(cg, inst.src, inst.offsets, index)
        rank = inst.src.rank
        last = list(inst.shape[-2:]) if merged else [inst.shape[-1]]
        ends = [f"i{rank - len(last) + j} + {size - 1} < "
                f"{cg.expr(inst.src.layout.shape[rank - len(last) + j])}"
                for j, size in enumerate(last)]
        cg.line(f"const unsigned long long lowvm_at = "
                f"reinterpret_cast<unsigned long long>(&{ref});")
        cond = " && ".join([inside] + ends + ["(lowvm_at & 15) == 0"])
        cg.line(f'if ({cond}) asm volatile("cp.async.bulk.prefetch.L2.global [%0], '
                f'{nbytes};" :: "l"(lowvm_at) : "memory");')


@register_emitter(CopyAsync)
def emit_copy_async(inst: CopyAsync, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    shape = inst.tile_shape
    total = int(np.prod(shape))
    threads = cg.program.num_threads
    with cg.block(f"for (int e = tid; e < {total}; e += {threads})"):
        index = _unravel(cg, "e", shape)
        ref, inside = global_ref(cg, inst.src, inst.offsets, index)
        lead = inst.dst.rank - len(shape)
        start = [cg.expr(o) for o in inst.dst_start]
        dst_index = start[:lead] + [f"{o} + {j}" for o, j in zip(start[lead:], index)]
        cg.line(f"{cg.shared_ref(inst.dst, cg.shared_offset(inst.dst, dst_index))} = "
                f"({inside}) ? {ref} : {_zero(inst.dst.dtype)};")


@register_emitter(CommitGroup)
def emit_commit_group(inst: CommitGroup, cg: CudaContext) -> None:
    cg.line("// commit_group")
    cg.line('asm volatile("cp.async.commit_group;\\n" ::: "memory");')


@register_emitter(WaitGroup)
def emit_wait_group(inst: WaitGroup, cg: CudaContext) -> None:
    cg.line(f"// wait_group {inst.n}")
    cg.line(f'asm volatile("cp.async.wait_group {inst.n};\\n" ::: "memory");')


def _zero(dt) -> str:
    from lowvm.dtypes import bfloat16, float16

    if dt == float16:
        return "__ushort_as_half(0)"
    if dt == bfloat16:
        return "__ushort_as_bfloat16(0)"
    return "0"


def global_ref(cg: CudaContext, tensor: GlobalTensor, offsets, index: list[str],
               wide: bool = False) -> tuple[str, str]:
    """(element lvalue, in-bounds condition) of ``offsets + index`` in a global view;
    ``wide``: runtime strides multiply through ``lowvm_wide`` (one ``mul.wide.s32``;
    for an address computed once per K step: elsewhere the asm keeps ptxas from
    rearranging, which cost the prefill GEMM a spill)."""
    conds, terms = [], []
    for d, (off, rel) in enumerate(zip(offsets, index)):
        cg.line(f"const int i{d} = {cg.expr(off)} + {rel};")
        conds.append(f"i{d} >= 0 && i{d} < {cg.expr(tensor.layout.shape[d])}")
        stride = tensor.layout.strides[d]
        terms.append(f"lowvm_wide(i{d}, {cg.expr(stride)})" if wide and not is_const(stride)
                     else f"(lowvm_i64)i{d} * {cg.expr(stride)}")
    return f"{tensor.pointer.name}[{' + '.join(terms)}]", " && ".join(conds)


def _unravel(cg: CudaContext, flat: str, shape) -> list[str]:
    """Emit ``j0 ..`` = the row-major index of the flat element ``flat`` in ``shape``;
    return their names."""
    names, rest = [], flat
    for d in reversed(range(len(shape))):
        cg.line(f"const int j{d} = ({rest}) % {shape[d]};")
        names.insert(0, f"j{d}")
        rest = f"({rest}) / {shape[d]}"
    return names


def _emit_global_access(cg: CudaContext, tensor: GlobalTensor, offsets, tile: RegisterTensor,
                        load: bool, coherent: bool = False, inbounds: bool = False) -> None:
    lay = tile.layout
    cg.line("#pragma unroll")
    with cg.block(f"for (int l = 0; l < {lay.local_size}; ++l)"):
        index = [cg.index(lay, d) for d in range(lay.rank)]
        ref, inside = global_ref(cg, tensor, offsets, index)
        if load:
            value = f"__ldcg(&{ref})" if coherent else ref
            if inbounds:  # asserted by the program, checked by the interpreter
                cg.line(f"{cg.raw_get(tile, 'l')} = {value};")
            else:
                cg.line(f"{cg.raw_get(tile, 'l')} = ({inside}) ? {value} : "
                        f"{_zero(tile.dtype)};")
        else:
            cg.line(f"if ({inside}) {ref} = {cg.raw_get(tile, 'l')};")


def _emit_shared_access(cg: CudaContext, tensor: SharedTensor, offsets, tile: RegisterTensor,
                        load: bool) -> None:
    lay = tile.layout
    cg.line("#pragma unroll")
    with cg.block(f"for (int l = 0; l < {lay.local_size}; ++l)"):
        lead = tensor.rank - lay.rank  # leading shared dims: selected by offset only
        index = [cg.expr(o) for o in offsets[:lead]]
        for d in range(lay.rank):
            cg.line(f"const int i{d} = {cg.expr(offsets[lead + d])} + {cg.index(lay, d)};")
            index.append(f"i{d}")
        ref = cg.shared_ref(tensor, cg.shared_offset(tensor, index))
        if load:
            cg.line(f"{cg.raw_get(tile, 'l')} = {ref};")
        else:
            cg.line(f"{ref} = {cg.raw_get(tile, 'l')};")
