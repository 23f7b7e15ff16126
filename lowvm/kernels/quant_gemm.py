"""The quantized GEMM of the kernel library: ``y = x @ dequant(W)^T`` for 1..8-bit weights.

Why it is fast (and how it differs from :mod:`lowvm.kernels.quant_matmul`):

- **Repacked weights** (:func:`repack_weights`): offline, each ``bk x bn`` weight tile is
  stored as the concatenated register contents of the threads that hold it in the MMA
  B-operand layout. A thread's ``load_global`` is then one or a few 16-byte loads, its
  ``view`` reinterprets those bits as its B fragments, and no shuffle through shared
  memory is needed: the weight stream goes global -> registers -> tensor cores.
- **Dequantisation in registers**: codes are ``cast`` to float16 (exact) right before
  ``dot`` (``mma.sync``); the group's scale then multiplies the step's float32 products
  (``acc += (x @ q) * scale``, the same sum as ``x @ (q * scale)`` since a K step lies in
  one group): ``bm x bn`` multiplies per step instead of ``bk x bn``. Codes of 1..7
  bits are stored in :func:`stored_order`, so the cast's 32-bit lanes are already MMA
  register pairs.
- **Activations** ``x`` go through swizzled shared memory (``cp.async`` in, ``ldmatrix``
  out), so they are read from L2 once per block.
- **Split-K** (``split > 1``): the grid's second dim cuts K so that small-N shapes still
  put every SM to work streaming weights; partial tiles are added atomically into a
  float32 workspace; with ``fused_split`` (the library's choice for M <= 16) the last
  block of each tile (:func:`store_result`, through ``vm.arrive``) converts it and
  clears it — one launch, no memset — else :func:`finish_split` does, as a second
  kernel (measured faster at M = 64). ``ws`` (``[m, n]`` float32) and ``counters``
  (int32, at least ``cdiv(m, bm) * cdiv(n, bn)``) must start zeroed; both are left
  zeroed.
- **Prefetch**: ``prefetch`` K steps of weights and group scales in flight per thread,
  in round-robin register buffers (no register moves, so each load hides behind
  ``prefetch`` steps of math); ``x`` comes in ``prefetch`` steps at a time.
- **x held whole** (``x_whole``, the library's choice at M <= 16 where it fits): x for the
  block's whole K range is copied into shared memory once, before the main loop, which
  then has no copy and no barrier; with ``x_rows=1`` the one row of a decode step is held
  once and read as all 16 rows of the MMA tile through a stride-0 shared layout, and a
  block covers one row of y (:func:`_whole_x_loop`).
- **Weights as A at batch 1** (``swap_ab``, with ``x_rows=1``; the library's choice at
  M = 1): each step computes ``y^T = q^T @ x^T``, so an ``m16n8k16`` covers 16 weight rows
  and uses one of its 8 columns, where x as A used one of its 16 rows: half the
  ``mma.sync``, ``ldmatrix`` and scale multiplies, the same conversion (:class:`_Swapped`).
  On the H100 4096 x 28672 went 26.1 -> 24.2 us (int4), 27.4 -> 21.6 (int3)
  (`python -m lowvm.bench schedules`).

- **Narrow blocks** (``bn`` = 32 or 16: 2 or 1 warps): a block reads its warps' rows of
  the 64-wide format tiles (:meth:`_Block.load_weights`), so one repacked copy also serves
  grids of twice or four times as many, smaller blocks, which fit more evenly on the SMs.
  A schedule option, not the library's choice: on the H100 they measured slower on
  4096 x 28672 (37.9 vs 35.4 us at M = 1; each block loads x and runs its prologue) and
  faster only on 4096 x 14336 at split 2 (24.7 vs 26.2).

Shapes: ``k`` a multiple of ``bk * split * steps_per_copy``, ``n`` of ``bn``, ``group`` a
multiple of ``bk`` (or ``k`` itself, per-channel), ``k / split <= x_whole`` when set (the
library checks it before a launch); ``m`` is anything (rows are masked).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import lowvm.lang as vm
from lowvm.dtypes import DType
from lowvm.expr import minimum
from lowvm.kernels.gemm_schedule import GemmSchedule, gemm_listing
from lowvm.kernels.weight_format import (
    FORMAT_BN,
    FORMAT_WARPS_N,
    WeightLayouts,
    deinterleave_chunks,
    interleave_chunks,
    repack_index,
    repack_weights,
    schedule_layouts,
    unpack_repacked,
    weight_layouts,
)
from lowvm.layouts import (
    RegisterLayout,
    permute,
    reduce,
    shared_row_major,
    shared_strided,
    swizzle_128b,
)
from lowvm.layouts.mma_tiling import BlockMmaLayouts, block_mma_layouts
from lowvm.layouts.shared import staged_layout

# the schedule and the weight format live in their own modules; their names stay
# importable from here, where the program that uses them is
__all__ = ["quant_gemm", "store_result", "finish_split", "GemmSchedule", "weight_layouts",
           "schedule_layouts", "repack_index", "repack_weights", "unpack_repacked",
           "interleave_chunks", "deinterleave_chunks", "WeightLayouts", "FORMAT_BN",
           "FORMAT_WARPS_N"]


#: the schedule fields quant_gemm reads (all but ``wgmma``: the kernel choice)
_FIELDS = tuple(f.name for f in fields(GemmSchedule) if f.name != "wgmma")
#: the schedule a build without one takes: a 16 x 64 block tile on 4 warps, one K step
_DEFAULT_SCHEDULE = GemmSchedule()


@dataclass(frozen=True)
class _Block:
    """What both bodies of :func:`quant_gemm` set up the same way: layouts, the block's
    place in the grid and the global views."""

    lw: WeightLayouts
    col0: Any
    row0: Any
    n_tiles: Any
    k_steps: Any
    k_tile0: Any
    gx: Any
    gw: Any
    gs: Any
    gz: Any
    parts: int = 1  # blocks per format tile (FORMAT_BN // bn)

    def weight_row(self, kt: Any) -> Any:
        """First row of K step ``kt``'s tile for this block's N tile."""
        return (kt * self.n_tiles + vm.block_index(0)) * self.lw.tile_rows

    def load_weights(self, kt: Any) -> Any:
        """This block's packed weights of K step ``kt`` (layout ``lw.packed``)."""
        offsets, shape, layout = self._weight_tile(kt)
        return vm.load_global(self.gw, offsets, shape, layout, inbounds=True)

    def prefetch_weights(self, kt: Any) -> None:
        """Ask the L2 for the bytes :meth:`load_weights` will read at K step ``kt``."""
        offsets, shape, _ = self._weight_tile(kt)
        vm.prefetch_l2(self.gw, offsets, shape)

    def _weight_tile(self, kt: Any) -> tuple[list, list[int], Any]:
        """(offsets, shape, layout) of K step ``kt``'s weights in ``gw``.

        A block narrower than the format's tile (``bn`` = 16 or 32: 1 or 2 warps of 16
        columns) reads its warps' rows of each of the tile's ``vectors`` row groups, through
        a 3-D view ``[groups, format rows, chunk]``: the same bytes, in the same per-thread
        order, as a full-width block's warps would hold."""
        lw = self.lw
        if self.parts == 1:
            return [self.weight_row(kt), 0], [lw.tile_rows, lw.chunk], lw.packed
        nt, part = vm.block_index(0) // self.parts, vm.block_index(0) % self.parts
        group0 = (kt * (self.n_tiles // self.parts) + nt) * lw.vectors
        return ([group0, part * lw.rows, 0], [lw.vectors, lw.rows, lw.chunk],
                lw.packed_3d)


def _setup(m, n, k, x, w, scales, zeros, adtype: DType, wtype: DType, group: int,
           s: GemmSchedule) -> _Block:
    """Layouts, grid and views; a block covers ``s.rows`` rows of y."""
    bm, bn, bk, warps_m, warps_n, min_blocks = s.bm, s.bn, s.bk, s.warps_m, s.warps_n, s.min_blocks
    rows = s.rows
    vm.static_assert(group % bk == 0, f"bk={bk} must divide the group size {group}")
    lw = weight_layouts(wtype, bm, bn, bk, warps_m, warps_n, adtype)
    vm.set_warps(warps_m * warps_n)
    if min_blocks > 1:  # (1: no hint, as the schedules were measured)
        vm.set_min_blocks(min_blocks)
    vm.set_grid(vm.cdiv(n, bn), s.split, vm.cdiv(m, rows))
    col0, row0 = vm.block_index(0) * bn, vm.block_index(2) * rows
    n_tiles = n // bn
    k_steps = k // bk // s.split
    k_tile0 = vm.block_index(1) * k_steps
    gx = vm.global_view(x, [m, k])
    parts = FORMAT_BN // bn
    vm.static_assert(bn * parts == FORMAT_BN and warps_n * 16 == bn,
                     f"bn={bn}, warps_n={warps_n}: a block reads whole warps of the weight "
                     f"format (bn = 16 x warps_n, dividing {FORMAT_BN})")
    # repacked weights: tile (kt, nt) is rows [(kt * n_tiles + nt) * tile_rows, +tile_rows)
    if parts == 1:
        gw = vm.global_view(w, [(k // bk) * n_tiles * lw.tile_rows, lw.chunk])
    else:  # row group (kt * format tiles + nt) * vectors + v holds the tile's vector v
        gw = vm.global_view(w, [(k // bk) * (n // FORMAT_BN) * lw.vectors,
                                FORMAT_WARPS_N * 32, lw.chunk])
    gs = vm.global_view(scales, [k // group, n])
    gz = vm.global_view(zeros, [k // group, n])
    return _Block(lw, col0, row0, n_tiles, k_steps, k_tile0, gx, gw, gs, gz, parts)


@vm.program(listing=gemm_listing(*_FIELDS))
def quant_gemm(m: vm.int32, n: vm.int32, k: vm.int32, x: vm.ptr[vm.dtype_of("adtype")],
               w: vm.ptr[vm.uint8], scales: vm.ptr[vm.dtype_of("adtype")],
               zeros: vm.ptr[vm.dtype_of("adtype")], y: vm.ptr[vm.dtype_of("adtype")],
               ws: vm.ptr[vm.float32], counters: vm.ptr[vm.int32],
               adtype: vm.constexpr = vm.float16, wtype: vm.constexpr = vm.int4,
               group: int = 128, zero_point: bool = False,
               schedule: GemmSchedule = _DEFAULT_SCHEDULE):
    """``y[m, n] = x[m, k] @ dequant(w)^T``, ``x``, ``scales``, ``zeros`` and ``y`` of
    ``adtype`` (float16 or bfloat16); split-K through ``ws``/``counters``
    (:func:`store_result`).

    ``dequant(w) = (q - zeros) * scales`` with ``zero_point`` (zeros hold codes), else
    ``q * scales``; ``zeros`` is not read without ``zero_point``.
    """
    s = schedule
    bm, bn, bk, warps_m, warps_n, split = s.bm, s.bn, s.bk, s.warps_m, s.warps_n, s.split
    prefetch, x_steps, l2_ahead, k_slice = s.prefetch, s.x_steps, s.l2_ahead, s.k_slice
    x_whole, x_rows, swap_ab = s.x_whole, s.x_rows, s.swap_ab
    ks = k_slice or bk
    vm.static_assert(not swap_ab or (x_rows == 1 and warps_m == 1 and not k_slice),
                     f"swap_ab computes y^T one row of x at a time: it needs x_rows=1, "
                     f"warps_m=1 and k_slice=0, got {x_rows}, {warps_m}, {k_slice}")
    vm.static_assert(x_rows in (0, 1, bm), f"x_rows={x_rows} must be 0 (bm), 1 or bm={bm}")
    vm.static_assert(x_rows != 1 or x_whole, f"x_rows=1 reads one row of x as every row "
                     f"of the MMA tile, which needs x_whole (x resident for the block's K "
                     f"range), got x_whole={x_whole}")
    vm.static_assert(x_whole >= 0 and x_whole % bk == 0, f"x_whole={x_whole} must be 0 "
                     f"(x copied per step) or a positive multiple of bk={bk}")
    if x_whole:
        vm.static_assert(not (s.weights_shared or x_steps or s.stages), f"x_whole "
                         f"copies x once and keeps the register body's loop free of copies: "
                         f"weights_shared, x_steps and stages must be off, got "
                         f"{s.weights_shared}, {x_steps}, {s.stages}")
    vm.static_assert(ks > 0 and bk % ks == 0 and ks % 16 == 0, f"k_slice={k_slice} must be "
                     f"a multiple of 16 dividing bk={bk} (or 0: the whole step)")
    vm.static_assert(x_steps >= 0, f"x_steps={x_steps} must be 0 (prefetch's) or positive")
    vm.static_assert(l2_ahead >= 0, f"l2_ahead={l2_ahead} must be 0 (none) or positive")
    if s.weights_shared:
        vm.static_assert(x_steps in (0, 1) and not l2_ahead, f"weights_shared copies x one K "
                         f"step at a time and stages the weights itself: x_steps must be 0 "
                         f"or 1 and l2_ahead 0, got x_steps={x_steps}, l2_ahead={l2_ahead}")
        _staged_body(m, n, k, x, w, scales, zeros, y, ws, counters, adtype, wtype, group,
                     zero_point, s)
        return
    b = _setup(m, n, k, x, w, scales, zeros, adtype, wtype, group, s)
    vm.static_assert(prefetch >= 1, f"prefetch={prefetch} must be at least 1")
    xs = x_steps or prefetch
    vm.static_assert(xs % prefetch == 0, f"x_steps={x_steps} must be a multiple of "
                     f"prefetch={prefetch}")
    lw, lay = b.lw, b.lw.mma
    sliced = _slices(bm, bn, bk, warps_m, warps_n, ks, adtype)
    swapped = _swapped(bn, bk, warps_n, adtype) if swap_ab else None
    group_layout = reduce(lay.b, [0], keepdims=True)  # zero points, next to the codes
    scale_layout = reduce(lay.c, [0], keepdims=True)  # scales, next to the products
    if swapped is not None:
        group_layout = reduce(swapped.weights, [0], keepdims=True)

    if not x_whole:
        # x for `xs` K steps at a time (fewer copies, address computations and barriers
        # per step); the 128-byte swizzle keeps ldmatrix conflict-free (rows under 128
        # bytes stay plain)
        xk = bk * xs
        swizzled = xk * adtype.nbits // 8 >= 128
        sx = vm.shared_tensor(adtype, [bm, xk],
                              swizzle_128b(bm, xk, adtype) if swizzled else None)
    acc = (vm.register_tensor(vm.float32, [bm, bn], lay.c, init=0.0) if swapped is None
           else vm.register_tensor(vm.float32, [bn, 8], swapped.mma.c, init=0.0))
    last = b.k_tile0 + b.k_steps - 1

    # (group tensor, its register layout): the scales, and the zeros with zero points
    groups = [(b.gs, scale_layout)] + ([(b.gz, group_layout)] if zero_point else [])
    if swapped is not None:  # the scales as a column [bn, 1], next to the products of y^T
        groups[0] = (vm.global_view(scales, [n, k // group], [1, n]),
                     reduce(swapped.mma.c, [1], keepdims=True))

    def ask_l2(kt):
        """Prefetch K step kt's weights, scales (and zeros) into the L2 (clamped like
        step_data; the scales through their row-major view, whose rows are contiguous,
        also where ``swapped`` loads them as a column)."""
        kt = minimum(kt, last)
        b.prefetch_weights(kt)
        for t in [b.gs] + ([b.gz] if zero_point else []):
            vm.prefetch_l2(t, [kt * bk // group, b.col0], [1, bn])

    def step_data(kt):
        """Packed weights, scales (and zeros) of K step kt, clamped to this block's range
        (so every load is inside its tensor: ``inbounds``, which the interpreter checks,
        spares the CUDA code a bounds test per load)."""
        kt = minimum(kt, last)
        g = [kt * bk // group, b.col0]
        loads = [b.load_weights(kt)]
        for i, (t, layout) in enumerate(groups):
            if swapped is not None and i == 0:  # scales of y^T: a column
                loads.append(vm.load_global(t, g[::-1], [bn, 1], layout, inbounds=True))
            else:
                loads.append(vm.load_global(t, g, [1, bn], layout, inbounds=True))
        return loads

    # `prefetch` K steps of weights and scales in flight per thread, in round-robin
    # register buffers: step s uses buffer s % prefetch and then reloads it for step
    # s + prefetch (the same buffer, as xs is a multiple of prefetch), so a load has
    # `prefetch` steps of math to hide behind and no register is ever moved
    bufs = [step_data(b.k_tile0 + j) for j in range(prefetch)]
    for j in range(l2_ahead):  # the L2 runs `l2_ahead` steps beyond the registers
        ask_l2(b.k_tile0 + prefetch + j)
    # weights, scales and zeros are not written by the kernel launched just before (the
    # promise of an overlapped launch, ``overlapped_launches``): the loads above
    # may overlap it; x, y and the split-K buffers wait for it
    vm.wait_prior_grid()
    if x_whole:
        _whole_x_loop(b, bufs, step_data, acc, wtype, adtype, zero_point, sliced, prefetch,
                      x_rows or bm, x_whole,
                      (lambda kt: ask_l2(kt + prefetch + l2_ahead)) if l2_ahead else None,
                      swapped)
        store_result(acc, m, n, y, ws, counters, adtype, bm, bn, split, s.fused_split,
                     x_rows, transposed=swapped is not None)
        return
    for it in vm.range(b.k_steps // xs, stages=s.stages):
        kt0 = b.k_tile0 + it * xs
        vm.copy_async(sx, b.gx, [b.row0, kt0 * bk])
        vm.commit_group()
        vm.wait_group(0)
        vm.sync()
        for j in range(xs):
            buf = bufs[j % prefetch]
            packed, scale, *zero = buf
            _multiply_step(sx, lambda c, j=j: [0, j * bk + c], packed, scale,
                           zero[0] if zero_point else None, acc, lw, wtype, adtype,
                           zero_point, sliced)
            for dst, src in zip(buf, step_data(kt0 + j + prefetch)):
                vm.assign(dst, src)
            if l2_ahead:
                ask_l2(kt0 + j + prefetch + l2_ahead)
        vm.sync()
    store_result(acc, m, n, y, ws, counters, adtype, bm, bn, split, s.fused_split)
    vm.free_shared(sx)


def _whole_x_loop(b: _Block, bufs, step_data, acc, wtype: DType, adtype: DType,
                  zero_point: bool, sliced, prefetch: int, rows: int, x_whole: int,
                  ask_l2=None, swapped: _Swapped | None = None) -> None:
    """The main loop of an ``x_whole`` schedule: x's ``rows`` rows for the block's whole K
    range (``x_whole`` columns; past K they read as zeros) are copied into shared memory
    once, then every step reads its slice of x from there, so the loop has no copy and
    no barrier and each warp streams its weights at its own pace.

    One row (``rows`` = 1) is held once and read as every row of the MMA tile (a stride-0
    layout: every ``ldmatrix`` row address is the same); ``bm`` rows are held as one
    swizzled ``[bm, bk]`` slab per K step (conflict-free ``ldmatrix``; the step selects
    its slab by offset, which commutes with the swizzle). ``ask_l2``, when given, is called
    with K step ``kt`` after that step's reload and asks the L2 for the step ``l2_ahead``
    beyond the registers. With ``swapped`` (one row) each step runs with the weights as
    the MMA's A operand (:class:`_Swapped`).
    """
    lw = b.lw
    bm, bk = lw.mma.a.shape[0], lw.mma.b.shape[0]
    col0 = b.k_tile0 * bk
    if rows == 1:
        sx = vm.shared_tensor(adtype, [bm, x_whole], shared_strided([bm, x_whole], [0, 1]))
        vm.copy_async(sx, b.gx, [b.row0, col0], shape=[1, x_whole])

        def x_at(step, c):
            return [0, step * bk + c]
    else:
        slabs = x_whole // bk
        slab = swizzle_128b(bm, bk, adtype) if bk * adtype.nbits // 8 >= 128 else None
        sx = vm.shared_tensor(adtype, [slabs, bm, bk],
                              staged_layout(slab or shared_row_major(bm, bk), slabs,
                                            adtype.nbits))
        for t in range(slabs):
            vm.copy_async(sx, b.gx, [b.row0, col0 + t * bk], shape=[bm, bk],
                          dst_offsets=[t, 0, 0])

        def x_at(step, c):
            return [step, 0, c]
    vm.commit_group()
    vm.wait_group(0)
    vm.sync()
    for it in vm.range(b.k_steps // prefetch):
        for j in range(prefetch):
            buf = bufs[j]
            packed, scale, *zero = buf
            step = it * prefetch + j
            _multiply_step(sx, lambda c, step=step: x_at(step, c), packed, scale,
                           zero[0] if zero_point else None, acc, lw, wtype, adtype,
                           zero_point, sliced, swapped)
            for dst, src in zip(buf, step_data(b.k_tile0 + step + prefetch)):
                vm.assign(dst, src)
            if ask_l2 is not None:
                ask_l2(b.k_tile0 + step)
    vm.free_shared(sx)


def store_result(acc, m, n, y, ws, counters, adtype: DType, bm: int, bn: int,
                 split: int, fused: bool = True, rows: int = 0,
                 transposed: bool = False) -> None:
    """Store block ``(x, ., z)``'s result rows: the first ``rows`` (0: all ``bm``) of the
    ``bm x bn`` tile ``acc`` (f32), as ``adtype``.

    With split-K (``split`` blocks along grid y share a tile) each adds its part into
    the float32 workspace ``ws [m, n]`` and arrives at the tile's counter; the last to
    arrive converts the sum into ``y`` and zeroes its tile of ``ws``, so the reduction
    needs no second kernel and ``ws`` and ``counters`` (int32, one per output tile, 0
    at the start) are left ready for the next launch. Not ``fused``: only the atomic
    adds; :func:`finish_split` then converts and clears ``ws``.

    ``transposed``: ``acc`` is a ``[bn, 8]`` tile of y^T (:func:`_swapped`), stored
    through transposed views of ``y`` and ``ws``; its columns past the block's ``rows``
    fall outside them.
    """
    rows = rows or bm
    row0, col0 = vm.block_index(2) * rows, vm.block_index(0) * bn
    # rows past the block's own (x_rows < bm: copies of its row) fall outside the views
    end = m if rows == bm else minimum(m, row0 + rows)

    def view(ptr):
        """``ptr`` as ``[m, n]`` (or ``[n, m]`` with ``transposed``), cut at ``end``."""
        return (vm.global_view(ptr, [n, end], [1, n]) if transposed
                else vm.global_view(ptr, [end, n], [n, 1]))

    at = [col0, row0] if transposed else [row0, col0]
    gy = view(y)
    if split == 1:
        vm.store_global(gy, vm.cast(acc, adtype), at)
        return
    gws = view(ws)
    vm.atomic_add(gws, acc, at)
    if not fused:
        return
    tiles_n = vm.cdiv(n, bn)
    gc = vm.global_view(counters, [tiles_n * vm.cdiv(m, rows)])
    seen = vm.arrive(gc, [vm.block_index(2) * tiles_n + vm.block_index(0)], split)
    with vm.if_(seen.equals(split - 1)):  # the last part of this tile: finish it
        total = vm.load_global(gws, at, list(acc.shape), acc.layout, coherent=True)
        vm.store_global(gy, vm.cast(total, adtype), at)
        vm.store_global(gws, vm.register_tensor(vm.float32, list(acc.shape), acc.layout,
                                                init=0.0), at)


def _multiply_step(sx, x_at, packed, scale, zero, acc, lw: WeightLayouts, wtype: DType,
                   adtype: DType, zero_point: bool, sliced: BlockMmaLayouts | None,
                   swapped: _Swapped | None = None) -> None:
    """``acc += (x @ q) * scale`` for one K step, whose x column ``c`` (0 <= c < bk) lies
    at offsets ``x_at(c)`` of ``sx`` (``q - zero`` with zero points); with ``sliced`` (the
    MMA layouts of a K slice), one slice of x at a time; with ``swapped``, ``acc^T +=
    (q^T @ x^T) * scale^T`` (:func:`_swapped`)."""
    lay = lw.mma
    order = lay.b if swapped is None else swapped.weights
    wk = vm.cast(vm.view(packed, wtype, lw.values), adtype, layout=order)
    if zero_point:  # (q - zero) is exact in f16/bf16 for codes of <= 8 bits
        wk = wk - zero
    if swapped is not None:
        bk = wk.shape[0]
        mma = swapped.mma
        xt = vm.transpose(vm.load_shared(sx, swapped.x_rows, x_at(0), [8, bk]))
        part = vm.register_tensor(vm.float32, list(acc.shape), mma.c, init=0.0)
        part = vm.dot(vm.transpose(wk), xt, part)
        vm.fma(part, vm.cast(scale, vm.float32), acc, out=acc)
        return
    # the step's group scale multiplies the f32 products (bm x bn per block), not the f16
    # weights (bk x bn): fewer multiplies, and no f16 rounding of w
    bm, bn = acc.shape
    bk = wk.shape[0]
    part = vm.register_tensor(vm.float32, [bm, bn], lay.c, init=0.0)
    if sliced is None:
        part = vm.dot(vm.load_shared(sx, lay.a, x_at(0), [bm, bk]), wk, part)
    else:  # the converted weights sliced by register renaming
        ks = sliced.b.shape[0]
        for kk in range(bk // ks):
            xa = vm.load_shared(sx, sliced.a, x_at(kk * ks), [bm, ks])
            part = vm.dot(xa, vm.extract(wk, [kk * ks, 0], [ks, bn], sliced.b), part)
    vm.fma(part, vm.cast(scale, vm.float32), acc, out=acc)


@dataclass(frozen=True)
class _Swapped:
    """Layouts of a K step computed as ``y^T = q^T @ x^T`` (``swap_ab``; the step of
    :func:`_whole_x_loop` with one row of x).

    At batch 1 an MMA with x as A (16 rows) uses one row of 16; with the weights as A
    (16 of N) and x as B (8 columns) it uses one column of 8, so a step needs half the
    ``mma.sync``, ``ldmatrix`` and scale multiplies. The weights' A fragments hold the
    same codes per thread as their B fragments (rows g and g + 8 of A are the two n-tiles
    of B), so the repacked format and its conversion are unchanged: only the registers'
    order (``weights``, a renaming) differs."""

    mma: BlockMmaLayouts  # A [bn, bk] weights, B [bk, 8] x, C [bn, 8] y^T
    weights: RegisterLayout  # the converted weights as [bk, bn]: mma.a transposed
    x_rows: RegisterLayout  # x as [8, bk] rows (read from shared): mma.b transposed


def _swapped(bn: int, bk: int, warps_n: int, adtype: DType) -> _Swapped:
    mma = block_mma_layouts(bn, 8, bk, warps_n, 1, adtype)
    return _Swapped(mma, permute(mma.a, (1, 0)), permute(mma.b, (1, 0)))


def _slices(bm: int, bn: int, bk: int, warps_m: int, warps_n: int, k_slice: int,
            adtype: DType) -> BlockMmaLayouts | None:
    """The MMA layouts of one ``k_slice``-deep slice of a K step (None: no slicing)."""
    if k_slice == bk:
        return None
    return block_mma_layouts(bm, bn, k_slice, warps_m, warps_n, adtype)


def _staged_body(m, n, k, x, w, scales, zeros, y, ws, counters, adtype: DType,
                 wtype: DType, group: int, zero_point: bool, s: GemmSchedule) -> None:
    """:func:`quant_gemm` with weights, scales (zeros) and x staged in shared memory by
    ``cp.async``, ``stages`` K steps deep (the software-pipelining pass builds the
    prologue and drain); each thread then reads its B fragments with 16-byte loads."""
    bm, bn, bk, warps_m, warps_n = s.bm, s.bn, s.bk, s.warps_m, s.warps_n
    b = _setup(m, n, k, x, w, scales, zeros, adtype, wtype, group, s)
    vm.static_assert(s.prefetch == 1, f"weights_shared stages weights `stages` deep; "
                     f"prefetch={s.prefetch} must be 1")
    vm.static_assert(b.parts == 1, f"weights_shared stages whole format tiles: bn={bn} must "
                     f"be {FORMAT_BN}")
    lw, lay = b.lw, b.lw.mma
    vm.wait_prior_grid()  # every copy below may read what the kernel before wrote
    swizzled = bk * adtype.nbits // 8 >= 128
    sx = vm.shared_tensor(adtype, [bm, bk], swizzle_128b(bm, bk, adtype) if swizzled else None)
    sw = vm.shared_tensor(vm.uint8, [lw.tile_rows, lw.chunk])
    ss = vm.shared_tensor(adtype, [1, bn])
    sz = vm.shared_tensor(adtype, [1, bn]) if zero_point else None
    acc = vm.register_tensor(vm.float32, [bm, bn], lay.c, init=0.0)
    for it in vm.range(b.k_steps, stages=s.stages):
        kt = b.k_tile0 + it
        g = [kt * bk // group, b.col0]
        vm.copy_async(sx, b.gx, [b.row0, kt * bk])
        vm.copy_async(sw, b.gw, [b.weight_row(kt), 0])
        vm.copy_async(ss, b.gs, g)
        if zero_point:
            vm.copy_async(sz, b.gz, g)
        vm.commit_group()
        vm.wait_group(0)
        vm.sync()
        packed = vm.load_shared(sw, lw.packed, [0, 0], [lw.tile_rows, lw.chunk])
        scale = vm.load_shared(ss, reduce(lay.c, [0], keepdims=True), [0, 0], [1, bn])
        zero = (vm.load_shared(sz, reduce(lay.b, [0], keepdims=True), [0, 0], [1, bn])
                if zero_point else None)
        _multiply_step(sx, lambda c: [0, c], packed, scale, zero, acc, lw, wtype, adtype,
                       zero_point, _slices(bm, bn, bk, warps_m, warps_n, s.k_slice or bk, adtype))
        vm.sync()
    store_result(acc, m, n, y, ws, counters, adtype, bm, bn, s.split, s.fused_split)
    for t in (sx, sw, ss, sz):
        if t is not None:
            vm.free_shared(t)


def _finish(total, ws, y, adtype: DType) -> None:
    per = 8
    block = 128 * per
    vm.set_grid(vm.cdiv(total, block))
    lay = vm.spatial(128).local(per)
    start = [vm.block_index(0) * block]
    gws = vm.global_view(ws, [total])
    acc = vm.load_global(gws, start, [block], lay)
    vm.store_global(vm.global_view(y, [total]), vm.cast(acc, adtype), start)
    vm.store_global(gws, vm.register_tensor(vm.float32, [block], lay, init=0.0), start)


@vm.program(warps=4)
def finish_split(total: vm.int32, ws: vm.ptr[vm.float32], y: vm.ptr[vm.dtype_of("adtype")],
                 adtype: vm.constexpr = vm.float16):
    """``y = adtype(ws); ws = 0`` (the unfused split-K epilogue, ``fused_split=False``)."""
    _finish(total, ws, y, adtype)
