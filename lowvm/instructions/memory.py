"""Memory instructions: global views, global/shared loads and stores, async copies.

Out-of-bounds elements of a global tile are masked: loads give 0, stores are skipped,
``copy_async`` zero-fills (as ``cp.async`` with a zero source size does). Shared memory
is checked like a race detector: a thread may read a shared element only after the
write that produced it was made visible (``sync`` after a ``store_shared`` by another
thread; ``wait_group`` then ``sync`` after a ``copy_async``), and may not overwrite an
element another thread read or wrote since the last ``sync``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lowvm.dtypes import int32
from lowvm.expr import Expr, Var, const_value, is_const
from lowvm.instructions.base import Instruction, register_instruction
from lowvm.instructions.control import Sync
from lowvm.ir import GlobalTensor, RegisterTensor, SharedTensor

if TYPE_CHECKING:
    from lowvm.codegen.context import CudaContext
    from lowvm.interpreter.state import BlockState

__all__ = [
    "GlobalView",
    "LoadGlobal",
    "LoadUniform",
    "StoreGlobal",
    "AllocShared",
    "FreeShared",
    "LoadShared",
    "StoreShared",
    "CopyAsync",
    "PrefetchL2",
    "CommitGroup",
    "WaitGroup",
]


def _check_offsets(inst: Instruction, offsets: tuple[Expr, ...], rank: int, what: str) -> None:
    if len(offsets) != rank:
        raise inst.error(f"{len(offsets)} offsets given for the rank-{rank} {what}")


def _check_whole_bytes(inst: Instruction, tensor) -> None:
    if tensor.dtype.nbits % 8:
        raise inst.error(
            f"%{tensor.name} has the {tensor.dtype.nbits}-bit type {tensor.dtype.name}; "
            "memory holds whole bytes: load uint8 (or wider) tiles and `view` them as "
            f"{tensor.dtype.name}"
        )


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class GlobalView(Instruction):
    """Name a global tensor: ``pointer`` seen through a global layout."""

    mnemonic = "global_view"
    out: GlobalTensor

    def check(self) -> None:
        _check_whole_bytes(self, self.out)

    def interpret(self, st: BlockState) -> None:
        st.bind_global(self.out)

    def format_args(self) -> str:
        return f"{self.out.pointer} as {self.out.layout}"

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line(f"// {self}")


def _element_position(st: BlockState, inst: Instruction, tensor: GlobalTensor,
                      offsets: tuple[Expr, ...], what: str) -> np.ndarray:
    """The ``[1, 1]`` flat position of the one element at ``offsets`` (instructions that
    read a single element: the interpreter refuses it outside ``tensor``, naming ``what``)."""
    index = np.zeros((1, 1, tensor.rank), dtype=np.int64)
    flat, inside = _global_positions(st, tensor, offsets, index)
    if not inside.all():
        raise st.runtime_error(inst, f"{what} at {[st.eval(o) for o in offsets]} is outside "
                                     f"%{tensor.name}")
    return flat


def _global_positions(
    st: BlockState, tensor: GlobalTensor, offsets: tuple[Expr, ...], table: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Flat element offsets of ``offsets + table`` and the in-bounds mask."""
    shape, strides = st.global_shape(tensor)
    start = np.array([int(st.eval(o)) for o in offsets], dtype=np.int64)
    index = table + start
    inside = np.ones(index.shape[:-1], dtype=bool)
    flat = np.zeros(index.shape[:-1], dtype=np.int64)
    for d, (size, stride) in enumerate(zip(shape, strides)):
        inside &= (index[..., d] >= 0) & (index[..., d] < size)
        flat += index[..., d] * stride
    return flat, inside


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class LoadGlobal(Instruction):
    """Load the tile at ``offsets`` of a global tensor into registers (0 outside).

    ``coherent``: read what other blocks wrote earlier in the same launch (after a
    :func:`~lowvm.lang.arrive`), through L2 only: plain loads may use the read-only and
    L1 caches, which do not see other blocks' writes.
    ``inbounds`` (True): the program asserts the whole tile lies inside the tensor, so the
    CUDA code loads without a bounds test per element; the interpreter checks the
    assertion on every execution and raises where it fails.
    """

    mnemonic = "load_global"
    out: RegisterTensor
    src: GlobalTensor
    offsets: tuple[Expr, ...]
    coherent: bool = False
    inbounds: bool | None = None  # None: not asserted (printed only when True)

    def check(self) -> None:
        _check_offsets(self, self.offsets, self.src.rank, "global tensor")
        _check_whole_bytes(self, self.out)
        if self.out.dtype != self.src.dtype:
            raise self.error(
                f"loading {self.src.dtype.name} from %{self.src.name} into a "
                f"{self.out.dtype.name} tile; load as {self.src.dtype.name} and cast"
            )

    def interpret(self, st: BlockState) -> None:
        flat, inside = _global_positions(st, self.src, self.offsets, self.out.layout.table)
        if self.inbounds and not inside.all():
            start = [int(st.eval(o)) for o in self.offsets]
            raise self.error(f"load_global(inbounds=True): the {list(self.out.shape)} tile at "
                             f"offsets {start} reaches outside %{self.src.name} of shape "
                             f"{list(st.global_shape(self.src)[0])}")
        values = np.zeros(flat.shape, dtype=np.float64 if self.out.dtype.is_float else np.int64)
        values[inside] = st.global_buffer(self.src, self).read(flat[inside])
        st.set(self.out, values)

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line(f"// {self}")
        _emit_global_access(cg, self.src, self.offsets, self.out, load=True,
                            coherent=self.coherent, inbounds=bool(self.inbounds))


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class LoadUniform(Instruction):
    """Bind ``var`` to the int32 at ``src[offsets]``, which every thread reads.

    For values a program must use in offsets or loop bounds but that live in device memory,
    so that a CUDA graph replays with the current one: a decode step's cache position.
    The element must lie inside ``src`` (the interpreter checks it, the GPU does not).
    """

    mnemonic = "load_uniform"
    src: GlobalTensor
    offsets: tuple[Expr, ...]
    var: Var

    def check(self) -> None:
        _check_offsets(self, self.offsets, self.src.rank, "global tensor")
        if self.src.dtype != int32:
            raise self.error(f"load_uniform reads int32; %{self.src.name} is "
                             f"{self.src.dtype.name}")

    def interpret(self, st: BlockState) -> None:
        flat = _element_position(st, self, self.src, self.offsets, "load_uniform")
        st.env[self.var.name] = int(st.global_buffer(self.src, self).read(flat)[0, 0])

    def format_args(self) -> str:
        return f"%{self.src.name}, offsets=[{', '.join(str(o) for o in self.offsets)}]"

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line(f"// {self.var.name} = {self}")
        cg.line(f"int {self.var.name};")
        with cg.block(""):  # its own scope: global_ref's index names stay local
            ref, _ = global_ref(cg, self.src, self.offsets, ["0"] * self.src.rank)
            cg.line(f"{self.var.name} = {ref};")


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class StoreGlobal(Instruction):
    """Store a register tile at ``offsets`` of a global tensor (skipping outside)."""

    mnemonic = "store_global"
    dst: GlobalTensor
    src: RegisterTensor
    offsets: tuple[Expr, ...]

    def check(self) -> None:
        _check_offsets(self, self.offsets, self.dst.rank, "global tensor")
        if self.src.dtype != self.dst.dtype:
            raise self.error(
                f"storing a {self.src.dtype.name} tile into {self.dst.dtype.name} "
                f"%{self.dst.name}; cast it first"
            )

    def interpret(self, st: BlockState) -> None:
        flat, inside = _global_positions(st, self.dst, self.offsets, self.src.layout.table)
        st.global_buffer(self.dst, self).write(flat[inside], st.get(self.src)[inside])

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line(f"// {self}")
        _emit_global_access(cg, self.dst, self.offsets, self.src, load=False)


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class AllocShared(Instruction):
    """Allocate a shared tile (its contents undefined until written)."""

    mnemonic = "shared_tensor"
    out: SharedTensor

    def check(self) -> None:
        _check_whole_bytes(self, self.out)

    def interpret(self, st: BlockState) -> None:
        st.alloc_shared(self.out)

    def format_args(self) -> str:
        lay = self.out.layout
        swz = f" swizzle {lay.swizzle}" if lay.swizzle else ""
        return f"strides {list(lay.strides)}{swz} ({self.out.nbytes} bytes)"

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line(f"// {self} at shared byte {cg.shared_offsets[self.out]}")
        if self.out in cg.reused_tiles:  # freed space: every thread is done with it first
            Sync(loc=self.loc).emit_cuda(cg)


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class FreeShared(Instruction):
    """Release a shared tile; later uses are errors."""

    mnemonic = "free_shared"
    tensor: SharedTensor

    def interpret(self, st: BlockState) -> None:
        st.free_shared(self.tensor, self)

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line(f"// free_shared %{self.tensor.name}")


