"""The functions a VM program calls: each emits one instruction into the program.

Every function checks its arguments and reports mistakes at the caller's source line
(``ProgramError``). Tiles are values: functions return new tiles, except where ``out=``
names an existing tile to overwrite — the way to update a tile defined before a
``vm.range`` loop from inside it (``vm.dot(a, b, acc, out=acc)``).
"""

from __future__ import annotations

import builtins
import contextlib
import numbers
from collections.abc import Iterator, Sequence

from lowvm.dtypes import DType
from lowvm.dtypes import dtype as as_dtype
from lowvm.expr import Const, Expr, ExprLike, Var, as_expr, const_value, is_const
from lowvm.instructions import (
    AllocShared,
    Assign,
    Cast,
    CommitGroup,
    CopyAsync,
    Dot,
    Elementwise,
    Extract,
    FreeShared,
    GlobalView,
    LoadGlobal,
    LoadShared,
    Permute,
    PrefetchL2,
    Reduce,
    RegisterInit,
    StoreGlobal,
    StoreShared,
    Sync,
    ThreadIndex,
    View,
    WaitGroup,
    WaitPriorGrid,
)
from lowvm.instructions.dot import DOT_TYPES, DotShared, DotWait
from lowvm.instructions.elementwise import COMPARISONS, OPS
from lowvm.ir import (
    BOOL,
    ForStmt,
    GlobalTensor,
    IfStmt,
    LetStmt,
    ProgramError,
    RegisterTensor,
    SharedTensor,
    seq,
    set_tile_operator,
)
from lowvm.lang.builder import MAX_WARPS, Pointer, current, is_warp_count, user_location
from lowvm.layouts import (
    GlobalLayout,
    RegisterLayout,
    SharedLayout,
    global_row_major,
    global_strided,
    shared_row_major,
)
from lowvm.layouts import permute as permute_layout
from lowvm.layouts import reduce as reduce_layout

__all__ = [
    "set_grid", "set_warps", "set_min_blocks", "block_index", "grid_dim", "thread_index", "cdiv",
    "global_view", "load_global", "load_uniform", "store_global", "atomic_add", "arrive",
    "shared_tensor", "free_shared", "load_shared", "store_shared",
    "copy_async", "commit_group", "wait_group", "prefetch_l2",
    "register_tensor", "view", "cast", "permute", "transpose", "assign", "extract",
    "add", "sub", "mul", "div", "mod", "maximum", "minimum", "neg", "abs", "exp", "sqrt",
    "where", "fma", "lt", "le", "gt", "ge", "eq", "ne",
    "reduce", "sum", "max", "min", "dot", "dot_shared", "dot_wait", "sync", "wait_prior_grid",
    "static_assert",
    "range", "if_", "else_", "let",
]  # fmt: skip


def _fail(message: str) -> ProgramError:
    return ProgramError(message, user_location())


def _loc():
    return user_location()


def _offsets(offsets: Sequence[ExprLike] | None, rank: int, what: str) -> tuple[Expr, ...]:
    if offsets is None:
        return tuple(Const(0) for _ in builtins.range(rank))
    offsets = tuple(offsets)
    if len(offsets) != rank:
        raise _fail(f"{what}: {len(offsets)} offsets for a rank-{rank} tensor")
    return tuple(as_expr(o) for o in offsets)


def _static_shape(shape: Sequence[int], what: str) -> tuple[int, ...]:
    out = []
    for s in shape:
        value = const_value(s)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise _fail(f"{what}: tile sizes must be positive compile-time integers, got "
                        f"{list(shape)}")
        out.append(value)
    return tuple(out)


def _out_or_new(out: RegisterTensor | None, dtype: DType, shape: tuple[int, ...],
                layout: RegisterLayout, what: str) -> RegisterTensor:
    b = current()
    if out is None:
        return b.register(dtype, shape, layout, what)
    if not isinstance(out, RegisterTensor):
        raise _fail(f"{what}: out must be a register tile, got {type(out).__name__}")
    known = out.layout is not None and layout is not None  # else inference decides
    if out.dtype != dtype or out.shape != shape or (known and out.layout != layout):
        raise _fail(
            f"{what}: out=%{out.name} is {out.type_str()} but the result is "
            f"{dtype.name}[{', '.join(map(str, shape))}] {layout}"
        )
    return out


# ---------------------------------------------------------------------------------------
# launch configuration and indices


