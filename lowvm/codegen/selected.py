"""CUDA for the implementations the passes selected (``inst.impl``).

The generic ``emit_cuda`` of each instruction is per element and always correct; the
code here is what a CUDA expert writes for the same instruction once the passes proved
it legal: ``mma.sync`` fragments, ``ldmatrix``, ``cp.async`` and 8/16-byte vector
loads and stores. A vector access whose legality depends on runtime sizes is guarded by
a uniform branch with the generic code as the other side.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from lowvm.codegen.context import CudaContext
from lowvm.expr import is_const
from lowvm.instructions.dot import Dot
from lowvm.instructions.memory import (
    CopyAsync,
    LoadGlobal,
    LoadShared,
    StoreGlobal,
    StoreShared,
    global_ref,
)
from lowvm.ir import SharedTensor
from lowvm.passes.instruction_selection import CpAsyncPlan, LdmatrixPlan, MmaPlan
from lowvm.passes.vectorize import VectorAccess

__all__ = ["emit_selected"]

_VECTOR_TYPES = {2: "unsigned short", 4: "unsigned int", 8: "uint2", 16: "uint4"}
_VECTOR_ZEROS = {2: "(unsigned short)0", 4: "0u", 8: "make_uint2(0, 0)",
                 16: "make_uint4(0, 0, 0, 0)"}


def _shared_offset(cg: CudaContext, tensor: SharedTensor, offsets, rel: list[str]) -> str:
    """Element offset of tile index ``rel`` at ``offsets`` (leading dims by offset).

    Only for accesses the passes proved swizzle-commuting: compile-time offsets and
    ``rel`` go through the swizzle, runtime offsets (a pipeline stage, say) are added
    after it, so the thread-dependent part stays loop-invariant.
    """
    lead = tensor.rank - len(rel)
    index, outer = [], []
    for d, off in enumerate(offsets):
        r = rel[d - lead] if d >= lead else None
        if is_const(off):
            index.append(cg.expr(off) if r is None else f"({cg.expr(off)} + {r})")
        else:
            outer.append(f"({cg.expr(off)}) * {tensor.layout.strides[d]}")
            index.append("0" if r is None else f"({r})")
    offset = cg.shared_offset(tensor, index)
    return f"{offset} + {' + '.join(outer)}" if outer else offset


def _shared_address(cg: CudaContext, tensor: SharedTensor, offsets, rel: list[str]) -> str:
    """Shared-space address (for ``ldmatrix``/``cp.async``) of :func:`_shared_offset`."""
    ref = cg.shared_ref(tensor, _shared_offset(cg, tensor, offsets, rel))
    return f"(lowvm_u32)__cvta_generic_to_shared(&{ref})"


def _guarded(cg: CudaContext, inst, access: VectorAccess, body: Callable[[], None]) -> None:
    """``body`` under the access's runtime condition, the generic code otherwise."""
    if not access.condition:
        body()
        return
    with cg.block(f"if ({' && '.join(cg.expr(c) for c in access.condition)})"):
        body()
    with cg.block("else"):
        inst.emit_cuda(cg)


# ---------------------------------------------------------------------------------------
# vector loads and stores


def _emit_vector(inst, access: VectorAccess, cg: CudaContext) -> None:
    is_load = isinstance(inst, (LoadGlobal, LoadShared))
    tile = inst.out if is_load else inst.src
    memory = inst.src if is_load else inst.dst
    vt, lay, width = _VECTOR_TYPES[access.nbytes], tile.layout, access.width
    reg = f"*reinterpret_cast<{vt}*>(&{cg.name(tile)}[l])"

    def body() -> None:
        cg.line("#pragma unroll")
        with cg.block(f"for (int l = 0; l < {lay.local_size}; l += {width})"):
            rel = [cg.index(lay, d) for d in range(lay.rank)]
            if isinstance(memory, SharedTensor):
                ref = cg.shared_ref(memory, _shared_offset(cg, memory, inst.offsets, rel))
                mem = f"*reinterpret_cast<{vt}*>(&{ref})"
                cg.line(f"{reg} = {mem};" if is_load else f"{mem} = {reg};")
                return
            ref, inside = global_ref(cg, memory, inst.offsets, rel)
            if is_load:
                load = "__ldcg" if getattr(inst, "coherent", False) else "__ldg"
                value = f"{load}(reinterpret_cast<const {vt}*>(&{ref}))"
                if getattr(inst, "inbounds", None):  # asserted; the interpreter checks it
                    cg.line(f"{reg} = {value};")
                else:
                    cg.line(f"{reg} = ({inside}) ? {value} : {_VECTOR_ZEROS[access.nbytes]};")
            else:
                cg.line(f"if ({inside}) *reinterpret_cast<{vt}*>(&{ref}) = {reg};")

    cg.line(f"// {inst}")
    _guarded(cg, inst, access, body)