def _check_shared_tile(inst: Instruction, tensor: SharedTensor, offsets: tuple[Expr, ...],
                       tile_shape: tuple[int, ...], what: str = "tile") -> None:
    """Rank-reducing access: ``offsets`` has the shared rank, the tile at most that rank
    and its sizes fit the shared tensor's trailing dims."""
    _check_offsets(inst, offsets, tensor.rank, "shared tensor")
    lead = tensor.rank - len(tile_shape)
    if lead < 0:
        raise inst.error(
            f"the rank-{len(tile_shape)} {what} {list(tile_shape)} has more dims than the "
            f"rank-{tensor.rank} shared tile %{tensor.name}; accepted: a {what} of rank <= "
            f"{tensor.rank} (leading shared dims are selected by offset)")
    if any(t > s for t, s in zip(tile_shape, tensor.shape[lead:])):
        raise inst.error(
            f"the {what} {list(tile_shape)} does not fit the trailing dims "
            f"{list(tensor.shape[lead:])} of %{tensor.name} {list(tensor.shape)}")


def _shared_index(st: BlockState, tensor: SharedTensor, offsets, table: np.ndarray
                  ) -> np.ndarray:
    """Shared indices ``offsets[:lead] + (offsets[lead:] + table)`` (``table[..., r_t]``)."""
    start = np.array([int(st.eval(o)) for o in offsets], dtype=np.int64)
    lead = tensor.rank - table.shape[-1]
    fixed = np.broadcast_to(start[:lead], table.shape[:-1] + (lead,))
    return np.concatenate([fixed, table + start[lead:]], axis=-1)


