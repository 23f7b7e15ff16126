"""CUDA of the control instructions (:mod:`lowvm.instructions.control`)."""

from __future__ import annotations

from lowvm.codegen.context import CudaContext
from lowvm.codegen.emitters.registry import register_emitter
from lowvm.instructions.control import Sync, WaitPriorGrid

__all__ = ["emit_sync", "emit_wait_prior_grid"]


@register_emitter(Sync)
def emit_sync(inst: Sync, cg: CudaContext) -> None:
    if cg.uses_async_proxy:  # this thread's shared writes, then wgmma's reads of them
        cg.line('asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory");')
    cg.line("__syncthreads();  // sync")


@register_emitter(WaitPriorGrid)
def emit_wait_prior_grid(inst: WaitPriorGrid, cg: CudaContext) -> None:
    cg.waits_prior_grid = True
    cg.line("#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900")
    cg.line('asm volatile("griddepcontrol.wait;" ::: "memory");  // wait_prior_grid')
    cg.line("#endif")
