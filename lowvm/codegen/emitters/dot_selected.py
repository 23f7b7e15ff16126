"""CUDA of the dots the passes selected (``inst.impl``): ``mma.sync`` (:class:`MmaPlan`)
and Hopper's ``wgmma`` (:class:`WgmmaPlan`)."""

from __future__ import annotations

from lowvm.codegen.context import CudaContext
from lowvm.codegen.emitters.registry import register_emitter
from lowvm.instructions.dot import Dot, DotShared
from lowvm.instructions.plans import MmaPlan, WgmmaPlan

__all__ = ["emit_mma", "emit_wgmma"]


_PTX_TYPES = {"float16": "f16", "bfloat16": "bf16", "int8": "s8", "uint8": "u8"}


@register_emitter(Dot, impl=MmaPlan)
def emit_mma(inst: Dot, cg: CudaContext) -> None:
    plan = inst.impl
    cg.line(f"// {inst}")
    atom, dt = plan.atom, inst.a.dtype
    nbits = dt.nbits
    ra = atom.a.local_size * nbits // 32
    rb = atom.b.local_size * nbits // 32
    rc = atom.c.local_size
    out = cg.name(inst.out)
    if inst.out is not inst.c:
        cg.line(f"memcpy({out}, {cg.name(inst.c)}, sizeof({out}));")
    is_float = dt.is_float
    acc_t, acc_c = ("f32", "f") if is_float else ("s32", "r")
    ptx = _PTX_TYPES[dt.name]
    a = f"reinterpret_cast<const lowvm_u32*>({cg.name(inst.a)})"
    b = f"reinterpret_cast<const lowvm_u32*>({cg.name(inst.b)})"
    op = f"mma.sync.aligned.{atom.name}.row.col.{acc_t}.{ptx}.{ptx}.{acc_t}"
    d_regs = ", ".join(f"%{i}" for i in range(rc))
    a_regs = ", ".join(f"%{rc + i}" for i in range(ra))
    b_regs = ", ".join(f"%{rc + ra + i}" for i in range(rb))
    c_regs = ", ".join(f"%{i}" for i in range(rc))
    for ci, la, lb in plan.steps:
        outs = ", ".join(f'"+{acc_c}"({out}[{ci * rc + i}])' for i in range(rc))
        ins = ", ".join([f'"r"({a}[{la * ra + i}])' for i in range(ra)]
                        + [f'"r"({b}[{lb * rb + i}])' for i in range(rb)])
        cg.line(f'asm volatile("{op} {{{d_regs}}}, {{{a_regs}}}, {{{b_regs}}}, '
                f'{{{c_regs}}};\\n" : {outs} : {ins});')


@register_emitter(DotShared, impl=WgmmaPlan)
def emit_wgmma(inst: DotShared, cg: CudaContext) -> None:
    """One ``wgmma`` per 64-row tile and 16 of K: A from registers, B through a shared
    memory descriptor (128-byte swizzle, 8-row groups 1024 bytes apart; a K slice is the
    start address advanced by 32 bytes inside the swizzled row, the swizzle being applied
    by the hardware on the address bits), then committed and waited for (``wait=False``
    too, see below), so the registers and the shared tile are free again when the
    instruction ends."""
    plan = inst.impl
    cg.line(f"// {inst}")
    lead = inst.b.rank - 2
    index = [cg.expr(o) for o in inst.offsets[:lead]] + [cg.expr(inst.offsets[lead]), "0"]
    linear = " + ".join(f"({i}) * {st}" for i, st in zip(index, inst.b.layout.strides)
                        if st != 0) or "0"
    out, n = cg.name(inst.out), plan.n
    if inst.out is not inst.c:
        cg.line(f"memcpy({out}, {cg.name(inst.c)}, sizeof({out}));")
    ptx = _PTX_TYPES[inst.a.dtype.name]
    nd = n // 2  # accumulator floats per thread per 64-row tile
    d_regs = ", ".join(f"%{i}" for i in range(nd))
    a_regs = ", ".join(f"%{nd + i}" for i in range(4))
    op = (f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ptx}.{ptx} {{{d_regs}}}, "
          f"{{{a_regs}}}, %{nd + 4}, p, 1, 1, 0;")
    a = f"reinterpret_cast<const lowvm_u32*>({cg.name(inst.a)})"
    with cg.block(""):
        cg.line("const unsigned lowvm_b = static_cast<unsigned>(__cvta_generic_to_shared("
                f"lowvm_smem + {cg.shared_offsets[inst.b]})) + 2u * ({linear}) + "
                f"{2 * plan.col0}u;")
        cg.line('asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");')
        for r in range(plan.m_tiles):
            for kk in range(plan.k_slices):
                outs = ", ".join(f'"+f"({out}[{r * nd + i}])' for i in range(nd))
                ins = ", ".join([f'"r"({a}[{(r * plan.k_slices + kk) * 4 + i}])'
                                 for i in range(4)]
                                + [f'"l"(lowvm_wgmma_desc(lowvm_b + {32 * kk}u))'])
                cg.line(f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, 1, 0;\\n{op}\\n}}\\n" '
                        f': {outs} : {ins} : "memory");')
        cg.line('asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory");')
        # wait=False is lowered as a waiting call too (the interpreter still checks the
        # program as if it had not waited): issued without waiting, an overlapped GEMM
        # gave wrong sums on the H100, its cause not found
        cg.line('asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");')
