"""CUDA of the memory accesses the passes selected (``inst.impl``): 8/16-byte vector loads
and stores (:class:`VectorAccess`), ``cp.async`` (:class:`CpAsyncPlan`) and ``ldmatrix``
(:class:`LdmatrixPlan`).

The generic emitters (:mod:`lowvm.codegen.emitters.memory`) are per element and always
correct; the code here is what a CUDA expert writes for the same instruction once the
passes proved it legal. A vector access whose legality depends on runtime sizes is
guarded by a uniform branch with the generic code as the other side.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import numpy as np

from lowvm.codegen.context import CudaContext
from lowvm.codegen.emitters.memory import global_ref
from lowvm.codegen.emitters.registry import emit_generic, register_emitter
from lowvm.codegen.thread_offsets import Relation, relation, swizzled_offsets
from lowvm.expr import const_value, is_const
from lowvm.instructions.memory import CopyAsync, LoadGlobal, LoadShared, StoreGlobal, StoreShared
from lowvm.instructions.plans import CpAsyncPlan, LdmatrixPlan, VectorAccess
from lowvm.ir import SharedTensor

__all__ = ["emit_vector_access", "emit_cp_async", "emit_ldmatrix", "related_addresses_enabled",
           "guarded"]

_VECTOR_TYPES = {2: "unsigned short", 4: "unsigned int", 8: "uint2", 16: "uint4"}
_VECTOR_ZEROS = {2: "(unsigned short)0", 4: "0u", 8: "make_uint2(0, 0)",
                 16: "make_uint4(0, 0, 0, 0)"}



def _shared_offset(cg: CudaContext, tensor: SharedTensor, offsets, rel: list[str]) -> str:
    """Element offset of tile index ``rel`` at ``offsets`` (leading dims by offset).

    Only for accesses the passes proved swizzle-commuting: compile-time offsets and
    ``rel`` go through the swizzle, runtime offsets (a pipeline stage, say) are added
    after it, so the thread-dependent part stays loop-invariant.
    """
    inner, outer = _split_offset(cg, tensor, offsets, rel)
    return f"{inner} + {outer}" if outer else inner


def _split_offset(cg: CudaContext, tensor: SharedTensor, offsets, rel: list[str]
                  ) -> tuple[str, str]:
    """(swizzled part, runtime part added after the swizzle or '') of :func:`_shared_offset`."""
    lead = tensor.rank - len(rel)
    index, outer = [], []
    for d, off in enumerate(offsets):
        r = rel[d - lead] if d >= lead else None
        if is_const(off):
            index.append(cg.expr(off) if r is None else f"({cg.expr(off)} + {r})")
        else:
            outer.append(f"({cg.expr(off)}) * {tensor.layout.strides[d]}")
            index.append("0" if r is None else f"({r})")
    return cg.shared_offset(tensor, index), " + ".join(outer)


def _offset_table(tensor: SharedTensor, offsets, rel: list[np.ndarray]) -> np.ndarray:
    """Per thread, the swizzled part of :func:`_split_offset` (runtime offsets as 0)."""
    lead = tensor.rank - len(rel)
    index = []
    for d, off in enumerate(offsets):
        value = const_value(off)
        value = int(value) if value is not None else 0
        index.append(np.int64(value) if d < lead else value + rel[d - lead])
    return swizzled_offsets(tensor.layout, index)


def related_addresses_enabled(kind: str) -> bool:
    """False under ``LOWVM_PLAIN_ADDRESSES=1`` (or a comma list naming ``kind``:
    ``cp_async``, ``ldmatrix``, ``global_vector``): those accesses then compute their own
    addresses (the lowering before the related one; kept to measure one against the
    other)."""
    plain = os.environ.get("LOWVM_PLAIN_ADDRESSES", "").split(",")
    return "1" not in plain and kind not in plain


def _related_addresses(cg: CudaContext, tensor: SharedTensor, offsets, rels: list,
                       base_rel: list[str], masks: list | None = None,
                       kind: str = "ldmatrix") -> list[str] | None:
    """Shared-space addresses of several accesses (``rels``: per access, the tile index
    of every thread as int arrays), each as the thread's base offset (``base_rel``, the
    first access's index expressions at zero offsets) XOR and plus a constant; None when
    some access is not so related for every thread that makes it (``masks``: per access,
    which threads do; default all) (:mod:`thread_offsets`)."""
    if not related_addresses_enabled(kind):
        return None
    zeros = [0] * len(offsets)
    base = _offset_table(tensor, zeros, rels[0])
    masks = masks or [np.ones(base.shape, dtype=bool)] * len(rels)
    relations = [relation(base[mask], _offset_table(tensor, offsets, r)[mask])
                 for r, mask in zip(rels, masks)]
    if any(r is None for r in relations):
        return None
    base_expr = cg.shared_offset(tensor, [f"({e})" for e in
                                          ["0"] * (tensor.rank - len(base_rel)) + base_rel])
    _, outer = _split_offset(cg, tensor, offsets, base_rel)
    out, nbytes = [], tensor.dtype.nbits // 8
    for r in relations:
        # the XOR inside the element offset, the add on the address (an immediate there)
        offset = Relation(r.xor).apply(base_expr) + (f" + {outer}" if outer else "")
        addr = f"(lowvm_u32)__cvta_generic_to_shared(&{cg.shared_ref(tensor, offset)})"
        out.append(f"({addr} + {r.add * nbytes})" if r.add else addr)
    return out


def _shared_address(cg: CudaContext, tensor: SharedTensor, offsets, rel: list[str]) -> str:
    """Shared-space address (for ``ldmatrix``/``cp.async``) of :func:`_shared_offset`."""
    ref = cg.shared_ref(tensor, _shared_offset(cg, tensor, offsets, rel))
    return f"(lowvm_u32)__cvta_generic_to_shared(&{ref})"


def guarded(cg: CudaContext, inst, access: VectorAccess, body: Callable[[], None]) -> None:
    """``body`` under the access's runtime condition, the generic code otherwise."""
    if not access.condition:
        body()
        return
    with cg.block(f"if ({' && '.join(cg.expr(c) for c in access.condition)})"):
        body()
    with cg.block("else"):
        emit_generic(inst, cg)


