"""CUDA of the copy-engine instructions (:mod:`lowvm.instructions.tma`): PTX
``cp.async.bulk.tensor`` through the kernel's tensor maps, and ``cp.async.bulk``."""

from __future__ import annotations

import math

from lowvm.codegen.context import CudaContext
from lowvm.codegen.emitters.mbarrier import barrier_address
from lowvm.codegen.emitters.memory import global_ref
from lowvm.codegen.emitters.registry import register_emitter
from lowvm.expr import const_value
from lowvm.instructions.tma import CopyBulk, CopyTma, StoreTma, StoreTmaWait
from lowvm.ir import SharedTensor

__all__: list[str] = []


def _tile_address(cg: CudaContext, tensor: SharedTensor, start) -> str:
    """The shared address of the box at leading offsets ``start`` of ``tensor`` (boxes
    start on whole swizzle patterns, so the swizzle leaves the offset as it is)."""
    lay = tensor.layout
    terms = [f"({cg.expr(o)}) * {st * tensor.dtype.nbits // 8}"
             for o, st in zip(start, lay.strides) if const_value(o) != 0]
    offset = " + ".join([str(cg.shared_offsets[tensor]), *terms])
    return f"lowvm_smem_addr(lowvm_smem + {offset})"


def _coordinates(cg: CudaContext, offsets, first: int) -> tuple[str, list[str]]:
    """The PTX operand list (``%first, ...``) and the C values of a copy's coordinates,
    innermost dim first as a tensor map counts them."""
    values = [f"(int)({cg.expr(o)})" for o in reversed(offsets)]
    return ", ".join(f"%{first + i}" for i in range(len(values))), values


@register_emitter(CopyTma)
def emit_copy_tma(inst: CopyTma, cg: CudaContext) -> None:
    cg.uses_tensor_copies = True
    cg.line(f"// {inst}")
    tmap = cg.tensor_maps.name_for(inst.src, inst.box, inst.swizzle, inst.loc)
    rank = inst.src.rank
    operands, coords = _coordinates(cg, inst.offsets, 2)
    args = ", ".join([f'"r"({_tile_address(cg, inst.dst, inst.dst_start)})',
                      f'"l"(reinterpret_cast<unsigned long long>(&{tmap}))',
                      *[f'"r"({c})' for c in coords],
                      f'"r"({barrier_address(cg, inst.barriers, inst.index)})'])
    cg.line(f'if ({cg.thread} == 0) asm volatile("cp.async.bulk.tensor.{rank}d.shared::cluster'
            f'.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {{{operands}}}], '
            f'[%{2 + rank}];" :: {args} : "memory");')


@register_emitter(CopyBulk)
def emit_copy_bulk(inst: CopyBulk, cg: CudaContext) -> None:
    cg.uses_tensor_copies = True
    cg.line(f"// {inst}")
    shape, layout = inst.shape, inst.src.layout
    # rows that continue each other in memory (constant strides of a dense tile) are one
    strides = [const_value(st) for st in layout.strides]
    merged = strides[-1] == 1 and all(strides[d] == strides[d + 1] * shape[d + 1]
                                      for d in range(len(shape) - 1))
    runs = 1 if merged else math.prod(shape[:-1])
    run_elems = math.prod(shape) if merged else shape[-1]
    nbytes = run_elems * inst.src.dtype.nbits // 8
    row_bytes = shape[-1] * inst.src.dtype.nbits // 8  # the destination is row-major
    bar = barrier_address(cg, inst.barriers, inst.index)
    base = _tile_address(cg, inst.dst, inst.dst_start)
    with cg.block(f"for (int r = {cg.thread}; r < {runs}; r += 32)"):
        outer = []
        rest = "r"
        for d in reversed(range(len(shape) - 1)):
            outer.insert(0, "0" if merged else f"({rest}) % {shape[d]}")
            rest = f"({rest}) / {shape[d]}"
        ref, _ = global_ref(cg, inst.src, inst.offsets, [*outer, "0"])
        cg.line(f'asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx'
                f'::bytes [%0], [%1], {nbytes}, [%2];" :: "r"({base} + r * {row_bytes}), '
                f'"l"(&{ref}), "r"({bar}) : "memory");')


@register_emitter(StoreTma)
def emit_store_tma(inst: StoreTma, cg: CudaContext) -> None:
    cg.uses_tensor_copies = True
    cg.line(f"// {inst}")
    tmap = cg.tensor_maps.name_for(inst.dst, inst.box, inst.swizzle, inst.loc)
    rank = inst.dst.rank
    # the threads' shared writes, then the copy engine's read of them
    cg.line('asm volatile("fence.proxy.async.shared::cta;" ::: "memory");')
    cg.barrier()
    operands, coords = _coordinates(cg, inst.offsets, 1)
    args = ", ".join([f'"l"(reinterpret_cast<unsigned long long>(&{tmap}))',
                      *[f'"r"({c})' for c in coords],
                      f'"r"({_tile_address(cg, inst.src, inst.src_start)})'])
    with cg.block(f"if ({cg.thread} == 0)"):
        cg.line(f'asm volatile("cp.async.bulk.tensor.{rank}d.global.shared::cta.tile'
                f'.bulk_group [%0, {{{operands}}}], [%{1 + rank}];" :: {args} : "memory");')
        cg.line('asm volatile("cp.async.bulk.commit_group;" ::: "memory");')


@register_emitter(StoreTmaWait)
def emit_store_tma_wait(inst: StoreTmaWait, cg: CudaContext) -> None:
    cg.line(f"// {inst.mnemonic}")
    cg.line(f'if ({cg.thread} == 0) asm volatile("cp.async.bulk.wait_group.read 0;" ::: '
            '"memory");')
    cg.barrier()
