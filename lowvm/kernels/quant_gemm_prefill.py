"""The prefill (large M) quantized GEMM: ``y = x @ dequant(W)^T``, weights dequantised once.

Same repacked weights and host arguments as :func:`lowvm.kernels.quant_gemm.quant_gemm`,
a different division of the work. :func:`quant_gemm` dequantises each weight tile in the
registers of the warps that multiply it: with ``warps_m`` warps along M every one of
them loads and converts the same B tile, ``warps_m`` times the conversion work. At
large M that work, not the tensor cores, sets the pace. Here, each K step:

- the block's packed weight tile is loaded **once**, spread over all threads (a thread
  holds a contiguous part of the bytes one thread of the repacked format holds, so its
  ``view`` is still a bit-for-bit reinterpretation: :func:`prefill_layouts`);
- it is dequantised once (``cast`` + zero point + scale) and stored to a shared
  ``float16/bfloat16`` tile ``[bk, bn]`` with K contiguous, 128-byte swizzled, so the
  32-bit stores and the ``ldmatrix`` reads that give every warp its B fragments are
  both free of bank conflicts;
- ``x`` comes through ``cp.async`` into a ``stages``-deep ring (the software-pipelining
  pass), weights are prefetched ``prefetch`` K steps ahead in round-robin register
  buffers, and the shared B tile is double-buffered so the conversion of step ``s + 1``
  overlaps the other warps' MMAs of step ``s`` with one barrier per step.

Because B goes through shared memory, the MMA warp grid is free of the weight format:
``bm x bn`` is the block tile (``bn`` a multiple of the format's 64 columns, covering
``bn / 64`` repacked tiles), ``warps_m x warps_n`` the warps computing it. Larger warp
tiles (64 x 64) read less shared memory per FLOP, which is what bounds mma.sync here.

Shapes: ``k`` a multiple of ``bk * split * prefetch``, ``n`` of ``bn``, ``group`` a
multiple of ``bk`` (or ``k`` itself); ``m`` is anything (rows are masked).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import lowvm.lang as vm
from lowvm.dtypes import DType
from lowvm.expr import minimum
from lowvm.ir import ProgramError
from lowvm.kernels.gemm_schedule import GemmSchedule, gemm_listing
from lowvm.kernels.quant_gemm import store_result
from lowvm.kernels.weight_format import WeightLayouts, weight_layouts
from lowvm.layouts import (
    RegisterLayout,
    SharedLayout,
    local,
    permute,
    reduce,
    spatial,
    split_pairs,
    swizzle_128b,
)
from lowvm.layouts.cast_recipe import pair_span
from lowvm.layouts.mma_tiling import block_mma_layouts

__all__ = ["quant_gemm_prefill", "PrefillLayouts",
           "prefill_layouts", "shared_b_layout", "FORMAT_BN", "FORMAT_WARPS_N",
           "PREFILL_SCHEDULE", "PREFILL_SCHEDULE_SM80", "PREFILL_MIN_BK",
           "prefill_schedule_for"]

#: the repacked format's N tile and warps (``lowvm.kernels.weights.WEIGHT_BN`` etc.)
FORMAT_BN = 64
FORMAT_WARPS_N = 4
_FORMAT_THREADS = FORMAT_WARPS_N * 32

#: the default schedule: 256 x 128 block tile, 4 x 2 warps of 64 x 64 (256 threads, one per
#: format thread of the two weight tiles, so every 1..8-bit type splits evenly), x in two
#: stages. Measured best of five on the H100: 294 TFLOP/s at M = 4096 on 4096 x 28672,
#: against 246 for 128 x 128 on 4 x 2 warps (`python -m lowvm.bench schedules`).
PREFILL_SCHEDULE = GemmSchedule(bm=256, bn=128, bk=128, warps_m=4, warps_n=2, split=1,
                                stages=2, prefetch=1)
#: sm_80's ptxas spills 8 bytes at 255 registers for the 256 x 128 tile; the 128 x 128
#: tile (measured 246 TFLOP/s on the H100) stays spill-free there
PREFILL_SCHEDULE_SM80 = GemmSchedule(bm=128, bn=128, bk=128, warps_m=4, warps_n=2, split=1,
                                     stages=3, prefetch=1)


#: the smallest K tile the kernel takes: the shared x and B tiles are swizzled in rows of
#: 128 bytes, 64 float16/bfloat16 values (weights in groups of 16 or 32 have smaller tiles;
#: ``quant_gemm`` runs those)
PREFILL_MIN_BK = 64


def prefill_schedule_for(arch: str) -> GemmSchedule:
    """The default prefill schedule for ``sm_XY`` (see the two constants)."""
    return PREFILL_SCHEDULE if arch >= "sm_90" else PREFILL_SCHEDULE_SM80


@dataclass(frozen=True)
class PrefillLayouts:
    """How a block's packed weight tile is spread over all its threads, without replicas."""

    format: WeightLayouts  # the repacked format (one 64-column tile, 128 threads)
    tiles: int  # format tiles side by side in the block's bn columns
    packed: RegisterLayout  # uint8 [tiles * format.tile_rows, format.chunk]
    values: RegisterLayout  # wtype [bk, bn]: each thread's values, in MMA B order
    stored: RegisterLayout  # the same values in the order of ``packed``'s bits

    @property
    def tile_rows(self) -> int:
        """Rows of the repacked weight one block tile covers."""
        return self.tiles * self.format.tile_rows