# ---------------------------------------------------------------------------------------
# vector loads and stores


@register_emitter(LoadGlobal, StoreGlobal, LoadShared, StoreShared, impl=VectorAccess)
def emit_vector_access(inst, cg: CudaContext) -> None:
    """8/16-byte (or narrower) vector loads and stores of a :class:`VectorAccess`."""
    access = inst.impl
    is_load = isinstance(inst, (LoadGlobal, LoadShared))
    tile = inst.out if is_load else inst.src
    memory = inst.src if is_load else inst.dst
    vt, lay, width = _VECTOR_TYPES[access.nbytes], tile.layout, access.width
    reg = f"*reinterpret_cast<{vt}*>(&{cg.name(tile)}[l])"

    def body() -> None:
        if is_load and getattr(inst, "inbounds", None) and not isinstance(memory, SharedTensor):
            deltas = _vector_deltas(lay, width, "global_vector")
            if deltas is not None:
                _emit_related_loads(inst, cg, vt, width, deltas)
                return
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
    guarded(cg, inst, access, body)


def _vector_deltas(lay, width: int, kind: str) -> list[list[int]] | None:
    """Per vector access ``l = 0, width, ..`` of a tile, its index minus access 0's, when
    that is the same for every thread (the usual case: locals are outer modes); None
    otherwise or when ``kind``'s related addresses are off."""
    if not related_addresses_enabled(kind):
        return None
    table = lay.table  # [threads, locals, rank]
    out = []
    for first in range(0, lay.local_size, width):
        delta = table[:, first, :] - table[:, 0, :]
        if not np.all(delta == delta[:1]):
            return None
        out.append([int(v) for v in delta[0]])
    return out


def _emit_related_loads(inst, cg: CudaContext, vt: str, width: int,
                        deltas: list[list[int]]) -> None:
    """An in-bounds vector load as one pointer (the first access's address) and each
    access at an offset from it that is the same for every thread: along dims of
    constant stride the compiler folds it into the loads' immediates, where one address
    per access cost an index, a multiply and a 64-bit add each, per K step in the GEMMs'
    main loops (a runtime stride leaves one multiply, computed once)."""
    memory, lay = inst.src, inst.out.layout
    load = "__ldcg" if getattr(inst, "coherent", False) else "__ldg"
    strides = memory.layout.strides
    with cg.block(""):
        ref, _ = global_ref(cg, memory, inst.offsets,
                            [cg.index(lay, d, "0") for d in range(lay.rank)], wide=True)
        cg.line(f"const auto* lowvm_g = &{ref};")
        for v, delta in enumerate(deltas):
            terms = []
            for d, step in enumerate(delta):
                stride = const_value(strides[d])
                if not step:
                    continue
                terms.append(str(step * stride) if isinstance(stride, int) else
                             f"(lowvm_i64){step} * {cg.expr(strides[d])}")
            at = f"lowvm_g + {' + '.join(terms)}" if terms else "lowvm_g"
            cg.line(f"*reinterpret_cast<{vt}*>(&{cg.name(inst.out)}[{v * width}]) = "
                    f"{load}(reinterpret_cast<const {vt}*>({at}));")