def set_grid(*dims: ExprLike) -> None:
    """The number of blocks along x (and y, z); may depend on runtime arguments."""
    if not 1 <= len(dims) <= 3:
        raise _fail(f"set_grid: 1 to 3 dimensions, got {len(dims)}")
    current().grid = tuple(as_expr(d) for d in dims)


def set_warps(n: int) -> None:
    """Warps per block (a compile-time integer), before any register tile is created."""
    b = current()
    if not is_warp_count(n):
        raise _fail(f"set_warps: n must be an integer in [1, {MAX_WARPS}], got {n!r}")
    if b.tiles_created and b.num_warps != n:
        raise _fail("set_warps: call it before creating register tiles")
    b.num_warps = n


def set_min_blocks(n: int) -> None:
    """Ask the CUDA compiler to fit ``n`` blocks per SM (fewer registers per thread, maybe
    spills): an occupancy hint for latency-bound kernels; the interpreter ignores it.
    ``n = 1`` frees the registers instead: without any hint the compiler may hold a
    kernel to fewer registers than it needs and spill."""
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 32:
        raise _fail(f"set_min_blocks: n must be an integer in [1, 32], got {n!r}")
    current().min_blocks = n


def block_index(dim: int = 0) -> Var:
    """This block's index along ``dim`` (0 = x, 1 = y, 2 = z)."""
    return Var("blockIdx." + "xyz"[dim])


def grid_dim(dim: int = 0) -> Var:
    """The number of blocks along ``dim``."""
    return Var("gridDim." + "xyz"[dim])


def thread_index() -> RegisterTensor:
    """Each thread's index, as an int32 tile of layout ``spatial(threads)``."""
    from lowvm.dtypes import int32
    from lowvm.layouts import spatial

    b = current()
    out = b.register(int32, (b.num_threads,), spatial(b.num_threads), "thread_index")
    b.emit(ThreadIndex(out=out, loc=_loc()))
    return out


