"""CUDA of the dot instructions (:mod:`lowvm.instructions.dot`): the per-element code;
the tensor-core lowerings are in :mod:`lowvm.codegen.emitters.dot_selected`."""

from __future__ import annotations

from lowvm.codegen.context import CudaContext
from lowvm.codegen.emitters.registry import register_emitter
from lowvm.dtypes import float32
from lowvm.instructions.dot import Dot, DotShared, DotWait

__all__ = ["emit_dot", "emit_dot_shared", "emit_dot_wait"]


def _to_scratch(cg: CudaContext, tiles) -> None:
    """Each ``(tile, buffer)``'s elements into its row-major scratch buffer, between block
    barriers (the per-element lowerings read other threads' operands from there)."""
    cg.line("__syncthreads();")
    for tile, buf in tiles:
        cg.line("#pragma unroll")
        with cg.block(f"for (int l = 0; l < {tile.layout.local_size}; ++l)"):
            cg.line(f"{buf}[{cg.flat_index(tile.layout, tile.shape)}] = {cg.get(tile, 'l')};")
    cg.line("__syncthreads();")


@register_emitter(Dot)
def emit_dot(inst: Dot, cg: CudaContext) -> None:
    cg.line(f"// {inst}  (through shared scratch)")
    (m, k), n = inst.a.shape, inst.b.shape[1]
    ctype = cg.compute_type(inst.a.dtype)
    cg.scratch(4 * (m * k + k * n))
    with cg.block(""):
        cg.line(f"{ctype}* sa = reinterpret_cast<{ctype}*>(lowvm_smem + lowvm_scratch);")
        cg.line(f"{ctype}* sb = sa + {m * k};")
        _to_scratch(cg, ((inst.a, "sa"), (inst.b, "sb")))
        cg.line("#pragma unroll")
        with cg.block(f"for (int l = 0; l < {inst.c.layout.local_size}; ++l)"):
            lay = inst.c.layout
            cg.line(f"const int i = {cg.index(lay, 0)};")
            cg.line(f"const int j = {cg.index(lay, 1)};")
            acc_t = "float" if inst.c.dtype.is_float else "int"
            cg.line(f"{acc_t} acc = {cg.get(inst.c, 'l')};")
            with cg.block(f"for (int kk = 0; kk < {k}; ++kk)"):
                if acc_t == "float":
                    cg.line(f"acc = fmaf(sa[i * {k} + kk], sb[kk * {n} + j], acc);")
                else:
                    cg.line(f"acc += sa[i * {k} + kk] * sb[kk * {n} + j];")
            cg.line(cg.set(inst.out, "l", "acc", acc_t == "float"))
        cg.line("__syncthreads();")


@register_emitter(DotShared)
def emit_dot_shared(inst: DotShared, cg: CudaContext) -> None:
    """Per-element fallback: ``a`` through shared scratch, each output element a
    K-long sum over ``b`` read in place."""
    cg.line(f"// {inst}  (per element)")
    m, k = inst.a.shape
    ctype = cg.compute_type(inst.a.dtype)
    cg.scratch(4 * m * k)
    lead = inst.b.rank - 2
    with cg.block(""):
        cg.line(f"{ctype}* sa = reinterpret_cast<{ctype}*>(lowvm_smem + lowvm_scratch);")
        _to_scratch(cg, ((inst.a, "sa"),))
        cg.line("#pragma unroll")
        with cg.block(f"for (int l = 0; l < {inst.c.layout.local_size}; ++l)"):
            lay = inst.c.layout
            cg.line(f"const int i = {cg.index(lay, 0)};")
            cg.line(f"const int j = {cg.index(lay, 1)};")
            cg.line(f"float acc = {cg.get(inst.c, 'l')};")
            index = [cg.expr(o) for o in inst.offsets[:lead]] + [
                f"{cg.expr(inst.offsets[lead])} + j", f"{cg.expr(inst.offsets[lead + 1])} + kk"]
            ref = cg.shared_ref(inst.b, cg.shared_offset(inst.b, index))
            with cg.block(f"for (int kk = 0; kk < {k}; ++kk)"):
                cg.line(f"acc = fmaf(sa[i * {k} + kk], static_cast<float>({ref}), acc);")
            cg.line(cg.set(inst.out, "l", "acc", True))
        cg.line("__syncthreads();")


@register_emitter(DotWait)
def emit_dot_wait(inst: DotWait, cg: CudaContext) -> None:
    if not cg.uses_async_proxy:  # no wgmma in the program: per-element dot_shared
        cg.line("// dot_wait (no wgmma in flight)")
        return
    cg.line('asm volatile("wgmma.wait_group.sync.aligned 0;\\n" ::: "memory");  '
            "// dot_wait")
    for tile in inst.tiles:
        words, kind = (tile.layout.local_size * tile.dtype.nbits // 32,
                       "f" if tile.dtype == float32 else "r")
        ctype = "float" if kind == "f" else "lowvm_u32"
        regs = f"reinterpret_cast<{ctype}*>({cg.name(tile)})"
        cg.line("#pragma unroll")
        with cg.block(f"for (int w = 0; w < {words}; ++w)"):
            cg.line(f'asm volatile("" : "+{kind}"({regs}[w]) :: "memory");')