# ---------------------------------------------------------------------------------------
# cp.async


def _chunk_index(shape: tuple[int, ...], flat):
    """Tile index of the chunk starting at row-major element ``flat``: C expressions (of
    the string ``flat``) or int arrays; the outermost dim is not wrapped (the row is
    range-checked by the caller), as in the generic lowering."""
    rel, rest = [], flat
    for d in reversed(range(len(shape))):
        if isinstance(flat, str):
            rel.insert(0, f"({rest})" if d == 0 else f"({rest}) % {shape[d]}")
            rest = f"({rest}) / {shape[d]}"
        else:
            rel.insert(0, rest if d == 0 else rest % shape[d])
            rest = rest // shape[d]
    return rel


@register_emitter(CopyAsync, impl=CpAsyncPlan)
def emit_cp_async(inst: CopyAsync, cg: CudaContext) -> None:
    """``cp.async`` chunks: each thread's chunks as a base address plus constants where
    that holds for every thread (:func:`_cp_async_related`), else one by one."""
    plan = inst.impl
    cg.line(f"// {inst}")
    guarded(cg, inst, plan.access,
             lambda: _cp_async_related(inst, plan, cg) or _cp_async_each(inst, plan, cg))


def _cp_async_related(inst: CopyAsync, plan: CpAsyncPlan, cg: CudaContext) -> bool:
    """Emit the chunks of each thread as offsets from its first one, computed once: the
    global pointer plus a constant number of rows per round, the shared address through
    :func:`_related_addresses`, the bounds of dims that no round moves along tested once.
    False (nothing emitted) when some round is not such a constant for every thread."""
    access, shape = plan.access, inst.tile_shape
    chunks = math.prod(shape) // access.width
    threads = cg.program.num_threads
    iters = -(-chunks // threads)
    tid = np.arange(threads, dtype=np.int64)
    rels, masks, deltas = [], [], []
    for it in range(iters):
        rel = _chunk_index(shape, (tid + it * threads) * access.width)
        mask = tid + it * threads < chunks
        step = [r[mask] - r0[mask] for r, r0 in zip(rel, rels[0])] if rels else \
            [np.zeros(int(mask.sum()), dtype=np.int64)] * len(shape)
        if any(d.size and not np.all(d == d[0]) for d in step):
            return False
        rels.append(rel)
        masks.append(mask)
        deltas.append([int(d[0]) if d.size else 0 for d in step])
    base_rel = [f"j{d}" for d in range(len(shape))]
    addrs = _related_addresses(cg, inst.dst, inst.dst_start, rels, base_rel, masks,
                               "cp_async")
    if addrs is None:
        return False
    with cg.block(""):
        for d, expr in enumerate(_chunk_index(shape, f"tid * {access.width}")):
            cg.line(f"const int j{d} = {expr};")
        ref, _ = global_ref(cg, inst.src, inst.offsets, base_rel)
        cg.line(f"const auto* cp_src = &{ref};")
        src = inst.src
        moving = [d for d in range(len(shape)) if any(delta[d] for delta in deltas)]
        ahead = [d for d in moving if all(delta[d] >= 0 for delta in deltas)]
        # of those the chunks only move forward along, the dims whose offset is >= 0: there
        # i >= 0 for every chunk, tested once; elsewhere a thread's first chunk may lie
        # before the tensor and a later one inside, so each chunk is tested, in one
        # unsigned compare (0 <= i + delta < size, the size tested >= 0 once). The offset
        # may take the tensor's sizes to be >= 1: with one below, every test fails anyway
        from_zero = [d for d in ahead if cg.is_nonnegative(inst.offsets[d], src.layout.shape)]
        size = [cg.expr(src.layout.shape[d]) for d in range(len(shape))]
        once = [f"i{d} >= 0 && i{d} < {size[d]}" for d in range(len(shape))
                if d not in moving] + [f"i{d} >= 0" if d in from_zero else f"{size[d]} >= 0"
                                       for d in ahead]
        if once:
            cg.line(f"const bool cp_in = {' && '.join(once)};")
        for it, (delta, addr) in enumerate(zip(deltas, addrs)):
            partial = not masks[it].all()
            with cg.block(f"if (tid + {it * threads} < {chunks})" if partial else ""):
                conds = ["cp_in"] if once else []
                for d in moving:
                    bound = f"i{d} + {delta[d]} < {size[d]}"
                    if d in from_zero:
                        conds.append(bound)
                    elif d in ahead:
                        conds.append(f"(unsigned)(i{d} + {delta[d]}) < (unsigned)({size[d]})")
                    else:
                        conds.append(f"i{d} + {delta[d]} >= 0 && {bound}")
                step = " + ".join(f"(lowvm_i64){delta[d]} * {cg.expr(src.layout.strides[d])}"
                                  for d in moving if delta[d])
                cg.line(f"const bool inside = {' && '.join(conds) or 'true'};")
                # src-size 0 outside: nothing is read (zero fill), so the pointer needs no
                # clamp to a valid address (as CUTLASS's zero-filling cp.async does)
                cg.line(f"const void* src = (const void*)(cp_src{' + ' if step else ''}{step});")
                _cp_async_line(cg, access, addr)
    return True


def _cp_async_line(cg: CudaContext, access: VectorAccess, saddr: str) -> None:
    """One ``cp.async`` of ``src`` (zero-filled where not ``inside``) to ``saddr``."""
    cache = "cg" if access.nbytes == 16 else "ca"
    cg.line(f'asm volatile("cp.async.{cache}.shared.global [%0], [%1], '
            f'{access.nbytes}, %2;\\n" :: "r"({saddr}), "l"(src), '
            f'"r"(inside ? {access.nbytes} : 0) : "memory");')


def _cp_async_each(inst: CopyAsync, plan: CpAsyncPlan, cg: CudaContext) -> bool:
    """Emit every chunk's indices, bounds and addresses on their own (any tiling)."""
    access, shape = plan.access, inst.tile_shape
    total = math.prod(shape)
    chunks = total // access.width
    threads = cg.program.num_threads
    iters = -(-chunks // threads)
    last = shape[-1]
    step = threads * access.width  # elements between a thread's chunks
    regular = step % last == 0  # each thread keeps its column; rows advance by a constant
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
            saddr = _shared_address(cg, inst.dst, inst.dst_start, rel)
            cg.line(f"const bool inside = {inside};")
            cg.line(f"const void* src = inside ? (const void*)&{ref} : "
                    f"(const void*){inst.src.pointer.name};")
            _cp_async_line(cg, access, saddr)
    return True


# ---------------------------------------------------------------------------------------
# ldmatrix


def _ldmatrix_lanes(trans: bool, first: int, count: int, tid: np.ndarray | None = None):
    """(thread, local) of the tile element whose row address each lane supplies to one
    ``ldmatrix.x{count}`` call: C expressions of ``tid``, or int arrays for ``tid``."""
    if tid is None:
        matrix = f"((tid >> 3) & {count - 1})"
        if trans:
            return ("((tid & ~31) + ((tid & 7) >> 1))",
                    f"(2 * ({first} + {matrix}) + (tid & 1))")
        return "((tid & ~31) + 4 * (tid & 7))", f"(2 * ({first} + {matrix}))"
    matrix = (tid >> 3) & (count - 1)
    if trans:
        return (tid & ~31) + ((tid & 7) >> 1), 2 * (first + matrix) + (tid & 1)
    return (tid & ~31) + 4 * (tid & 7), 2 * (first + matrix)


@register_emitter(LoadShared, impl=LdmatrixPlan)
def emit_ldmatrix(inst: LoadShared, cg: CudaContext) -> None:
    plan = inst.impl
    cg.line(f"// {inst}")
    lay, tensor = inst.out.layout, inst.src
    words = f"reinterpret_cast<lowvm_u32*>({cg.name(inst.out)})"
    suffix = ".trans" if plan.trans else ""
    tid = np.arange(cg.program.num_threads, dtype=np.int64)
    rels = []
    for first, count in plan.calls:
        thread, local = _ldmatrix_lanes(plan.trans, first, count, tid)
        row = lay.table[thread % lay.num_threads, local % lay.local_size]
        rels.append([row[:, d] for d in range(lay.rank)])
    first0, count0 = plan.calls[0]
    thread0, local0 = _ldmatrix_lanes(plan.trans, first0, count0)
    addrs = _related_addresses(cg, tensor, inst.offsets, rels,
                               [cg.index(lay, d, local0, thread0) for d in range(lay.rank)])
    for i, (first, count) in enumerate(plan.calls):
        if addrs is not None:
            addr = addrs[i]
        else:
            thread, local = _ldmatrix_lanes(plan.trans, first, count)
            rel = [cg.index(lay, d, local, thread) for d in range(lay.rank)]
            addr = _shared_address(cg, tensor, inst.offsets, rel)
        regs = ", ".join(f"%{i}" for i in range(count))
        outs = ", ".join(f'"=r"({words}[{first + i}])' for i in range(count))
        cg.line(f'asm volatile("ldmatrix.sync.aligned.m8n8.x{count}{suffix}.shared.b16 '
                f'{{{regs}}}, [%{count}];\\n" : {outs} : "r"({addr}));')