# ---------------------------------------------------------------------------------------
# cp.async


def _emit_cp_async(inst: CopyAsync, plan: CpAsyncPlan, cg: CudaContext) -> None:
    access = plan.access
    shape = inst.tile_shape
    total = math.prod(shape)
    chunks = total // access.width
    threads = cg.program.num_threads
    iters = -(-chunks // threads)
    cache = "cg" if access.nbytes == 16 else "ca"
    dst_offsets = inst.dst_start

    last = shape[-1]
    step = threads * access.width  # elements between a thread's chunks
    regular = step % last == 0  # each thread keeps its column; rows advance by a constant

    def body() -> None:
        if regular:
            cg.line(f"const int cp_col = (tid * {access.width}) % {last};")
            cg.line(f"const int cp_row = (tid * {access.width}) / {last};")
        for it in range(iters):
            # a partial last round: only the threads with a chunk left copy (a guard, not
            # a break: the rounds are unrolled blocks, not a loop)
            partial = (it + 1) * threads > chunks
            if regular:
                row = f"cp_row + {it * step // last}"
                guard = f"if ({row} < {total // last})" if partial else ""
            else:
                guard = f"if (tid + {it * threads} < {chunks})" if partial else ""
            with cg.block(guard):
                if regular:
                    rel, rest = ["cp_col"], row
                else:
                    cg.line(f"const int chunk = tid + {it * threads};")
                    cg.line(f"const int col = (chunk * {access.width}) % {last};")
                    rel, rest = ["col"], f"(chunk * {access.width}) / {last}"
                for d in reversed(range(len(shape) - 1)):
                    # the row is in range (checked above), so the outermost dim needs no %
                    cg.line(f"const int j{d} = {rest};" if d == 0 else
                            f"const int j{d} = ({rest}) % {shape[d]};")
                    rel.insert(0, f"j{d}")
                    rest = f"({rest}) / {shape[d]}"
                ref, inside = global_ref(cg, inst.src, inst.offsets, rel)
                saddr = _shared_address(cg, inst.dst, dst_offsets, rel)
                cg.line(f"const bool inside = {inside};")
                cg.line(f"const void* src = inside ? (const void*)&{ref} : "
                        f"(const void*){inst.src.pointer.name};")
                cg.line(f'asm volatile("cp.async.{cache}.shared.global [%0], [%1], '
                        f'{access.nbytes}, %2;\\n" :: "r"({saddr}), "l"(src), '
                        f'"r"(inside ? {access.nbytes} : 0) : "memory");')

    cg.line(f"// {inst}")
    _guarded(cg, inst, access, body)


# ---------------------------------------------------------------------------------------
# ldmatrix


def _emit_ldmatrix(inst: LoadShared, plan: LdmatrixPlan, cg: CudaContext) -> None:
    cg.line(f"// {inst}")
    lay, tensor = inst.out.layout, inst.src
    words = f"reinterpret_cast<lowvm_u32*>({cg.name(inst.out)})"
    suffix = ".trans" if plan.trans else ""
    for first, count in plan.calls:
        matrix = f"((tid >> 3) & {count - 1})"
        if plan.trans:
            thread = "((tid & ~31) + ((tid & 7) >> 1))"
            local = f"(2 * ({first} + {matrix}) + (tid & 1))"
        else:
            thread = "((tid & ~31) + 4 * (tid & 7))"
            local = f"(2 * ({first} + {matrix}))"
        rel = [cg.index(lay, d, local, thread) for d in range(lay.rank)]
        addr = _shared_address(cg, tensor, inst.offsets, rel)
        regs = ", ".join(f"%{i}" for i in range(count))
        outs = ", ".join(f'"=r"({words}[{first + i}])' for i in range(count))
        cg.line(f'asm volatile("ldmatrix.sync.aligned.m8n8.x{count}{suffix}.shared.b16 '
                f'{{{regs}}}, [%{count}];\\n" : {outs} : "r"({addr}));')


# ---------------------------------------------------------------------------------------
# mma.sync

_PTX_TYPES = {"float16": "f16", "bfloat16": "bf16", "int8": "s8", "uint8": "u8"}


def _emit_mma(inst: Dot, plan: MmaPlan, cg: CudaContext) -> None:
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


_EMITTERS: dict[type, Callable] = {
    VectorAccess: _emit_vector,
    CpAsyncPlan: _emit_cp_async,
    LdmatrixPlan: _emit_ldmatrix,
    MmaPlan: _emit_mma,
}


def emit_selected(inst, cg: CudaContext) -> bool:
    """Emit ``inst`` through its selected implementation; False when it has none."""
    emit = _EMITTERS.get(type(inst.impl))
    if emit is None:
        return False
    if isinstance(inst.impl, VectorAccess) and not isinstance(
            inst, (LoadGlobal, StoreGlobal, LoadShared, StoreShared)):
        return False
    emit(inst, inst.impl, cg)
    return True