def prefill_layouts(wtype: DType, bn: int, bk: int, threads: int,
                    adtype: DType = vm.float16) -> PrefillLayouts:
    """Layouts that give each of ``threads`` threads a distinct part of the packed tile.

    Thread ``i = (fs, q, t)`` (most significant first) holds part ``q`` of ``Q`` of the
    bytes of format thread ``t`` of format tiles ``fs * Fl .. fs * Fl + Fl - 1``. A part is
    a contiguous byte range of that thread's register stream, so its values are a
    contiguous range of the format's B-fragment registers: the K repeats
    ``q * rep_k / Q ..``. Parts are whole ``chunk``-byte vectors (``Q`` dividing the
    vector count) or equal slices of every vector (the vector count dividing ``Q``).
    """
    if bn % FORMAT_BN:
        raise ProgramError(f"quant_gemm_prefill: bn={bn} must be a multiple of {FORMAT_BN}")
    fmt = weight_layouts(wtype, 16, FORMAT_BN, bk, 1, FORMAT_WARPS_N, adtype)
    tiles = bn // FORMAT_BN
    if threads % _FORMAT_THREADS:
        raise ProgramError(f"quant_gemm_prefill: {threads} threads is not a multiple of "
                           f"{_FORMAT_THREADS}; use warps_m * warps_n divisible by 4")
    if threads >= tiles * _FORMAT_THREADS:
        fs, fl, q = tiles, 1, threads // (tiles * _FORMAT_THREADS)
    else:
        fs, fl, q = threads // _FORMAT_THREADS, None, 1
        if tiles % fs:
            raise ProgramError(f"quant_gemm_prefill: {threads} threads cannot share "
                               f"{tiles} weight tiles of {FORMAT_BN} columns evenly")
        fl = tiles // fs
    v, chunk = fmt.vectors, fmt.chunk
    rep_k = bk // 16
    fits = (v % q == 0) or (q % v == 0 and chunk % (q // v) == 0)
    if not fits or rep_k % q:
        raise ProgramError(
            f"quant_gemm_prefill: {wtype.name} tiles of {bk}x{FORMAT_BN} hold {v} vectors of "
            f"{chunk} bytes per format thread, which {q} threads cannot split evenly; use "
            f"warps_m * warps_n * 32 = {tiles * _FORMAT_THREADS} threads (one per format "
            "thread) or a power-of-two wtype width")
    rows = spatial(_FORMAT_THREADS, 1)
    if q >= v:
        s = q // v
        packed = (spatial(fs, 1) * local(fl, 1) * spatial(v, s) * rows
                  * local(1, chunk // s))
    else:
        packed = (spatial(fs, 1) * local(fl, 1) * spatial(q, 1) * local(v // q, 1) * rows
                  * local(1, chunk))
    part_b = block_mma_layouts(16, FORMAT_BN, bk // q, 1, FORMAT_WARPS_N, adtype).b
    values = spatial(1, fs) * local(1, fl) * spatial(q, 1) * part_b
    # a part is whole runs of the format's stored order (a split_pairs span: one 32-bit
    # word of 1/2/4-bit codes, three of 3-bit ones, ...)
    span = pair_span(wtype, adtype, fmt.mma.b.local_size)
    if span is not None and part_b.local_size % span:
        raise ProgramError(f"quant_gemm_prefill: {q} parts per format thread split its "
                           f"runs of {span} {wtype.name} codes (its stored order); use "
                           "fewer threads")
    stored = values if span is None else split_pairs(values, span)
    return PrefillLayouts(fmt, tiles, packed, values, stored)


def shared_b_layout(buffers: int, bn: int, bk: int, adtype: DType) -> SharedLayout:
    """``[buffers, bn, bk]``: ``buffers`` copies of ``swizzle_128b(bn, bk)``.

    B fragments hold (k, k + 1) pairs of one column, so K-contiguous storage (B^T) makes
    each pair one 32-bit word and each 8 x 8 ``ldmatrix`` row eight consecutive k; the
    swizzle spreads the eight columns a store or ``ldmatrix`` phase touches over all banks.
    """
    base = swizzle_128b(bn, bk, adtype)
    return SharedLayout((buffers, bn, bk), (bn * bk, bk, 1), base.swizzle)


def _check_schedule(adtype: DType, bm: int, bn: int, bk: int, warps_m: int, warps_n: int,
                    prefetch: int, group: int) -> None:
    vm.static_assert(group % bk == 0, f"bk={bk} must divide the group size {group}")
    vm.static_assert(prefetch >= 1, f"prefetch={prefetch} must be at least 1")
    vm.static_assert(bk & (bk - 1) == 0 and bk >= PREFILL_MIN_BK,
                     f"bk={bk} must be a power of two of at least {PREFILL_MIN_BK} (128-byte "
                     "rows); weights in groups of 16 or 32 run on quant_gemm")


@vm.program(listing=gemm_listing("bm", "bn", "bk", "warps_m", "warps_n", "split", "stages",
                                  "prefetch", "fused_split"))
def quant_gemm_prefill(m: vm.int32, n: vm.int32, k: vm.int32,
                       x: vm.ptr[vm.dtype_of("adtype")], w: vm.ptr[vm.uint8],
                       scales: vm.ptr[vm.dtype_of("adtype")],
                       zeros: vm.ptr[vm.dtype_of("adtype")], y: vm.ptr[vm.dtype_of("adtype")],
                       ws: vm.ptr[vm.float32], counters: vm.ptr[vm.int32],
                       adtype: vm.constexpr = vm.float16, wtype: vm.constexpr = vm.int4,
                       group: int = 128, zero_point: bool = False,
                       schedule: GemmSchedule = PREFILL_SCHEDULE_SM80):
    """``y[m, n] = x[m, k] @ dequant(w)^T``, ``x``, ``scales``, ``zeros`` and ``y`` of
    ``adtype`` (float16 or bfloat16; split-K as in ``store_result``), on weights repacked
    by :func:`lowvm.kernels.quant_gemm.repack_weights`. The schedule's ``bm``, ``bn``,
    ``bk``, ``warps_m``, ``warps_n``, ``split``, ``stages``, ``prefetch`` and
    ``fused_split`` apply."""
    s = schedule
    bm, bn, bk, warps_m, warps_n, prefetch = s.bm, s.bn, s.bk, s.warps_m, s.warps_n, s.prefetch
    split, stages = s.split, s.stages
    _check_schedule(adtype, bm, bn, bk, warps_m, warps_n, prefetch, group)
    threads = warps_m * warps_n * 32
    pl = prefill_layouts(wtype, bn, bk, threads, adtype)
    lay = block_mma_layouts(bm, bn, bk, warps_m, warps_n, adtype)
    vm.set_warps(warps_m * warps_n)
    vm.set_grid(vm.cdiv(n, bn), split, vm.cdiv(m, bm))
    col0, row0 = vm.block_index(0) * bn, vm.block_index(2) * bm
    n_tiles = n // FORMAT_BN  # format tiles per K step of the repacked weight
    k_steps = k // bk // split
    k_tile0 = vm.block_index(1) * k_steps
    last = k_tile0 + k_steps - 1

    gx = vm.global_view(x, [m, k])
    gw = vm.global_view(w, [(k // bk) * n_tiles * pl.format.tile_rows, pl.format.chunk])
    gs = vm.global_view(scales, [k // group, n])
    gz = vm.global_view(zeros, [k // group, n])
    group_layout = reduce(pl.values, [0], keepdims=True)

    xk = bk * prefetch  # x for `prefetch` K steps per loop iteration
    sx = vm.shared_tensor(adtype, [bm, xk], swizzle_128b(bm, xk, adtype))
    sb = vm.shared_tensor(adtype, [2, bn, bk], shared_b_layout(2, bn, bk, adtype))
    acc = vm.register_tensor(vm.float32, [bm, bn], lay.c, init=0.0)
    ks = 16  # K slice per dot: keeps the live A/B fragments to one MMA's K
    sl = block_mma_layouts(bm, bn, ks, warps_m, warps_n, adtype)

    def step_data(kt):
        """Packed weights, scales (and zeros) of K step kt, clamped to this block's range."""
        kt = minimum(kt, last)
        row = (kt * n_tiles + vm.block_index(0) * pl.tiles) * pl.format.tile_rows
        g = [kt * bk // group, col0]
        data = [vm.load_global(gw, [row, 0], [pl.tile_rows, pl.format.chunk], pl.packed),
                vm.load_global(gs, g, [1, bn], group_layout)]
        if zero_point:
            data.append(vm.load_global(gz, g, [1, bn], group_layout))
        return data

    def dequant_store(data, buf) -> None:
        """Convert one step's weights once and store them as the shared B tile ``buf``."""
        packed, scale, *zero = data
        wk = vm.cast(vm.view(packed, wtype, pl.stored), adtype, layout=pl.values)
        if zero_point:  # (q - zero) is exact in f16/bf16 for codes of <= 8 bits
            wk = wk - zero[0]
        # stored as B^T [bn, bk] (a relabelling of registers): K runs along the last dim,
        # so each thread's (k, k + 1) pairs become 32-bit stores
        vm.store_shared(sb, vm.transpose(wk * scale), [buf, 0, 0])

    def parity(it, j):
        return j % 2 if prefetch % 2 == 0 else (it * prefetch + j) % 2

    # register buffer j holds the packed weights of the steps s with s % prefetch == j;
    # step s + 1 is converted while step s multiplies, then its buffer is reloaded with
    # step s + 1 + prefetch (round robin: no register moves, `prefetch` steps of cover)
    bufs = [step_data(k_tile0 + j) for j in range(prefetch)]
    dequant_store(bufs[0], 0)
    for dst, src in zip(bufs[0], step_data(k_tile0 + prefetch)):
        vm.assign(dst, src)
    for it in vm.range(k_steps // prefetch, stages=stages):
        kt0 = k_tile0 + it * prefetch
        vm.copy_async(sx, gx, [row0, kt0 * bk])
        vm.commit_group()
        vm.wait_group(0)
        vm.sync()
        for j in range(prefetch):
            if j:
                vm.sync()  # B tile j, stored by other threads during step j - 1
            buf = parity(it, j)
            for kk in range(bk // ks):
                xa = vm.load_shared(sx, sl.a, [0, j * bk + kk * ks], [bm, ks])
                wb = vm.load_shared(sb, permute(sl.b, [1, 0]), [buf, 0, kk * ks], [bn, ks])
                vm.dot(xa, vm.transpose(wb), acc, out=acc)
            nxt = (j + 1) % prefetch
            dequant_store(bufs[nxt], 1 - buf if isinstance(buf, int) else (buf + 1) % 2)
            for dst, src in zip(bufs[nxt], step_data(kt0 + j + 1 + prefetch)):
                vm.assign(dst, src)
        if not stages or stages < 2:
            vm.sync()  # the next copy overwrites x (the pipelined loop needs no such sync)
    store_result(acc, m, n, y, ws, counters, adtype, bm, bn, split, s.fused_split)
    vm.free_shared(sb)
    vm.free_shared(sx)


def threads_fit(wtype: DType, schedule: GemmSchedule) -> bool:
    """True when ``schedule``'s threads can split ``wtype``'s packed tile evenly."""
    s = schedule
    return _threads_fit(wtype, s.bn, s.bk, s.warps_m * s.warps_n * 32)


@functools.lru_cache(maxsize=1024)  # the schedule choice asks for every shape it plans
def _threads_fit(wtype: DType, bn: int, bk: int, threads: int) -> bool:
    try:
        prefill_layouts(wtype, bn, bk, threads)
    except ProgramError:
        return False
    return True
