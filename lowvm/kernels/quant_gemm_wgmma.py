"""The Hopper quantized GEMM: ``y = x @ dequant(W)^T`` as ``y^T = W @ x^T`` on ``wgmma``.

Same repacked weights and host arguments as :func:`lowvm.kernels.quant_gemm.quant_gemm`.
Why it is shaped this way (sm_90a):

- ``wgmma`` reads its B operand from shared memory and takes A from registers. The
  weights are the operand that needs work (dequantisation), so they are A: each
  warpgroup converts its 64-row weight tiles in registers, straight into the A fragments
  (the repacked format's per-thread bytes hold exactly those elements: the conversion's
  output is renamed, not moved), with no shared-memory round trip and no ``ldmatrix``.
- ``x[M, K]`` is B, K-contiguous as it lies in memory: ``cp.async`` copies each 64-column
  panel into a 128-byte-swizzled tile, which the tensor cores read in place
  (``vm.dot_shared``); ``x`` is never loaded into registers.
- A block is ``bn`` weight rows (``warpgroups`` x ``m_tiles`` x 64) by ``bm`` rows of x
  (the wgmma's N, up to 256). The product tile is ``y^T``: it goes through shared memory
  (rows padded by 4 floats, so the transposing stores are free of bank conflicts) and
  leaves as rows of ``y``, each thread storing (or, split along K, adding) 4 consecutive
  columns, so a warp writes whole rows instead of one element of 32 rows.
- ``x`` comes through a ``stages``-deep ``cp.async`` ring (the software-pipelining pass);
  weights and scales are prefetched ``prefetch`` K steps ahead in round-robin registers.
- Each step's multiplies complete before the next step's conversion: a form that
  converted while they ran (``dot_shared(wait=False)`` + ``dot_wait``) measured 7-13 %
  faster at 256-row x tiles but gave wrong sums on the H100. Not the x ring: its
  ``dot_wait`` came before the wait and barrier after which the pipelined loop refills
  the stage the multiplies read. What is left is register-level: the 64-128 accumulator
  registers of an n = 128/256 wgmma between its issue and the wait.

Shapes: ``k`` a multiple of ``bk * split * prefetch``, ``bk`` 64 or 128 (the format's K
tile: ``group`` >= 64), ``n`` of ``bn``; ``m`` is anything (rows are masked).
"""

from __future__ import annotations

import lowvm.lang as vm
from lowvm.dtypes import DType
from lowvm.expr import minimum
from lowvm.kernels.gemm_schedule import GemmSchedule, gemm_listing
from lowvm.kernels.quant_gemm import store_result
from lowvm.kernels.quant_gemm_prefill import FORMAT_BN, prefill_layouts
from lowvm.layouts import (
    SharedLayout,
    local,
    reduce,
    shared_strided,
    spatial,
    swizzle_128b,
    wgmma_layouts,
)

__all__ = ["quant_gemm_wgmma", "WGMMA_SCHEDULE", "PANEL"]

#: columns of x per shared panel: one 128-byte swizzled row of 16-bit elements
PANEL = 64

#: the default schedule: 128 weight rows (2 warpgroups of one 64-row tile) by 256 rows of
#: x, one wgmma.m64n256k16 per warpgroup and 16 of K; x in 3 stages of 64 KB
WGMMA_SCHEDULE = GemmSchedule(bm=256, bn=128, bk=128, warps_m=8, warps_n=1, split=1,
                              stages=3, prefetch=1)


def _check_schedule(adtype: DType, bm: int, bn: int, bk: int, warpgroups: int,
                    prefetch: int, group: int) -> None:
    vm.static_assert(group % bk == 0, f"bk={bk} must divide the group size {group}")
    vm.static_assert(bk in (64, 128), f"bk={bk}: the wgmma GEMM takes K tiles of 64 or 128 "
                     "(128-byte panels of x); use quant_gemm_prefill for smaller groups")
    vm.static_assert(prefetch >= 1, f"prefetch={prefetch} must be at least 1")
    vm.static_assert(bm % 8 == 0 and 8 <= bm <= 256,
                     f"bm={bm} rows of x must be a multiple of 8 in 8..256 (wgmma's N)")
    vm.static_assert(warpgroups >= 1 and bn % (64 * warpgroups) == 0,
                     f"bn={bn} weight rows must be a multiple of 64 x warpgroups "
                     f"({64 * warpgroups})")
    vm.static_assert(adtype.nbits == 16, "x must be float16 or bfloat16")


@vm.program(listing=gemm_listing("bm", "bn", "bk", "warpgroups", "split", "stages",
                                  "prefetch", "fused_split"))