def cdiv(a: ExprLike, b: ExprLike) -> Expr | int:
    """Ceiling division ``(a + b - 1) // b`` of non-negative values."""
    if is_const(a) and is_const(b):
        return -(-int(const_value(a)) // int(const_value(b)))
    return (as_expr(a) + (as_expr(b) - 1)) // b


# ---------------------------------------------------------------------------------------
# memory


def global_view(ptr: Pointer, shape: Sequence[ExprLike], strides: Sequence[ExprLike] | None
                = None, layout: GlobalLayout | None = None) -> GlobalTensor:
    """See the memory at pointer ``ptr`` as a tensor of ``shape`` (row-major by default)."""
    if not isinstance(ptr, Pointer):
        raise _fail(f"global_view: ptr must be a pointer parameter, got {ptr!r}")
    if layout is None:
        layout = global_row_major(*shape) if strides is None else global_strided(shape, strides)
    elif tuple(as_expr(s) for s in shape) != layout.shape:
        raise _fail("global_view: give either shape (and strides) or a layout of that shape")
    b = current()
    out = GlobalTensor(b.fresh("g"), ptr.dtype, ptr.var, layout)
    b.emit(GlobalView(out=out, loc=_loc()))
    return out


def load_global(src: GlobalTensor, offsets: Sequence[ExprLike] | None, shape: Sequence[int],
                layout: RegisterLayout | None = None, coherent: bool = False,
                inbounds: bool = False) -> RegisterTensor:
    """Load the tile of ``shape`` at ``offsets``; elements outside the tensor read as 0.

    Without ``layout``, layout inference picks it: the one its consumers need, else
    contiguous 16-byte runs per thread along the last dim. ``coherent=True`` reads what
    other blocks of this launch wrote before an :func:`arrive` (through L2 only).
    ``inbounds=True`` asserts that the tile always lies inside the tensor: the CUDA code
    then skips the per-element bounds test, and the interpreter raises wherever the
    assertion fails (so a CPU run of the program checks it).
    """
    if not isinstance(src, GlobalTensor):
        raise _fail(f"load_global: src must be a global tensor, got {type(src).__name__}")
    shape = _static_shape(shape, "load_global")
    out = current().register(src.dtype, shape, layout, "load_global")
    current().emit(LoadGlobal(out=out, src=src, offsets=_offsets(offsets, src.rank,
                                                                  "load_global"),
                              coherent=bool(coherent), inbounds=True if inbounds else None,
                              loc=_loc()))
    return out


def load_uniform(src: GlobalTensor, offsets: Sequence[ExprLike] | None) -> Var:
    """The int32 at ``src[offsets]`` as a uniform runtime value, usable in offsets, views
    and loop bounds (e.g. a cache position a CUDA graph replays with its current value).
    Every thread reads it: it must not change while the kernel runs (uniformity is what
    barriers and shuffles after it rely on)."""
    from lowvm.instructions.memory import LoadUniform

    if not isinstance(src, GlobalTensor):
        raise _fail(f"load_uniform: src must be a global tensor, got {type(src).__name__}")
    b = current()
    var = Var(b.fresh("u"))
    b.emit(LoadUniform(src=src, offsets=_offsets(offsets, src.rank, "load_uniform"), var=var,
                       loc=_loc()))
    return var


def store_global(dst: GlobalTensor, src: RegisterTensor,
                 offsets: Sequence[ExprLike] | None = None) -> None:
    """Store a tile at ``offsets``; elements outside the tensor are skipped."""
    if not isinstance(dst, GlobalTensor) or not isinstance(src, RegisterTensor):
        raise _fail("store_global: expects (global tensor, register tile, offsets)")
    current().emit(StoreGlobal(dst=dst, src=src, offsets=_offsets(offsets, dst.rank,
                                                                  "store_global"), loc=_loc()))


def atomic_add(dst: GlobalTensor, src: RegisterTensor,
               offsets: Sequence[ExprLike] | None = None) -> None:
    """Atomically add a float32/int32 tile into ``dst`` at ``offsets`` (split-K sums)."""
    from lowvm.instructions.atomic import AtomicAdd

    if not isinstance(dst, GlobalTensor) or not isinstance(src, RegisterTensor):
        raise _fail("atomic_add: expects (global tensor, register tile, offsets)")
    current().emit(AtomicAdd(dst=dst, src=src, offsets=_offsets(offsets, dst.rank,
                                                                "atomic_add"), loc=_loc()))


def arrive(counter: GlobalTensor, offsets: Sequence[ExprLike] | None, count: ExprLike
           ) -> Var:
    """This block arrives at the int32 ``counter[offsets]``: returns how many of the
    ``count`` blocks sharing it arrived before (a uniform int; the last one sees
    ``count - 1`` and the counter resets to 0). What earlier arrivals wrote is then
    readable with ``load_global(..., coherent=True)``::

        seen = vm.arrive(counters, [tile], split)
        with vm.if_(seen.equals(split - 1)):  # the last block of this tile
            ...
    """
    from lowvm.instructions.atomic import Arrive

    if not isinstance(counter, GlobalTensor):
        raise _fail(f"arrive: counter must be a global tensor, got {type(counter).__name__}")
    b = current()
    var = Var(b.fresh("arrived"))
    b.emit(Arrive(counter=counter, offsets=_offsets(offsets, counter.rank, "arrive"),
                  count=as_expr(count), var=var, loc=_loc()))
    return var


def shared_tensor(dtype: DType | str, shape: Sequence[int],
                  layout: SharedLayout | None = None) -> SharedTensor:
    """Allocate a shared tile (row-major unless a shared layout is given)."""
    dt = as_dtype(dtype)
    shape = _static_shape(shape, "shared_tensor")
    layout = layout or shared_row_major(*shape)
    if layout.shape != shape:
        raise _fail(f"shared_tensor: layout shape {list(layout.shape)} != {list(shape)}")
    b = current()
    out = SharedTensor(b.fresh("s"), dt, layout)
    b.emit(AllocShared(out=out, loc=_loc()))
    b.take_shared(out.nbytes, "shared_tensor")
    return out


def free_shared(tensor: SharedTensor) -> None:
    """Release a shared tile."""
    current().emit(FreeShared(tensor=tensor, loc=_loc()))
    current().give_shared(tensor.nbytes)


def load_shared(src: SharedTensor, layout: RegisterLayout | None = None,
                offsets: Sequence[ExprLike] | None = None, shape: Sequence[int] | None = None
                ) -> RegisterTensor:
    """Load a tile (the whole shared tile unless ``shape``/``offsets`` say otherwise).

    Without ``layout``, layout inference picks it (e.g. the MMA layout a ``dot`` needs).

    The tile may have fewer dims than ``src`` (e.g. one stage of ``[stages, rows, cols]``):
    ``offsets`` still has ``src``'s rank, and the leading dims are selected by offset only.
    By default the tile is ``src``'s trailing dims, as many as ``layout`` has.
    """
    if not isinstance(src, SharedTensor):
        raise _fail(f"load_shared: src must be a shared tile, got {type(src).__name__}")
    if shape is None:
        rank = layout.rank if isinstance(layout, RegisterLayout) else src.rank
        shape = src.shape[builtins.max(0, src.rank - rank):]
    shape = _static_shape(shape, "load_shared")
    out = current().register(src.dtype, shape, layout, "load_shared")
    current().emit(LoadShared(out=out, src=src, offsets=_offsets(offsets, src.rank,
                                                                  "load_shared"), loc=_loc()))
    return out


def store_shared(dst: SharedTensor, src: RegisterTensor,
                 offsets: Sequence[ExprLike] | None = None) -> None:
    """Store a register tile into a shared tile at ``offsets`` (``dst``'s rank; the tile
    may have fewer dims, its leading ``dst`` dims selected by offset only)."""
    if not isinstance(dst, SharedTensor) or not isinstance(src, RegisterTensor):
        raise _fail(f"store_shared: expects (shared tile, register tile, offsets), got "
                    f"({type(dst).__name__}, {type(src).__name__})")
    current().emit(StoreShared(dst=dst, src=src, offsets=_offsets(offsets, dst.rank,
                                                                  "store_shared"), loc=_loc()))


def copy_async(dst: SharedTensor, src: GlobalTensor,
               offsets: Sequence[ExprLike] | None = None, shape: Sequence[int] | None = None,
               dst_offsets: Sequence[ExprLike] | None = None) -> None:
    """Start copying the global tile of ``shape`` at ``offsets`` into ``dst`` at ``dst_offsets``.

    ``shape`` has ``src``'s rank (default: ``dst``'s trailing dims); ``dst_offsets`` has
    ``dst``'s rank (default zeros), its leading dims selected by offset only. Elements
    outside ``src`` are zero-filled.
    """
    if not isinstance(dst, SharedTensor) or not isinstance(src, GlobalTensor):
        raise _fail("copy_async: expects (shared tile, global tensor, offsets)")
    tile = None if shape is None else _static_shape(shape, "copy_async")
    current().emit(CopyAsync(
        dst=dst, src=src, offsets=_offsets(offsets, src.rank, "copy_async"), shape=tile,
        dst_offsets=None if dst_offsets is None else _offsets(dst_offsets, dst.rank,
                                                              "copy_async dst_offsets"),
        loc=_loc()))


def prefetch_l2(src: GlobalTensor, offsets: Sequence[ExprLike] | None,
                shape: Sequence[int]) -> None:
    """Start fetching the global tile of ``shape`` at ``offsets`` from DRAM into the L2.

    A hint that changes no value: a later load of the tile waits for the L2, not for
    DRAM. Streaming loops use it to keep more bytes in flight than their registers or
    shared memory can hold. Parts outside ``src`` are skipped.
    """
    if not isinstance(src, GlobalTensor):
        raise _fail(f"prefetch_l2: src must be a global tensor, got {type(src).__name__}")
    tile = _static_shape(shape, "prefetch_l2")
    current().emit(PrefetchL2(src=src, offsets=_offsets(offsets, src.rank, "prefetch_l2"),
                              shape=tile, loc=_loc()))


def commit_group() -> None:
    """Close the group of copy_async issued since the last commit."""
    current().emit(CommitGroup(loc=_loc()))


def wait_group(n: int = 0) -> None:
    """Wait until at most ``n`` committed groups are still in flight."""
    current().emit(WaitGroup(n=n, loc=_loc()))


# ---------------------------------------------------------------------------------------
# data


def register_tensor(dtype: DType | str, shape: Sequence[int],
                    layout: RegisterLayout | None = None, init: ExprLike = 0
                    ) -> RegisterTensor:
    """A register tile filled with ``init`` (layout inferred from its uses if omitted)."""
    dt = as_dtype(dtype)
    out = current().register(dt, _static_shape(shape, "register_tensor"), layout,
                             "register_tensor")
    current().emit(RegisterInit(out=out, value=as_expr(init), loc=_loc()))
    return out


def view(x: RegisterTensor, dtype: DType | str, layout: RegisterLayout | None = None,
         shape: Sequence[int] | None = None) -> RegisterTensor:
    """Reinterpret each thread's bits of ``x`` as ``dtype`` laid out by ``layout``.

    Without ``layout`` the shape is ``x``'s with the last dim rescaled by the ratio of
    the types' bit widths (``shape=`` overrides), and inference derives the layout from
    ``x``'s: the same threads, each keeping its bits.
    """
    x = _tile(x, "view")
    dt = as_dtype(dtype)
    if layout is not None:
        if not isinstance(layout, RegisterLayout):
            raise _fail(f"view: layout must be a RegisterLayout, got {layout!r}")
        if shape is not None and tuple(shape) != layout.shape:
            raise _fail(f"view: shape {list(shape)} differs from the layout's shape "
                        f"{list(layout.shape)}")
        shape_t = layout.shape
    elif shape is not None:
        shape_t = _static_shape(shape, "view")
    else:
        bits = x.shape[-1] * x.dtype.nbits
        if bits % dt.nbits:
            raise _fail(f"view: the last dim of %{x.name} ({x.shape[-1]} x {x.dtype.nbits} "
                        f"bits) is not a whole number of {dt.nbits}-bit {dt.name} values; "
                        "pass shape=... (and layout=...)")
        shape_t = (*x.shape[:-1], bits // dt.nbits)
    out = current().register(dt, shape_t, layout, "view")
    current().emit(View(out=out, src=x, loc=_loc()))
    return out


def cast(x: RegisterTensor, dtype: DType | str, out: RegisterTensor | None = None,
         layout: RegisterLayout | None = None) -> RegisterTensor:
    """Convert to ``dtype`` (round to nearest even, saturating).

    ``layout``: the result's layout, when it is ``x``'s elements per thread in another
    register order (checked); the reordering is a renaming, so a cast can hand its
    result straight to an instruction that wants that order (e.g. an MMA operand).
    """
    x = _tile(x, "cast")
    if layout is not None and not isinstance(layout, RegisterLayout):
        raise _fail(f"cast: layout must be a RegisterLayout, got {layout!r}")
    out = _out_or_new(out, as_dtype(dtype), x.shape, layout or x.layout, "cast")
    current().emit(Cast(out=out, src=x, relayout=layout is not None, loc=_loc()))
    return out


def permute(x: RegisterTensor, dims: Sequence[int]) -> RegisterTensor:
    """Reorder the tile's dims (threads keep their registers)."""
    x = _tile(x, "permute")
    dims = tuple(dims)
    if sorted(dims) != list(builtins.range(x.rank)):
        raise _fail(f"permute: dims must be a permutation of 0..{x.rank - 1}, got {list(dims)}")
    lay = None if x.layout is None else permute_layout(x.layout, dims)
    shape = tuple(x.shape[d] for d in dims)
    out = current().register(x.dtype, shape, lay, "permute")
    current().emit(Permute(out=out, src=x, dims=dims, loc=_loc()))
    return out


def transpose(x: RegisterTensor) -> RegisterTensor:
    """Swap the two dims of a 2-D tile."""
    return permute(x, (1, 0))


def assign(dst: RegisterTensor, src: RegisterTensor) -> None:
    """Overwrite ``dst`` with ``src`` (same type, shape and layout)."""
    current().emit(Assign(out=_tile(dst, "assign"), src=_tile(src, "assign"), loc=_loc()))


def extract(x: RegisterTensor, offsets: Sequence[int], shape: Sequence[int],
            layout: RegisterLayout) -> RegisterTensor:
    """The ``shape`` sub-tile of ``x`` at the static ``offsets``, in ``layout``: each thread
    takes its elements from its own registers (a renaming, free on the GPU), e.g. the
    16-deep K slices of an MMA operand converted in one piece::

        w16 = vm.extract(w, [16 * kk, 0], [16, bn], mma16.b)
    """
    x = _tile(x, "extract")
    offs = tuple(const_value(o) for o in offsets)
    offs = tuple(int(o) if isinstance(o, numbers.Integral) else o for o in offs)
    if any(not isinstance(o, int) for o in offs):
        raise _fail(f"extract: offsets must be compile-time integers, got {list(offsets)}")
    out = current().register(x.dtype, _static_shape(shape, "extract"), layout, "extract")
    current().emit(Extract(out=out, src=x, offsets=offs, loc=_loc()))
    return out


# ---------------------------------------------------------------------------------------
# elementwise arithmetic


def _tile(x: object, what: str) -> RegisterTensor:
    if not isinstance(x, RegisterTensor):
        raise _fail(f"{what}: expected a register tile, got {type(x).__name__}: {x!r}")
    return x


def _elementwise(op: str, *args, out: RegisterTensor | None = None,
                 layout: RegisterLayout | None = None) -> RegisterTensor:
    tiles = [a for a in args if isinstance(a, RegisterTensor)]
    if not tiles:
        raise _fail(f"{op}: at least one operand must be a register tile")
    values = [a for a in (args[1:] if op == "where" else args) if isinstance(a, RegisterTensor)]
    dtype = values[0].dtype if values else tiles[-1].dtype
    for a in args:
        if not isinstance(a, (RegisterTensor, Expr, int, float, bool)):
            raise _fail(f"{op}: operands must be tiles or scalars, got {type(a).__name__}")
    ranks = {t.rank for t in tiles}
    if len(ranks) > 1:
        raise _fail(f"{op}: operands have different ranks {sorted(ranks)}")
    shape = []
    for d in builtins.range(tiles[0].rank):
        sizes = {t.shape[d] for t in tiles} - {1}
        if len(sizes) > 1:
            raise _fail(f"{op}: shapes {[list(t.shape) for t in tiles]} do not broadcast")
        shape.append(sizes.pop() if sizes else 1)
    shape_t = tuple(shape)
    if layout is None:
        full = [t for t in tiles if t.shape == shape_t]
        if out is not None:
            layout = out.layout
        elif full:
            layout = full[0].layout
        # else: no operand has the result's shape; layout inference gives it one
    result_type = BOOL if op in COMPARISONS else dtype
    result = _out_or_new(out, result_type, shape_t, layout, op)
    operands = tuple(a if isinstance(a, RegisterTensor) else as_expr(a) for a in args)
    current().emit(Elementwise(out=result, op=op, args=operands, loc=_loc()))
    return result


def _binary(op: str):
    def fn(a, b, out: RegisterTensor | None = None) -> RegisterTensor:
        return _elementwise(op, a, b, out=out)

    fn.__name__ = op
    fn.__doc__ = f"Elementwise ``{op}`` of two tiles or a tile and a scalar (broadcasting)."
    return fn


def _unary(op: str):
    def fn(a, out: RegisterTensor | None = None) -> RegisterTensor:
        return _elementwise(op, a, out=out)

    fn.__name__ = op
    fn.__doc__ = f"Elementwise ``{op}`` of a tile."
    return fn


add, sub, mul, div, mod = (_binary(o) for o in ("add", "sub", "mul", "div", "mod"))
maximum, minimum = _binary("max"), _binary("min")
lt, le, gt, ge, eq, ne = (_binary(o) for o in ("lt", "le", "gt", "ge", "eq", "ne"))
neg, abs, exp, sqrt = (_unary(o) for o in ("neg", "abs", "exp", "sqrt"))  # noqa: A001
maximum.__name__, minimum.__name__ = "maximum", "minimum"


def where(cond, a, b, out: RegisterTensor | None = None) -> RegisterTensor:
    """``a`` where ``cond`` (a bool tile) holds, else ``b``."""
    return _elementwise("where", cond, a, b, out=out)


def fma(a, b, c, out: RegisterTensor | None = None) -> RegisterTensor:
    """``a * b + c`` rounded once."""
    return _elementwise("fma", a, b, c, out=out)


assert set(OPS) == {"neg", "abs", "exp", "sqrt", "add", "sub", "mul", "div", "mod", "max",
                    "min", "lt", "le", "gt", "ge", "eq", "ne", "where", "fma"}


def reduce(x: RegisterTensor, dim: int, op: str = "sum", keepdims: bool = False
           ) -> RegisterTensor:
    """Reduce over ``dim`` with ``sum``, ``max`` or ``min``."""
    x = _tile(x, "reduce")
    if not isinstance(dim, int) or not -x.rank <= dim < x.rank:
        raise _fail(f"reduce: dim must be in [{-x.rank}, {x.rank}), got {dim!r}")
    dim %= x.rank
    lay = None if x.layout is None else reduce_layout(x.layout, [dim], keepdims=keepdims)
    shape = tuple(1 if d == dim else s for d, s in enumerate(x.shape)) if keepdims else (
        tuple(s for d, s in enumerate(x.shape) if d != dim) or (1,))
    out = current().register(x.dtype, shape, lay, "reduce")
    current().emit(Reduce(out=out, src=x, op=op, dim=dim, keepdims=keepdims, loc=_loc()))
    return out


def sum(x: RegisterTensor, dim: int, keepdims: bool = False) -> RegisterTensor:  # noqa: A001
    """Sum over ``dim``."""
    return reduce(x, dim, "sum", keepdims)


def max(x: RegisterTensor, dim: int, keepdims: bool = False) -> RegisterTensor:  # noqa: A001
    """Maximum over ``dim``."""
    return reduce(x, dim, "max", keepdims)


def min(x: RegisterTensor, dim: int, keepdims: bool = False) -> RegisterTensor:  # noqa: A001
    """Minimum over ``dim``."""
    return reduce(x, dim, "min", keepdims)


def dot(a: RegisterTensor, b: RegisterTensor, c: RegisterTensor,
        out: RegisterTensor | None = None) -> RegisterTensor:
    """``a @ b + c`` (f16/bf16 accumulate in f32, int8 in int32); ``out=c`` accumulates."""
    a, b, c = _tile(a, "dot"), _tile(b, "dot"), _tile(c, "dot")
    if a.dtype not in DOT_TYPES:
        raise _fail(f"dot: operand type {a.dtype.name} is not supported; accepted: "
                    f"{', '.join(t.name for t in DOT_TYPES)}")
    result = _out_or_new(out, c.dtype, c.shape, c.layout, "dot")
    current().emit(Dot(out=result, a=a, b=b, c=c, loc=_loc()))
    return result


def dot_shared(a: RegisterTensor, b: SharedTensor, c: RegisterTensor,
               offsets: Sequence[ExprLike] | None = None, shape: Sequence[int] | None = None,
               out: RegisterTensor | None = None, wait: bool = True) -> RegisterTensor:
    """``a @ tile^T + c`` with ``tile`` the ``[N, K]`` tile of shared ``b`` at ``offsets``
    (default: ``b``'s last two dims): the tensor cores read ``b`` in place (``wgmma`` on
    sm_90a where the layouts fit, see :class:`lowvm.instructions.DotShared`). ``a`` and
    ``c`` need layouts, e.g. from :func:`lowvm.layouts.wgmma_layouts`; ``out=c``
    accumulates. ``wait=False`` lets the call return before the multiply completes: until
    :func:`dot_wait`, the registers of ``a`` (and of what ``a`` renames), the result and
    the tile may not be overwritten or, the result, read (the interpreter checks it). The
    wgmma lowering still waits at the call: issuing without waiting gave wrong sums on
    the H100."""
    a, c = _tile(a, "dot_shared"), _tile(c, "dot_shared")
    if not isinstance(b, SharedTensor):
        raise _fail(f"dot_shared: b must be a shared tile, got {type(b).__name__}")
    if b.rank < 2:
        raise _fail(f"dot_shared: b must have at least 2 dims, got shape {list(b.shape)}")
    tile = _static_shape(shape if shape is not None else b.shape[-2:], "dot_shared")
    if len(tile) != 2:
        raise _fail(f"dot_shared: shape must be [N, K], got {list(tile)}")
    result = _out_or_new(out, c.dtype, c.shape, c.layout, "dot_shared")
    current().emit(DotShared(out=result, a=a, b=b, offsets=_offsets(offsets, b.rank,
                                                                      "dot_shared"),
                             shape=(tile[0], tile[1]), c=c, wait=bool(wait), loc=_loc()))
    return result


def dot_wait(*tiles: RegisterTensor) -> None:
    """Wait for every :func:`dot_shared` issued with ``wait=False``. Name the register
    tiles they read and accumulate into (``a``, or the tile ``a`` was extracted or
    transposed from, and the accumulator): the lowering keeps those registers reserved
    until here, so values computed meanwhile (in a loop, the next step's operands) go
    elsewhere."""
    current().emit(DotWait(tiles=tuple(_tile(t, "dot_wait") for t in tiles), loc=_loc()))


# ---------------------------------------------------------------------------------------
# control


def sync() -> None:
    """Block-wide barrier."""
    current().emit(Sync(loc=_loc()))


def wait_prior_grid() -> None:
    """Wait for the grid launched before this one on the stream (its writes visible).

    Put it before the first read of anything an earlier kernel writes (activations) and
    the first write of anything it may read; work before it (loads of weights, address
    set-up) then overlaps that kernel's tail when the launch allows overlap (sm_90+,
    ``overlap=True``). A no-op otherwise and in the interpreter.
    """
    current().emit(WaitPriorGrid(loc=_loc()))


def static_assert(cond: object, message: str = "") -> None:
    """Check a compile-time condition while the program is built."""
    value = const_value(cond) if isinstance(cond, Expr) else cond
    if value is None:
        raise _fail(f"static_assert: the condition {cond} is not known at compile time")
    if not value:
        raise _fail(f"static_assert failed: {message or cond}")


def range(start: ExprLike, stop: ExprLike | None = None, step: ExprLike = 1,  # noqa: A001
          unroll: int | None = None, stages: int | None = None) -> Iterator[Var]:
    """A VM loop (``for k in vm.range(n):``); the body is traced once.

    Use plain Python ``range`` over compile-time values to unroll while tracing.
    ``stages=S`` (S >= 2) software-pipelines the loop's ``copy_async`` tiles, S - 1 in
    flight (see :mod:`lowvm.passes.software_pipeline` for the loop shapes accepted);
    ``None`` or 1 leaves the loop as written.
    """
    if stages is not None and (not isinstance(stages, int) or isinstance(stages, bool)
                               or stages < 1):
        raise _fail(f"range: stages must be None or an integer >= 1, got {stages!r}")
    if stop is None:
        start, stop = 0, start
    bounds = []
    for name, bound in (("start", start), ("stop", stop), ("step", step)):
        if _is_integer(bound):
            bound = int(bound)
        elif not isinstance(bound, Expr) or (isinstance(bound, Var) and bound.dtype != "int32") \
                or (isinstance(bound, Const) and not _is_integer(bound.value)):
            raise _fail(f"range: {name} must be an integer or a runtime int32 value, got "
                        f"{bound!r}" + (f" ({bound.dtype})" if isinstance(bound, Var) else ""))
        bounds.append(as_expr(bound))
    start, stop, step = bounds
    if const_value(step) == 0:
        raise _fail("range: the step is 0; a loop with step 0 never ends (accepted: a "
                    "positive step counts up, a negative one down, as Python's range)")
    b = current()
    loc = _loc()
    var = Var(b.fresh("i"))
    b.push()
    try:
        yield var
    except GeneratorExit:
        # The loop was left early (``break``/``return``). Python closes this generator
        # when the loop is dropped, where an exception would only be printed as
        # "ignored": record it; the next VM call or the end of tracing raises it.
        b.pop()
        b.defer(ProgramError("`break` and `return` are not supported inside vm.range "
                             "loops", loc))
        return
    body = b.pop()
    b.append(ForStmt(var, start, stop, step, seq(body), unroll,
                     loc, stages=stages))


def _is_integer(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@contextlib.contextmanager
def if_(cond: ExprLike) -> Iterator[None]:
    """``with vm.if_(cond):`` — a branch on a uniform runtime condition.

    ``==`` on runtime values compares expression trees (they are dict keys), so a Python
    bool here is refused: write ``x.equals(y)`` / ``x.not_equals(y)`` for runtime tests,
    and a plain Python ``if`` for compile-time ones.
    """
    if isinstance(cond, bool):
        raise _fail(
            f"if_: the condition is the Python bool {cond}; for a runtime comparison "
            "write `x.equals(y)` (== compares expressions), for a compile-time one use "
            "a Python `if`"
        )
    b = current()
    loc = _loc()
    b.push()
    yield
    b.append(IfStmt(as_expr(cond), seq(b.pop()), None, loc))


@contextlib.contextmanager
def else_() -> Iterator[None]:
    """``with vm.else_():`` right after a ``with vm.if_(...)`` block."""
    b = current()
    stmts = b.stack[-1]
    if not stmts or not isinstance(stmts[-1], IfStmt) or stmts[-1].else_body is not None:
        raise _fail("else_: must directly follow a `with vm.if_(...)` block")
    branch = stmts.pop()
    b.push()
    yield
    stmts.append(IfStmt(branch.cond, branch.then_body, seq(b.pop()), branch.loc))


def let(value: ExprLike, name: str = "v") -> Var:
    """Bind a uniform scalar once (``k0 = vm.let(k * 64)``) and use the variable."""
    b = current()
    var = Var(b.fresh(name))
    b.append(LetStmt(var, as_expr(value), _loc()))
    return var


def _tile_operator(name: str, *args):
    """``a + b`` on register tiles: the op of that name here (``add(a, b)``)."""
    return globals()[name](*args)


set_tile_operator(_tile_operator)
