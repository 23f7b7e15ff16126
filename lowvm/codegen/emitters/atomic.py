"""CUDA of the atomic instructions (:mod:`lowvm.instructions.atomic`)."""

from __future__ import annotations

from lowvm.codegen.context import CudaContext
from lowvm.codegen.emitters.memory import global_ref
from lowvm.codegen.emitters.memory_selected import guarded
from lowvm.codegen.emitters.registry import register_emitter
from lowvm.instructions.atomic import Arrive, AtomicAdd
from lowvm.instructions.plans import VectorAccess

__all__ = ["emit_atomic_add", "emit_vector_atomic_add", "emit_arrive"]


@register_emitter(AtomicAdd)
def emit_atomic_add(inst: AtomicAdd, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    lay = inst.src.layout
    cg.line("#pragma unroll")
    with cg.block(f"for (int l = 0; l < {lay.local_size}; ++l)"):
        index = [cg.index(lay, d) for d in range(lay.rank)]
        ref, inside = global_ref(cg, inst.dst, inst.offsets, index)
        cg.line(f"if ({inside}) atomicAdd(&{ref}, {cg.raw_get(inst.src, 'l')});")


@register_emitter(AtomicAdd, impl=VectorAccess)
def emit_vector_atomic_add(inst: AtomicAdd, cg: CudaContext) -> None:
    """Runs of 2 or 4 float32 added by one ``red.global.add.v2/v4.f32`` (sm_90): the L2
    takes one request where it took 2 or 4, which is what a split-K reduction of many
    rows queues on. Older GPUs add element by element."""
    access, lay, src = inst.impl, inst.src.layout, inst.src
    width = access.width
    regs = ", ".join(f"%{1 + i}" for i in range(width))
    values = ", ".join(f'"f"({cg.raw_get(src, f"l + {i}")})' for i in range(width))

    def body() -> None:
        cg.line("#pragma unroll")
        with cg.block(f"for (int l = 0; l < {lay.local_size}; l += {width})"):
            index = [cg.index(lay, d) for d in range(lay.rank)]
            ref, inside = global_ref(cg, inst.dst, inst.offsets, index)
            cg.line("#if __CUDA_ARCH__ >= 900")
            cg.line(f'if ({inside}) asm volatile("red.global.add.v{width}.f32 [%0], '
                    f'{{{regs}}};" :: "l"(&{ref}), {values} : "memory");')
            cg.line("#else")
            with cg.block(f"if ({inside})"):
                for i in range(width):
                    cg.line(f"atomicAdd(&{ref} + {i}, {cg.raw_get(src, f'l + {i}')});")
            cg.line("#endif")

    cg.line(f"// {inst}")
    guarded(cg, inst, access, body)


@register_emitter(Arrive)
def emit_arrive(inst: Arrive, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    ticket = cg.fresh("lowvm_ticket")
    cg.line(f"__shared__ unsigned {ticket};")
    cg.static_shared_bytes += 4
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