def _shared_positions(
    inst: Instruction, st: BlockState, tensor: SharedTensor, offsets, table: np.ndarray,
    write: bool = False
) -> np.ndarray:
    """Element offsets in ``tensor``'s storage of the tile ``table`` at ``offsets``; for a
    ``write``, two different elements of the tile may not share one (a layout with a
    stride-0 dim reads one element as many, but cannot store many into one)."""
    index = _shared_index(st, tensor, offsets, table)
    for d, size in enumerate(tensor.shape):
        bad = (index[..., d] < 0) | (index[..., d] >= size)
        if bad.any():
            where = tuple(int(v) for v in index[tuple(np.argwhere(bad)[0])])
            raise st.runtime_error(
                inst, f"index {where} is outside the shared tile %{tensor.name} of shape "
                f"{list(tensor.shape)}"
            )
    lay = tensor.layout
    linear = sum(index[..., d] * lay.strides[d] for d in range(tensor.rank))
    pos = lay.swizzle(linear) if lay.swizzle else linear
    if write and 0 in lay.strides:
        pairs = np.unique(np.concatenate([index.reshape(-1, tensor.rank),
                                          pos.reshape(-1, 1)], axis=1), axis=0)
        if len(np.unique(pairs[:, -1])) < len(pairs):
            raise st.runtime_error(
                inst, f"writes two different elements of the tile to one address of "
                f"%{tensor.name}, whose layout repeats storage (strides "
                f"{list(lay.strides)}); accepted: a tile that spans each stride-0 dim once "
                f"(size 1 there)")
    return pos


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class LoadShared(Instruction):
    """Load the tile at ``offsets`` of a shared tensor into registers.

    The tile may have fewer dims than the shared tensor: its index ``j`` reads
    ``offsets[:lead] + (offsets[lead:] + j)`` (leading dims selected by offset only).
    """

    mnemonic = "load_shared"
    out: RegisterTensor
    src: SharedTensor
    offsets: tuple[Expr, ...]

    def check(self) -> None:
        _check_shared_tile(self, self.src, self.offsets, self.out.shape)
        if self.out.dtype != self.src.dtype:
            raise self.error(
                f"loading {self.src.dtype.name} from %{self.src.name} into a "
                f"{self.out.dtype.name} tile"
            )

    def interpret(self, st: BlockState) -> None:
        pos = _shared_positions(self, st, self.src, self.offsets, self.out.layout.table)
        st.set(self.out, st.shared(self.src, self).read(pos, self, st))

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line(f"// {self}")
        _emit_shared_access(cg, self.src, self.offsets, self.out, load=True)


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class StoreShared(Instruction):
    """Store a register tile at ``offsets`` of a shared tensor (rank-reducing as a load)."""

    mnemonic = "store_shared"
    dst: SharedTensor
    src: RegisterTensor
    offsets: tuple[Expr, ...]

    def check(self) -> None:
        _check_shared_tile(self, self.dst, self.offsets, self.src.shape)
        if self.src.dtype != self.dst.dtype:
            raise self.error(
                f"storing a {self.src.dtype.name} tile into {self.dst.dtype.name} "
                f"%{self.dst.name}; cast it first"
            )

    def interpret(self, st: BlockState) -> None:
        pos = _shared_positions(self, st, self.dst, self.offsets, self.src.layout.table,
                                write=True)
        st.shared(self.dst, self).write(pos, st.get(self.src), self, st)

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line(f"// {self}")
        _emit_shared_access(cg, self.dst, self.offsets, self.src, load=False)


