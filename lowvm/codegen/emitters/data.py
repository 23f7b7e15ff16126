"""CUDA of the data instructions (:mod:`lowvm.instructions.data`)."""

from __future__ import annotations

import numpy as np

from lowvm.codegen.context import CudaContext
from lowvm.codegen.emitters.registry import register_emitter
from lowvm.codegen.fast_cast import emit_fast_cast
from lowvm.expr import const_value
from lowvm.instructions.data import (
    Assign,
    Cast,
    Extract,
    Permute,
    RegisterInit,
    ThreadIndex,
    View,
)

__all__ = ["emit_register_init", "emit_view", "emit_cast", "emit_same_registers",
           "emit_extract", "emit_thread_index"]


@register_emitter(RegisterInit)
def emit_register_init(inst: RegisterInit, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    value = cg.expr(inst.value)
    is_float = isinstance(const_value(inst.value), float)
    cg.line("#pragma unroll")
    with cg.block(f"for (int l = 0; l < {inst.out.layout.local_size}; ++l)"):
        cg.line(cg.set(inst.out, "l", value, is_float))


@register_emitter(View)
def emit_view(inst: View, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    nbytes = -(-inst.src.layout.local_size * inst.src.dtype.nbits // 8)
    cg.line(f"memcpy({cg.name(inst.out)}, {cg.name(inst.src)}, {nbytes});")


@register_emitter(Cast)
def emit_cast(inst: Cast, cg: CudaContext) -> None:
    # bit-manipulation casts first (:mod:`lowvm.codegen.fast_cast`)
    if emit_fast_cast(inst, cg):
        return
    cg.line(f"// {inst}")
    perm = inst.permutation()
    if perm is None or (perm == np.arange(perm.size)).all():
        cg.line("#pragma unroll")
        with cg.block(f"for (int l = 0; l < {inst.out.layout.local_size}; ++l)"):
            cg.line(cg.set(inst.out, "l", cg.get(inst.src, "l"), inst.src.dtype.is_float))
        return
    for dst, src in enumerate(perm):
        cg.line(cg.set(inst.out, str(dst), cg.get(inst.src, str(int(src))),
                       inst.src.dtype.is_float))


@register_emitter(Permute, Assign)
def emit_same_registers(inst: Permute | Assign, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    cg.line(f"memcpy({cg.name(inst.out)}, {cg.name(inst.src)}, sizeof({cg.name(inst.src)}));")


@register_emitter(Extract)
def emit_extract(inst: Extract, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    for dst, src in enumerate(inst.local_map()):
        cg.line(f"{cg.raw_get(inst.out, str(dst))} = {cg.raw_get(inst.src, str(src))};")


@register_emitter(ThreadIndex)
def emit_thread_index(inst: ThreadIndex, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    cg.line(f"{cg.name(inst.out)}[0] = tid;")
