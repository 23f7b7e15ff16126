"""CUDA of the atomic instructions (:mod:`lowvm.instructions.atomic`)."""

from __future__ import annotations

from lowvm.codegen.context import CudaContext
from lowvm.codegen.emitters.memory import global_ref
from lowvm.codegen.emitters.registry import register_emitter
from lowvm.instructions.atomic import Arrive, AtomicAdd

__all__ = ["emit_atomic_add", "emit_arrive"]


@register_emitter(AtomicAdd)
def emit_atomic_add(inst: AtomicAdd, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    lay = inst.src.layout
    cg.line("#pragma unroll")
    with cg.block(f"for (int l = 0; l < {lay.local_size}; ++l)"):
        index = [cg.index(lay, d) for d in range(lay.rank)]
        ref, inside = global_ref(cg, inst.dst, inst.offsets, index)
        cg.line(f"if ({inside}) atomicAdd(&{ref}, {cg.raw_get(inst.src, 'l')});")


@register_emitter(Arrive)
def emit_arrive(inst: Arrive, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    ticket = cg.fresh("lowvm_ticket")
    cg.line(f"__shared__ unsigned {ticket};")
    # the barrier orders every thread's writes before thread 0's release fence, and
    # thread 0's acquire fence before every thread's reads (fences are cumulative over
    # what the barrier ordered), so one thread fences for the block, at acq_rel
    # strength: no sequentially consistent MEMBAR in every warp on the tile's tail
    cg.line("__syncthreads();  // the block's writes, then thread 0 releases them")
    with cg.block("if (tid == 0)"):  # its own scope: index names stay local
        cg.line('asm volatile("fence.acq_rel.gpu;" ::: "memory");')
        ref, _ = global_ref(cg, inst.counter, inst.offsets, ["0"] * inst.counter.rank)
        cg.line(f"{ticket} = atomicInc(reinterpret_cast<unsigned*>(&{ref}), "
                f"(unsigned)({cg.expr(inst.count)}) - 1u);")
        cg.line('asm volatile("fence.acq_rel.gpu;" ::: "memory");')
    cg.line("__syncthreads();  // earlier arrivals' writes, acquired by thread 0")
    cg.line(f"const int {inst.var.name} = (int){ticket};")
