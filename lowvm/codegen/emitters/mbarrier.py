"""CUDA of the mbarrier instructions (:mod:`lowvm.instructions.mbarrier`): PTX
``mbarrier.*`` on the barriers' shared-memory words."""

from __future__ import annotations

from lowvm.codegen.context import CudaContext
from lowvm.codegen.emitters.registry import register_emitter
from lowvm.instructions.mbarrier import (
    AllocBarriers,
    MbarrierArrive,
    MbarrierExpectTx,
    MbarrierWait,
)
from lowvm.ir import BarrierTensor

__all__ = ["barrier_address"]


def barrier_address(cg: CudaContext, barriers: BarrierTensor, index) -> str:
    """The 32-bit shared address of barrier ``index`` (a C expression)."""
    base = cg.shared_offsets[barriers]
    return f"lowvm_smem_addr(lowvm_smem + {base} + 8 * ({cg.expr(index)}))"


@register_emitter(AllocBarriers)
def emit_alloc_barriers(inst: AllocBarriers, cg: CudaContext) -> None:
    cg.uses_tensor_copies = True
    base = cg.shared_offsets[inst.out]
    cg.line(f"// {inst.mnemonic} %{inst.out.name}: {inst.format_args()} at shared byte {base}")
    with cg.block(f"if ({cg.thread} == 0)"):
        cg.line("#pragma unroll 1")
        with cg.block(f"for (int b = 0; b < {inst.out.count}; ++b)"):
            cg.line(f'asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: '
                    f'"r"(lowvm_smem_addr(lowvm_smem + {base} + 8 * b)), '
                    f'"r"({inst.out.arrivals}) : "memory");')
        cg.line('asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");')
    cg.barrier()


@register_emitter(MbarrierArrive)
def emit_mbarrier_arrive(inst: MbarrierArrive, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    cg.line(f'asm volatile("{{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }}" '
            f':: "r"({barrier_address(cg, inst.barriers, inst.index)}) : "memory");')


@register_emitter(MbarrierExpectTx)
def emit_mbarrier_expect_tx(inst: MbarrierExpectTx, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    cg.line(f'if ({cg.thread} == 0) asm volatile("{{ .reg .b64 st; '
            f'mbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1; }}" :: '
            f'"r"({barrier_address(cg, inst.barriers, inst.index)}), "r"({inst.nbytes}) : '
            '"memory");')


@register_emitter(MbarrierWait)
def emit_mbarrier_wait(inst: MbarrierWait, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    with cg.block(""):
        cg.line(f"const unsigned lowvm_bar = {barrier_address(cg, inst.barriers, inst.index)};")
        cg.line(f"const unsigned lowvm_parity = {cg.expr(inst.parity)};")
        cg.line("unsigned lowvm_done;")
        with cg.block("do"):
            cg.line('asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 '
                    'p, [%1], %2; selp.u32 %0, 1, 0, p; }" : "=r"(lowvm_done) : '
                    '"r"(lowvm_bar), "r"(lowvm_parity) : "memory");')
        cg.lines[-1] += " while (!lowvm_done);"
