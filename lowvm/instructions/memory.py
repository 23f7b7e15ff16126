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

import numpy as np

from lowvm.dtypes import int32
from lowvm.expr import INT32_MAX, INT32_MIN, Expr, Var, const_value
from lowvm.instructions.base import BlockState, Instruction, register_instruction
from lowvm.ir import GlobalTensor, ProgramError, RegisterTensor, SharedTensor

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
    """Flat element offsets of ``offsets + table`` and the in-bounds mask.

    As in the kernel: the offsets are int32 expressions (wrapped), each element's index
    ``offset + j`` an int32 and its flat offset a 64-bit sum of index times stride. An
    index ``offset + j`` beyond int32 is refused: the kernel's per-element and vector
    lowerings would not wrap it alike.
    """
    shape, strides = st.global_shape(tensor)
    start = np.array([int(st.eval(o)) for o in offsets], dtype=np.int64)
    index = table + start
    if index.size and (index.min() < INT32_MIN or index.max() > INT32_MAX):
        d = int(np.argmax(((index < INT32_MIN) | (index > INT32_MAX)).reshape(
            -1, index.shape[-1]).any(axis=0)))
        raise ProgramError(
            f"the tile at offsets {start.tolist()} of %{tensor.name} has element indices "
            f"beyond int32 along dim {d} (offset {int(start[d])} plus up to "
            f"{int(table[..., d].max())}); the kernel's 32-bit indices would overflow")
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
            raise st.runtime_error(
                self, f"inbounds=True, but the {list(self.out.shape)} tile at offsets {start} "
                f"reaches outside %{self.src.name} of shape {list(st.global_shape(self.src)[0])}")
        values = np.zeros(flat.shape, dtype=np.float64 if self.out.dtype.is_float else np.int64)
        values[inside] = st.global_buffer(self.src, self).read(flat[inside])
        st.set(self.out, values)


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


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class FreeShared(Instruction):
    """Release a shared tile; later uses are errors."""

    mnemonic = "free_shared"
    tensor: SharedTensor

    def interpret(self, st: BlockState) -> None:
        st.free_shared(self.tensor, self)


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
    _check_constant_offsets(inst, tensor, offsets, tile_shape, what)


def _check_constant_offsets(inst: Instruction, tensor: SharedTensor, offsets: tuple[Expr, ...],
                            tile_shape: tuple[int, ...], what: str) -> None:
    """Offsets known when the program is built must keep the tile inside ``tensor``: the
    CUDA code does not test shared indices, so an access outside would write or read
    another tile's memory (only the interpreter would notice, and only if it runs)."""
    lead = tensor.rank - len(tile_shape)
    extents = (1,) * lead + tuple(tile_shape)
    for d, (offset, extent, size) in enumerate(zip(offsets, extents, tensor.shape)):
        start = const_value(offset)
        if start is None or 0 <= start <= size - extent:
            continue
        span = f"index {start}" if extent == 1 else f"indices [{start}, {start + extent})"
        raise inst.error(
            f"the {what} {list(tile_shape)} at offsets [{', '.join(map(str, offsets))}] reaches "
            f"outside the shared tile %{tensor.name} of shape {list(tensor.shape)}: along "
            f"dim {d} it covers {span}; accepted: offsets from 0 to {size - extent} there")


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


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class CommitGroup(Instruction):
    """Close the group of ``copy_async`` issued since the last commit."""

    mnemonic = "commit_group"

    def interpret(self, st: BlockState) -> None:
        st.commit_group()


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