#: bytes per ``prefetch.global.L2``: one 32-byte sector, the L2's unit of DRAM traffic,
#: so the hint covers every byte of a run that starts on a sector (a run that does not
#: may leave its last sector to the load)
PREFETCH_BYTES = 32


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class PrefetchL2(Instruction):
    """Ask the L2 to fetch the global tile of ``shape`` at ``offsets`` from DRAM now.

    A hint with no effect on any value: loads that read the tile later find it in L2
    instead of waiting for DRAM, so a loop can keep more bytes in flight than its
    registers or shared memory hold. Parts outside the tensor are skipped. The block's
    threads share the work, one ``prefetch.global.L2`` every 32 bytes of each row (whole
    rows of a dense tensor merged into one run): each sector once when runs start on a
    32-byte boundary, as quant_gemm's do. On sm_90 a run of whole 16-byte chunks is one
    ``cp.async.bulk.prefetch.L2`` instead (one instruction, not one per sector); such a
    run is skipped unless it is 16-byte aligned and wholly inside the tensor.
    """

    mnemonic = "prefetch_l2"
    src: GlobalTensor
    offsets: tuple[Expr, ...]
    shape: tuple[int, ...]

    def check(self) -> None:
        _check_offsets(self, self.offsets, self.src.rank, "global tensor")
        if len(self.shape) != self.src.rank:
            raise self.error(f"shape {list(self.shape)} has rank {len(self.shape)} but the "
                             f"global tensor %{self.src.name} has rank {self.src.rank}")

    def interpret(self, st: BlockState) -> None:
        for o in self.offsets:  # a hint: nothing to do but evaluate its operands
            st.eval(o)

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line(f"// {self}")
        per = max(1, PREFETCH_BYTES * 8 // self.src.dtype.nbits)  # elements per sector
        shape = self.shape
        # rows that continue each other in memory (whole rows of a dense tensor) form one
        # run, so a sector is never asked for twice
        layout, width = self.src.layout, shape[-1]
        merged = (len(shape) >= 2 and const_value(layout.shape[-1]) == width
                  and const_value(layout.strides[-1]) == 1
                  and const_value(layout.strides[-2]) == width)
        outer = shape[:-2] if merged else shape[:-1]
        run = shape[-2] * width if merged else width
        sectors = -(-run // per)
        total = int(np.prod(outer)) * sectors
        threads = cg.program.num_threads
        # whole 16-byte chunks, contiguous (merged runs are; a row must have stride 1)
        bulk = (run * self.src.dtype.nbits % 128 == 0
                and const_value(layout.strides[-1]) == 1)
        if bulk:  # sm_90: one bulk prefetch per run, where it is aligned and inside
            cg.line("#if __CUDA_ARCH__ >= 900")
            self._emit_bulk(cg, outer, merged, run * self.src.dtype.nbits // 8)
            cg.line("#else")
        with cg.block(f"for (int e = tid; e < {total}; e += {threads})"):
            cg.line(f"const int f = (e % {sectors}) * {per};")
            index = _unravel(cg, f"e / {sectors}", outer) + (
                [f"f / {width}", f"f % {width}"] if merged else ["f"])
            ref, inside = global_ref(cg, self.src, self.offsets, index)
            cg.line(f'if ({inside}) asm volatile("prefetch.global.L2 [%0];" :: '
                    f'"l"(&{ref}));')
        if bulk:
            cg.line("#endif")

    def _emit_bulk(self, cg: CudaContext, outer, merged: bool, nbytes: int) -> None:
        """Each run (a row, or whole rows merged) as one ``cp.async.bulk.prefetch.L2``:
        one instruction per run instead of one per sector. A run not wholly inside the
        tensor, or not 16-byte aligned, is skipped (a hint may be dropped)."""
        count = int(np.prod(outer))
        with cg.block(f"for (int e = tid; e < {count}; e += {cg.program.num_threads})"):
            index = _unravel(cg, "e", outer) + ["0"] * (2 if merged else 1)
            ref, inside = global_ref(cg, self.src, self.offsets, index)
            rank = self.src.rank
            last = list(self.shape[-2:]) if merged else [self.shape[-1]]
            ends = [f"i{rank - len(last) + j} + {size - 1} < "
                    f"{cg.expr(self.src.layout.shape[rank - len(last) + j])}"
                    for j, size in enumerate(last)]
            cg.line(f"const unsigned long long lowvm_at = "
                    f"reinterpret_cast<unsigned long long>(&{ref});")
            cond = " && ".join([inside] + ends + ["(lowvm_at & 15) == 0"])
            cg.line(f'if ({cond}) asm volatile("cp.async.bulk.prefetch.L2.global [%0], '
                    f'{nbytes};" :: "l"(lowvm_at) : "memory");')


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class CopyAsync(Instruction):
    """Start copying the global tile of ``shape`` at ``offsets`` into ``dst`` at ``dst_offsets``.

    ``shape`` has the global tensor's rank (default: ``dst``'s trailing dims, i.e. all of
    ``dst`` when the ranks agree); ``dst_offsets`` has ``dst``'s rank (default zeros).
    Tile index ``j`` lands at ``dst_offsets[:lead] + (dst_offsets[lead:] + j)``: leading
    dims of ``dst`` (a pipeline's stage, say) are selected by offset only. The data is
    usable only after ``commit_group``, ``wait_group`` and ``sync``.
    """

    mnemonic = "copy_async"
    dst: SharedTensor
    src: GlobalTensor
    offsets: tuple[Expr, ...]
    shape: tuple[int, ...] | None = None
    dst_offsets: tuple[Expr, ...] | None = None

    @property
    def tile_shape(self) -> tuple[int, ...]:
        """The copied tile's shape (``shape``, or ``dst``'s trailing dims)."""
        if self.shape is not None:
            return self.shape
        return self.dst.shape[max(0, self.dst.rank - self.src.rank):]

    @property
    def dst_start(self) -> tuple[Expr, ...]:
        """Where in ``dst`` the tile starts (``dst_offsets``, or zeros)."""
        if self.dst_offsets is not None:
            return self.dst_offsets
        from lowvm.expr import Const

        return tuple(Const(0) for _ in range(self.dst.rank))

    def check(self) -> None:
        _check_offsets(self, self.offsets, self.src.rank, "global tensor")
        if self.src.dtype != self.dst.dtype:
            raise self.error(
                f"copying {self.src.dtype.name} %{self.src.name} into "
                f"{self.dst.dtype.name} %{self.dst.name}; the types must match"
            )
        if len(self.tile_shape) != self.src.rank:
            raise self.error(
                f"shape {list(self.tile_shape)} has rank {len(self.tile_shape)} but the "
                f"global tensor %{self.src.name} has rank {self.src.rank}; give one size "
                "per global dim")
        _check_shared_tile(self, self.dst, self.dst_start, self.tile_shape, "copied tile")

    def interpret(self, st: BlockState) -> None:
        shape = self.tile_shape
        table = np.indices(shape).reshape(len(shape), -1).T[None]  # [1, N, rank]
        flat, inside = _global_positions(st, self.src, self.offsets, table)
        pos = _shared_positions(self, st, self.dst, self.dst_start, table,
                                write=True).reshape(-1)
        values = np.zeros(flat.shape[1], dtype=np.float64 if self.dst.dtype.is_float else np.int64)
        values[inside[0]] = st.global_buffer(self.src, self).read(flat[0][inside[0]])
        st.shared(self.dst, self).copy_async(pos, values, self, st)

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line(f"// {self}")
        shape = self.tile_shape
        total = int(np.prod(shape))
        threads = cg.program.num_threads
        with cg.block(f"for (int e = tid; e < {total}; e += {threads})"):
            index = _unravel(cg, "e", shape)
            ref, inside = global_ref(cg, self.src, self.offsets, index)
            lead = self.dst.rank - len(shape)
            start = [cg.expr(o) for o in self.dst_start]
            dst_index = start[:lead] + [f"{o} + {j}" for o, j in zip(start[lead:], index)]
            cg.line(f"{cg.shared_ref(self.dst, cg.shared_offset(self.dst, dst_index))} = "
                    f"({inside}) ? {ref} : {_zero(self.dst.dtype)};")


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class CommitGroup(Instruction):
    """Close the group of ``copy_async`` issued since the last commit."""

    mnemonic = "commit_group"

    def interpret(self, st: BlockState) -> None:
        st.commit_group()

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line("// commit_group")
        cg.line('asm volatile("cp.async.commit_group;\\n" ::: "memory");')


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class WaitGroup(Instruction):
    """Wait until at most ``n`` committed groups are still in flight."""

    mnemonic = "wait_group"
    n: int

    def check(self) -> None:
        if not isinstance(self.n, int) or self.n < 0:
            raise self.error(f"n must be a compile-time integer >= 0, got {self.n!r}")

    def interpret(self, st: BlockState) -> None:
        st.wait_group(self.n)

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line(f"// wait_group {self.n}")
        cg.line(f'asm volatile("cp.async.wait_group {self.n};\\n" ::: "memory");')


# ---------------------------------------------------------------------------------------
# CUDA emission helpers


def _zero(dt) -> str:
    from lowvm.dtypes import bfloat16, float16

    if dt == float16:
        return "__ushort_as_half(0)"
    if dt == bfloat16:
        return "__ushort_as_bfloat16(0)"
    return "0"


def global_ref(cg: CudaContext, tensor: GlobalTensor, offsets, index: list[str],
               wide: bool = False) -> tuple[str, str]:
    """(element lvalue, in-bounds condition) of ``offsets + index`` in a global view;
    ``wide``: runtime strides multiply through ``lowvm_wide`` (one ``mul.wide.s32``;
    for an address computed once per K step: elsewhere the asm keeps ptxas from
    rearranging, which cost the prefill GEMM a spill)."""
    conds, terms = [], []
    for d, (off, rel) in enumerate(zip(offsets, index)):
        cg.line(f"const int i{d} = {cg.expr(off)} + {rel};")
        conds.append(f"i{d} >= 0 && i{d} < {cg.expr(tensor.layout.shape[d])}")
        stride = tensor.layout.strides[d]
        terms.append(f"lowvm_wide(i{d}, {cg.expr(stride)})" if wide and not is_const(stride)
                     else f"(lowvm_i64)i{d} * {cg.expr(stride)}")
    return f"{tensor.pointer.name}[{' + '.join(terms)}]", " && ".join(conds)


def _unravel(cg: CudaContext, flat: str, shape) -> list[str]:
    """Emit ``j0 ..`` = the row-major index of the flat element ``flat`` in ``shape``;
    return their names."""
    names, rest = [], flat
    for d in reversed(range(len(shape))):
        cg.line(f"const int j{d} = ({rest}) % {shape[d]};")
        names.insert(0, f"j{d}")
        rest = f"({rest}) / {shape[d]}"
    return names


def _emit_global_access(cg: CudaContext, tensor: GlobalTensor, offsets, tile: RegisterTensor,
                        load: bool, coherent: bool = False, inbounds: bool = False) -> None:
    lay = tile.layout
    cg.line("#pragma unroll")
    with cg.block(f"for (int l = 0; l < {lay.local_size}; ++l)"):
        index = [cg.index(lay, d) for d in range(lay.rank)]
        ref, inside = global_ref(cg, tensor, offsets, index)
        if load:
            value = f"__ldcg(&{ref})" if coherent else ref
            if inbounds:  # asserted by the program, checked by the interpreter
                cg.line(f"{cg.raw_get(tile, 'l')} = {value};")
            else:
                cg.line(f"{cg.raw_get(tile, 'l')} = ({inside}) ? {value} : "
                        f"{_zero(tile.dtype)};")
        else:
            cg.line(f"if ({inside}) {ref} = {cg.raw_get(tile, 'l')};")


def _emit_shared_access(cg: CudaContext, tensor: SharedTensor, offsets, tile: RegisterTensor,
                        load: bool) -> None:
    lay = tile.layout
    cg.line("#pragma unroll")
    with cg.block(f"for (int l = 0; l < {lay.local_size}; ++l)"):
        lead = tensor.rank - lay.rank  # leading shared dims: selected by offset only
        index = [cg.expr(o) for o in offsets[:lead]]
        for d in range(lay.rank):
            cg.line(f"const int i{d} = {cg.expr(offsets[lead + d])} + {cg.index(lay, d)};")
            index.append(f"i{d}")
        ref = cg.shared_ref(tensor, cg.shared_offset(tensor, index))
        if load:
            cg.line(f"{cg.raw_get(tile, 'l')} = {ref};")
        else:
            cg.line(f"{ref} = {cg.raw_get(tile, 'l')};")