def quant_gemm_wgmma(m: vm.int32, n: vm.int32, k: vm.int32, x: vm.ptr[vm.dtype_of("adtype")],
                     w: vm.ptr[vm.uint8], scales: vm.ptr[vm.dtype_of("adtype")],
                     zeros: vm.ptr[vm.dtype_of("adtype")], y: vm.ptr[vm.dtype_of("adtype")],
                     ws: vm.ptr[vm.float32], counters: vm.ptr[vm.int32],
                     adtype: vm.constexpr = vm.float16, wtype: vm.constexpr = vm.int4,
                     group: int = 128, zero_point: bool = False,
                     schedule: GemmSchedule = WGMMA_SCHEDULE):
    """``y[m, n] = x[m, k] @ dequant(w)^T`` on wgmma (sm_90a), ``x``, ``scales``, ``zeros``
    and ``y`` of ``adtype`` (float16 or bfloat16), split-K as in ``store_result``, on
    weights repacked by :func:`lowvm.kernels.quant_gemm.repack_weights`. The schedule's
    ``bm``, ``bn``, ``bk``, ``warps_m`` (4 x warpgroups), ``split``, ``stages``,
    ``prefetch`` and ``fused_split`` apply."""
    s = schedule
    bm, bn, bk, warpgroups, prefetch = s.bm, s.bn, s.bk, s.warpgroups, s.prefetch
    split, stages = s.split, s.stages
    _check_schedule(adtype, bm, bn, bk, warpgroups, prefetch, group)
    pl = prefill_layouts(wtype, bn, bk, warpgroups * 128, adtype)
    panels = bk // PANEL
    lay = wgmma_layouts(bn, bm, PANEL, warpgroups, adtype)
    vm.set_warps(4 * warpgroups)
    vm.set_grid(vm.cdiv(n, bn), split, vm.cdiv(m, bm))
    col0, row0 = vm.block_index(0) * bn, vm.block_index(2) * bm
    n_tiles = n // FORMAT_BN
    k_steps = k // bk // split
    k_tile0 = vm.block_index(1) * k_steps
    last = k_tile0 + k_steps - 1

    # x as [K / 64 panels, m, 64]: a panel of bm rows is one canonical wgmma operand
    gx = vm.global_view(x, [k // PANEL, m, PANEL], [PANEL, k, 1])
    gw = vm.global_view(w, [(k // bk) * n_tiles * pl.format.tile_rows, pl.format.chunk])
    gs = vm.global_view(scales, [k // group, n])
    gz = vm.global_view(zeros, [k // group, n])
    group_layout = reduce(pl.values, [0], keepdims=True)

    xp = panels * prefetch  # panels of x per loop iteration
    swizzle = swizzle_128b(bm, PANEL, adtype).swizzle
    sx = vm.shared_tensor(adtype, [xp, bm, PANEL],
                          SharedLayout((xp, bm, PANEL), (bm * PANEL, PANEL, 1), swizzle))
    acc = vm.register_tensor(vm.float32, [bn, bm], lay.c, init=0.0)

    def step_data(kt):
        """Packed weights, scales (and zeros) of K step kt, clamped to this block's range."""
        kt = minimum(kt, last)
        row = (kt * n_tiles + vm.block_index(0) * pl.tiles) * pl.format.tile_rows
        g = [kt * bk // group, col0]
        data = [vm.load_global(gw, [row, 0], [pl.tile_rows, pl.format.chunk], pl.packed,
                               inbounds=True),
                vm.load_global(gs, g, [1, bn], group_layout)]
        if zero_point:
            data.append(vm.load_global(gz, g, [1, bn], group_layout))
        return data

    def operand(data):
        """One step's weights, dequantised, as W [bn, bk] (renamed, not moved)."""
        packed, scale, *zero = data
        wk = vm.cast(vm.view(packed, wtype, pl.stored), adtype, layout=pl.values)
        if zero_point:  # (q - zero) is exact in f16/bf16 for codes of <= 8 bits
            wk = wk - zero[0]
        return vm.transpose(wk * scale)

    # register buffer j holds the packed weights of the steps s with s % prefetch == j
    bufs = [step_data(k_tile0 + j) for j in range(prefetch)]
    for it in vm.range(k_steps // prefetch, stages=stages):
        kt0 = k_tile0 + it * prefetch
        vm.copy_async(sx, gx, [kt0 * panels, row0, 0])
        vm.commit_group()
        vm.wait_group(0)
        vm.sync()
        for j in range(prefetch):
            wt = operand(bufs[j])
            for dst, src in zip(bufs[j], step_data(kt0 + j + prefetch)):
                vm.assign(dst, src)
            for p in range(panels):
                a = vm.extract(wt, [0, p * PANEL], [bn, PANEL], lay.a)
                vm.dot_shared(a, sx, acc, offsets=[j * panels + p, 0, 0], shape=[bm, PANEL],
                              out=acc)
        if not stages or stages < 2:
            vm.sync()  # the next copy overwrites x (the pipelined loop needs no such sync)
    vm.free_shared(sx)
    store_result(_rows_of_y(acc, bm, bn, warpgroups), m, n, y, ws, counters, adtype, bm, bn,
                 split, s.fused_split)


def _rows_of_y(acc, bm: int, bn: int, warpgroups: int):
    """The ``y^T`` tile ``acc`` as ``y [bm, bn]`` in a row layout: 4 consecutive columns
    per thread, a warp's 32 threads along one row (through shared memory)."""
    threads = 128 * warpgroups
    across = min(bn // 4, 32)
    rows_per_pass = threads // across
    vm.static_assert(bm % rows_per_pass == 0, f"bm={bm} must be a multiple of "
                     f"{rows_per_pass} (rows of y the {threads} threads store at once)")
    sy = vm.shared_tensor(vm.float32, [bm, bn], shared_strided([bm, bn], [bn + 4, 1]))
    vm.store_shared(sy, vm.transpose(acc), [0, 0])
    vm.sync()
    layout = (local(bm // rows_per_pass, bn // (4 * across)) * spatial(rows_per_pass, across)
              * local(1, 4))
    out = vm.load_shared(sy, layout, [0, 0], [bm, bn])
    vm.free_shared(sy)
    return out
