"""Which kernel and schedule a quantized GEMM of batch ``M`` runs with, without tuning.

:func:`choose_schedule` (``quant_gemm``: decode tiles up to M = 16, else 64/128-row
tiles), :func:`choose_prefill_schedule` with :func:`prefill_split` (``quant_gemm_prefill``
for large M) and :func:`choose_wgmma_schedule` with :func:`runs_wgmma` (sm_90's wgmma
kernel) pick a :class:`~lowvm.kernels.gemm_schedule.GemmSchedule` from the problem's
shape; :func:`plan_refusal` and :func:`wgmma_refusal` say why a given schedule cannot run
on a weight. Every hand-tuned threshold is a field of :data:`THRESHOLDS`, with what was
measured on the H100 to set it (re-measured by ``python -m lowvm.bench schedules``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lowvm.dtypes import DType
from lowvm.dtypes import dtype as as_dtype
from lowvm.errors import LowvmError
from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.kernels.weights import WEIGHT_BN, WEIGHT_WARPS_N

__all__ = ["ScheduleThresholds", "THRESHOLDS", "NUM_SMS_DEFAULT", "PREFILL_KERNEL",
           "X_WHOLE_BYTES", "choose_schedule", "choose_prefill_schedule", "prefill_split",
           "choose_wgmma_schedule", "runs_wgmma", "plan_refusal", "wgmma_refusal"]


@dataclass(frozen=True)
class ScheduleThresholds:
    """The hand-tuned thresholds of the built-in schedule choice, each fitted to H100
    sweeps of the Llama shapes (``python -m lowvm.bench schedules`` re-measures them).

    The current evidence for the decode choices at M = 4, 8 and 16 (int4; each chosen
    schedule against its 16 nearest neighbours in the library space, in CUDA graphs, with
    split-K sums added by vector reductions) is
    ``benchmarks/results/2026-11-27/schedules/nvidia-h100-80gb-hbm3.json``. It moved two
    rules: streamed x is pipelined two stages deep where it was copied and waited for
    every iteration (8192 x 10240 M = 16: 27.8 -> 27.1 us; 4096 x 28672 M = 4: 28.8 ->
    27.5), and 2 <= M <= 8 no longer hold 16 rows of x whole (4096 x 6144 M = 8: 10.6 ->
    9.7 us, streamed). The prefill
    thresholds' figures are re-measured by ``python -m lowvm.bench gemm-prefill``
    (``benchmarks/results/2026-11-27/gemm-prefill/``)."""

    #: SMs the schedules are sized for (the H100 SXM's 132)
    num_sms: int = 132
    #: which kernel ``quant_linear`` runs for large M (``prefill_split``) without a
    #: schedule: "quant_gemm_prefill" (measured 1.4-1.6x faster there on the H100) or
    #: "quant_gemm" (`python -m lowvm.bench schedules`)
    prefill_kernel: str = "quant_gemm_prefill"
    #: ... when its 256 x 128 tiles give at least this many blocks: with fewer (M = 256 on
    #: N = 4096, 6144 or 8192) it measured slower than quant_gemm's smaller tiles (e.g.
    #: 14336 x 4096, M = 256: 404 vs 191 us), with 80 (8192 x 10240) faster (237 vs 283)
    #: (`python -m lowvm.bench schedules`)
    prefill_min_blocks: int = 80
    #: ... and only from this M: at M = 128 quant_gemm's 128-row tiles measured faster on
    #: all five Llama shapes (4096 x 28672: 158.1 vs 201.2 us, 8192 x 10240: 131.2 vs
    #: 195.2) (`python -m lowvm.bench schedules`)
    prefill_min_m: int = 129
    #: below ``prefill_min_blocks`` blocks the prefill kernel splits K (2 or 4 ways, each
    #: block keeping at least this many K steps) to reach them: M = 256 on 14336 x 4096
    #: measured 133.2 us at split 4 against quant_gemm's 154.1, 28672 x 8192 396.1 at
    #: split 2 against 533.4; 4096 x 6144 (split 2 would leave 16 steps) keeps quant_gemm,
    #: 79.9 vs 89.8 (`python -m lowvm.bench schedules`)
    prefill_split_min_steps: int = 24
    #: on sm_90 (H100/H200) ``quant_linear`` runs the wgmma kernel from this M (where the
    #: weight's K tile is 64 or 128): it beat quant_gemm and quant_gemm_prefill at
    #: M = 64..4096 on the Llama shapes (e.g. 4096 x 28672: 46.8 vs 61.6 us at M = 64,
    #: 127.6 vs 198.2 at M = 256, 1867 vs 2650 at M = 4096)
    #: (`python -m lowvm.bench schedules`)
    wgmma_min_m: int = 17
    #: ... except at 32 < M <= 64 on weights of fewer elements than this, where
    #: quant_gemm's one-warp 64-row body measured faster (M = 64: 4096 x 6144 24.3 vs 30.0
    #: us, 14336 x 4096 38.4 vs 45.1, 8192 x 10240 51.3 vs 55.5; wgmma won on 4096 x 28672,
    #: 49.1 vs 61.1, and 28672 x 8192, 91.9 vs 108.9; at M = 32 it won on all five)
    #: (`python -m lowvm.bench schedules`)
    wgmma_mid_m_min_weights: int = 100_000_000
    #: ... but narrow wgmma tiles (see ``wgmma_narrow_max_k``) won there up to this K
    #: (M = 64: 4096 x 6144 22.2 vs 24.9 us, 8192 x 10240 47.6 vs 52.4, 4096 x 4096 20.5
    #: vs 27.0; at K = 14336, 60.4 vs 39.0) (`python -m lowvm.bench schedules`)
    wgmma_mid_m_narrow_max_k: int = 8192
    #: where 128-row weight tiles leave the H100 under one wave at M > 32, 64-row ones
    #: (one warpgroup) by 64 rows of x, unsplit, measured faster up to this K: M = 256
    #: 14336 x 4096 75.7 vs 82.3 us, 8192 x 10240 107.1 vs 118.1; at K = 28672
    #: (28672 x 8192) 296 vs 225 (`python -m lowvm.bench schedules`)
    wgmma_narrow_max_k: int = 16384
    #: below ``wgmma_min_m``, from this M, on weights with K and N both >=
    #: ``wgmma_decode_min_dim``: 16-row x tiles on 64 weight rows (one warpgroup), K split
    #: 4, 2 stages, prefetch 2. M = 16 in CUDA graphs: 8192 x 10240 30.9 vs 36.0 us,
    #: 28672 x 8192 61.5 vs 64.4; it lost on 14336 x 4096 (25.6 vs 20.9), 4096 x 28672
    #: (37.3 vs 28.7) and the 4096-deep projections, and at M = 1 (8-row tiles) everywhere
    #: (x copied every step). At M = 9 (events / graphs): 8192 x 10240 37.1 -> 28.5 /
    #: 29.2 -> 28.6, 28672 x 8192 61.6 -> 59.7 / 57.1 -> 59.8 (slower in graphs)
    #: (`python -m lowvm.bench schedules`)
    wgmma_decode_min_m: int = 9
    #: see ``wgmma_decode_min_m``
    wgmma_decode_min_dim: int = 8192
    #: ... and K of at least this: on 8192 x 10240 quant_gemm with two K steps of weights
    #: in flight (26.9 us at prefetch 1, M = 16, in graphs) beat the wgmma decode tiles'
    #: 30.9 once its prefetch no longer ran 4 deep (`python -m lowvm.bench schedules`)
    wgmma_decode_min_k: int = 16384
    #: the wgmma kernel's grid should have at least this many blocks: smaller x tiles
    #: first (256 -> 128 rows), then K split 2, 4 or 8 ways
    wgmma_min_blocks: int = 80
    #: bytes of shared memory an ``x_whole`` decode schedule may hold x in (per block)
    x_whole_bytes: int = 32 * 1024


#: the thresholds the built-in choice uses
THRESHOLDS = ScheduleThresholds()
#: SMs the built-in schedules are sized for
NUM_SMS_DEFAULT = THRESHOLDS.num_sms
#: the kernel ``quant_linear`` runs for large M without a schedule
PREFILL_KERNEL = THRESHOLDS.prefill_kernel
#: bytes of shared memory an ``x_whole`` decode schedule may hold x in (per block)
X_WHOLE_BYTES = THRESHOLDS.x_whole_bytes
#: blocks of an int4 ``x_whole`` decode GEMM that fit one SM, by prefetch depth (ptxas,
#: sm_90: 64, 72 and 96 registers for 128 threads)
_X_WHOLE_BLOCKS_PER_SM = {1: 8, 2: 7, 4: 5}


def _prefetch_depth(steps: int, allowed: Callable[[int], bool] = lambda depth: True
                    ) -> int:
    """K steps of weights in flight for a block of ``steps`` K steps: the deepest of 4, 2,
    1 that divides ``steps``, leaves >= 8 steps per prefetched one and is ``allowed``."""
    for depth in (4, 2):
        if steps % depth == 0 and steps >= 8 * depth and allowed(depth):
            return depth
    return 1


def _x_whole_prefetch(steps: int, blocks: int, num_sms: int) -> int:
    """:func:`_prefetch_depth` of an ``x_whole`` block of ``steps`` K steps in a grid of
    ``blocks``, also keeping the grid in one wave. Fitted to H100 graph sweeps, where a
    second wave cost 28672 x 8192 48 -> 67 us and deep prefetch on 4-step blocks
    8.1 -> 9.1 us (4096 x 4096) (`python -m lowvm.bench schedules`)."""
    return _prefetch_depth(
        steps, lambda depth: blocks <= num_sms * _X_WHOLE_BLOCKS_PER_SM[depth])


def choose_schedule(m: int, n: int, k: int, bk: int, num_sms: int = NUM_SMS_DEFAULT,
                    x_whole: bool = True) -> GemmSchedule:
    """A schedule for batch ``m``: decode tiles with split-K to fill the GPU, or prefill.

    Decode at M = 1, and at 8 < M <= 16, holds x for the block's whole K range in shared
    memory when it fits ``X_WHOLE_BYTES`` (``x_whole``; one row at M = 1, ``x_rows=1``;
    2 <= M <= 8 stream x, which measured faster there): the main loop then
    has no x copy and no barrier (sm_90 SASS of the loop: 222 -> 136 instructions per warp
    and K step on split-8 shapes, 169 -> 131 on 4096 x 28672), with the weight prefetch
    depth of :func:`_x_whole_prefetch`. In CUDA graphs on the H100 at M = 1 this measured
    0 to 23 % faster than streaming x (8192 x 10240: 27.5 -> 21.2 us). ``x_whole=False``
    gives the schedules that stream x through shared memory every step or every
    ``prefetch`` steps (for K ranges that do not fit, and from M = 2 pipelined two stages
    deep where the split is under 8). At M = 1
    the step runs with the weights as the MMA's A operand (``swap_ab``): half the MMAs;
    in graphs int4 26.1 -> 24.2 us on 4096 x 28672, 15.8 -> 14.8 on 14336 x 4096, int3
    27.4 -> 21.6 and 15.5 -> 13.2 (the split and prefetch rules stayed best for it). At
    8 < M <= 16, where 16 rows would be held at split 8, x is streamed at split 4 with two
    steps of weights in flight instead, where that still gives a block per SM.

    Decode (M <= 16): split-K (its reduction fused into the GEMM) doubles while the grid
    has under ~4 blocks per SM, or while each block would still stream >= 24 K steps,
    keeping >= 4 steps per block and split <= 8 (16 at M = 1 with ``x_whole``); grids of
    >= 3 blocks per SM are not split. M > 16 splits only up to ~2 blocks per SM (more
    measured slower at M = 64), and finishes the sums with a second kernel (the in-kernel
    reduction measured slower there: 4096 x 6144, M = 64: 41.4 vs 33.3 us).
    Split-8 decode grids with 8..23 K steps per block prefetch two steps of weights with
    x double-buffered (14336 x 4096: 22.3 vs 24.7 us); other split-8 grids pipeline x three
    deep, one step of weights ahead.
    Fitted to H100 decode sweeps (fused split-K): e.g. 4096 x 6144 split 8 13.6 us,
    8192 x 10240 split 4 28.2, 28672 x 8192 split 8 60.9, 4096 x 28672 unsplit 35.4;
    inside a CUDA graph of back-to-back calls no other schedule of the space measured more
    than 0.6 us faster on the Llama-3-8B decode shapes (`python -m lowvm.bench schedules`).
    """
    if m <= 16:
        bm, warps_m = 16, 1
    elif m <= 64:
        bm, warps_m = 64, 2
    else:
        bm, warps_m = 128, 4
    blocks = (n // WEIGHT_BN) * math.ceil(m / bm)
    steps = k // bk
    split = 1
    if m > 16:  # tiles reuse weights across rows: split only to reach ~2 blocks per SM
        while (blocks * split < 2 * num_sms and steps % (2 * split) == 0
               and steps // (2 * split) >= 4):
            split *= 2
    elif blocks < 3 * num_sms:
        while (split < 8 and steps % (2 * split) == 0 and steps // (2 * split) >= 4
               and (blocks * split < 4 * num_sms or steps // (2 * split) >= 24)):
            split *= 2
    if (m == 1 and x_whole and split == 8 and blocks * split < 4 * num_sms
            and steps % 16 == 0 and steps // 16 >= 4):
        # with x held whole a K range is cheap to start, so a grid still under 4 blocks
        # per SM at split 8 splits once more: 14336 x 4096 in a graph 16.6 -> 15.1 us
        # (`python -m lowvm.bench schedules`)
        split = 16
    if (8 < m <= 16 and x_whole and split == 8 and steps % 8 == 0
            and bm * (k // split) * 2 <= X_WHOLE_BYTES and blocks * 4 >= num_sms):
        # where 16 rows would be held whole at split 8, streaming x at split 4 with two
        # steps of weights in flight measured faster: M = 16 in graphs 4096 x 6144 15.6 ->
        # 11.9 us, 4096 x 4096 12.1 -> 10.1 (events 19.1 -> 16.2, 15.6 -> 14.6); at M = 8
        # it was mixed (12.0 -> 10.9, 9.6 -> 9.9), so M <= 8 keeps x whole
        # (`python -m lowvm.bench schedules`)
        return GemmSchedule(bm=bm, bn=WEIGHT_BN, bk=bk, warps_m=warps_m,
                            warps_n=WEIGHT_WARPS_N, split=4, stages=None, prefetch=2)
    kb, rows = k // split, 1 if m == 1 else bm  # a block's K range, the rows of x it holds
    if m <= 16 and x_whole and rows * kb * 2 <= X_WHOLE_BYTES:
        # from M = 2 up to M = 8 the 16 rows held whole (those past M zero-filled) cost each
        # block their copy before its first MMA: x streamed per step measured faster at
        # M = 4 and 8, 4096 x 6144 in graphs 9.7 -> 9.3 and 10.6 -> 9.7 us (`python -m
        # lowvm.bench schedules`)
        held = m == 1 or m > 8
        return GemmSchedule(bm=bm, bn=WEIGHT_BN, bk=bk, warps_m=warps_m,
                            warps_n=WEIGHT_WARPS_N, split=split, stages=None,
                            prefetch=_x_whole_prefetch(steps // split, blocks * split,
                                                       num_sms),
                            x_whole=kb if held else 0, x_rows=1 if rows == 1 else 0,
                            swap_ab=rows == 1)
    if m <= 16 and split < 8:
        # weights prefetched up to 4 steps ahead, keeping >= 8 K steps per prefetched one:
        # 8192 x 10240 (16 steps per block at split 4) measured 27.6 us at prefetch 4 and
        # 22.4 at prefetch 2 (M = 4), 34.0 against 26.9 at prefetch 1 (M = 16), in graphs;
        # x (prefetch steps per copy) pipelined 2 deep from M = 2 instead of copied and
        # waited for: 8192 x 10240 M = 4 / 16 22.0 -> 21.5 / 27.8 -> 27.1 us, 4096 x 28672
        # (unsplit, prefetch 4) 28.8 -> 27.5 / 29.0 -> 28.5 (`python -m lowvm.bench
        # schedules`)
        return GemmSchedule(bm=bm, bn=WEIGHT_BN, bk=bk, warps_m=warps_m,
                            warps_n=WEIGHT_WARPS_N, split=split, stages=2 if m > 1 else None,
                            prefetch=_prefetch_depth(steps // split))
    if m <= 16 and 8 <= steps // split < 24 and (steps // split) % 2 == 0:
        # split-8 grids with 8..23 K steps per block: two steps of weights in flight and x
        # double-buffered (ptxas gives int4 96 registers, so 5 blocks fit per SM); measured
        # 22.5-22.7 vs 24.7 us (14336 x 4096, M = 1) (`python -m lowvm.bench schedules`)
        return GemmSchedule(bm=bm, bn=WEIGHT_BN, bk=bk, warps_m=warps_m,
                            warps_n=WEIGHT_WARPS_N, split=split, stages=2, prefetch=2)
    if 16 < m <= 64:
        # one M-warp covers the 64 rows, the K step's MMAs over k_slice-deep slices, so
        # each weight is converted once, not once per M-warp: measured 7-17 % faster than
        # two M-warps on the five Llama shapes (4096 x 6144: 29.2 -> 26.0 us; slices of 16
        # won by 2-5 % where K >= 14336). With related shared addresses slices of 16 also
        # won on the unsplit 4096 x 28672 grid, 66.7 -> 62.0 us, and lost 3 % on the split
        # ones with K < 14336. Two x stages beat three by 1-3 % on all five shapes in two
        # runs (4096 x 28672: 63.1 -> 61.7 us); register caps and 32-wide blocks did not
        # help (`python -m lowvm.bench schedules`)
        # (a slice is at most the K step: weights in groups of 16 have 16-deep steps)
        warps_m, k_slice = 1, min(bk, 16 if k >= 14336 or split == 1 else 32)
    else:
        k_slice = 0
    # the other split-8 decode grids (and M > 16) pipeline x 3 deep instead, one step of
    # weights ahead: measured 13.6 vs 18.4 us (4096 x 6144) and 60.9 vs 71.0 (28672 x 8192)
    # at split 8 against two steps of weights (4 stages); with related shared addresses
    # 4 stages lost 19-36 % on 28672 x 8192 at M = 4 / 16 and 3 stages won: 91.8 -> 67.6
    # us at M = 16 (`python -m lowvm.bench schedules`)
    return GemmSchedule(bm=bm, bn=WEIGHT_BN, bk=bk, warps_m=warps_m, warps_n=WEIGHT_WARPS_N,
                        split=split, stages=2 if k_slice else 3, prefetch=1,
                        fused_split=m <= 16, k_slice=k_slice)


def plan_refusal(s: GemmSchedule, k: int, bk: int) -> str | None:
    """Why :func:`quant_linear` refuses ``s`` for K = ``k`` and a weight of format K tile
    ``bk`` (naming the values and what is accepted), or None: the one place both the
    planner and the tuner's space (``lowvm.tune.space.runnable_reason``) ask."""
    if s.wgmma:
        return ("is a wgmma schedule (quant_gemm_wgmma): quant_linear runs it on sm_90, "
                "or wgmma_quant_linear")
    if not _reads_format(s, bk):
        return (f"does not match the weight's format (bk={bk}; bn={WEIGHT_BN} with "
                f"warps_n={WEIGHT_WARPS_N}, or bn = 16 x warps_n = 16 or 32 without "
                f"weights_shared)")
    if (k // s.bk) % (s.split * s.steps_per_copy):
        return (f"K / bk = {k // s.bk} steps must be a multiple of split x steps per copy "
                f"= {s.split * s.steps_per_copy}")
    if s.x_whole and s.x_whole < k // s.split:
        return (f"x_whole = {s.x_whole} columns cannot hold a block's K range, K / split "
                f"= {k // s.split}; accepted: x_whole >= {k // s.split}, or 0")
    if s.swap_ab and not (s.x_rows == 1 and s.warps_m == 1 and not s.k_slice):
        return (f"swap_ab computes y^T one row of x at a time: it needs x_rows=1, warps_m=1 "
                f"and k_slice=0, got x_rows={s.x_rows}, warps_m={s.warps_m}, "
                f"k_slice={s.k_slice}")
    return None


def _reads_format(s: GemmSchedule, bk: int) -> bool:
    """Whether :func:`quant_gemm` with ``s`` reads the repacked format of K tile ``bk``: the
    format's whole tile, or (register body) the rows of 1 or 2 of its warps."""
    if s.bk != bk:
        return False
    if s.bn == WEIGHT_BN and s.warps_n == WEIGHT_WARPS_N:
        return True
    return s.bn in (16, 32) and s.warps_n * 16 == s.bn and not s.weights_shared


def prefill_split(m: int, n: int, k: int, bk: int) -> int:
    """The K split ``quant_linear`` runs :func:`quant_gemm_prefill` with at batch ``m``
    (see ``ScheduleThresholds.prefill_min_m``, ``prefill_min_blocks``,
    ``prefill_split_min_steps``), or 0 where ``quant_gemm`` measured faster or the
    prefill kernel cannot take the weight's K tile (``bk`` < ``PREFILL_MIN_BK``: groups of
    16 or 32; ``quant_gemm`` runs those at every M)."""
    from lowvm.kernels.quant_gemm_prefill import PREFILL_MIN_BK

    t = THRESHOLDS
    if m < t.prefill_min_m or bk < PREFILL_MIN_BK:
        return 0
    blocks, steps = math.ceil(m / 256) * (n // 128), k // bk
    for split in (1, 2, 4):
        if blocks * split >= t.prefill_min_blocks:
            ok = steps % split == 0 and steps // split >= t.prefill_split_min_steps
            return split if split == 1 or ok else 0
    return 0


def choose_prefill_schedule(m: int, n: int, k: int, bk: int, wtype: DType | str,
                            arch: str = "sm_90") -> GemmSchedule:
    """A :func:`quant_gemm_prefill` schedule: the architecture's default
    (``prefill_schedule_for``: 256 x 128 tiles on 4 x 2 warps from sm_90), or 128 x 64 on
    2 x 2 warps when N is not a multiple of 128 (both split every type's bytes); the
    256 x 128 tiles split K where :func:`prefill_split` says so. A weight whose K tile is
    under ``PREFILL_MIN_BK`` (groups of 16 or 32) has no prefill schedule: a
    :class:`~lowvm.errors.LowvmError` says so and names ``quant_gemm``, which runs it."""
    from lowvm.kernels.quant_gemm_prefill import (
        PREFILL_MIN_BK,
        prefill_schedule_for,
        threads_fit,
    )

    if bk < PREFILL_MIN_BK:
        raise LowvmError(
            f"quant_gemm_prefill: the weight's K tile bk={bk} (its group size) is under the "
            f"{PREFILL_MIN_BK} the prefill kernel reads per step (128-byte rows of 16-bit "
            f"values); accepted: weights of group_size >= {PREFILL_MIN_BK} or per-channel "
            "(-1). quant_linear runs smaller groups through quant_gemm")
    s = prefill_schedule_for(arch)
    if n % s.bn or not threads_fit(as_dtype(wtype), s):
        s = GemmSchedule(bm=128, bn=WEIGHT_BN, bk=bk, warps_m=2, warps_n=2, split=1,
                         stages=s.stages, prefetch=1)
    split = max(1, prefill_split(m, n, k, bk)) if s.bm == 256 else 1
    return GemmSchedule(s.bm, s.bn, bk, s.warps_m, s.warps_n, split, s.stages, s.prefetch)


@functools.lru_cache(maxsize=4096)  # asked on every quant_linear call from wgmma_min_m
def choose_wgmma_schedule(m: int, n: int, k: int, bk: int, wtype: DType | str
                          ) -> GemmSchedule | None:
    """A :func:`~lowvm.kernels.quant_gemm_wgmma.quant_gemm_wgmma` schedule (``warps_m`` =
    4 x warpgroups, ``warps_n`` = 1), or None where the kernel does not apply (K tiles
    other than 64 or 128, a type whose tile the threads cannot split).

    128 weight rows on two warpgroups (64 on one where N is not a multiple of 128) by
    ``bm`` rows of x: 32 up to M = 32, 64 up to 64, 128 up to 128, else 256 unless that
    leaves fewer than ``wgmma_min_blocks`` blocks (then 128). K is split 2, 4 or 8 ways:
    tiles of 128 or 256 rows while the grid is under ``wgmma_min_blocks`` blocks, tiles of
    32 or 64 rows (whose split-K sums are cheap) as far as two blocks per SM, each block
    keeping >= 16 K steps. Tiles of 256 rows prefetch one K step of weights (x: 3 stages
    of 64 KB), smaller ones two.

    Below ``wgmma_min_m`` (decode sizes; ``quant_linear`` runs it where :func:`runs_wgmma`
    says so, ``wgmma_quant_linear`` and the tuner at any such M): 16 rows of x by 64
    weight rows on one warpgroup, K split 4 ways, prefetch 2 (less where K's steps do not
    divide).

    Narrow tiles (:func:`_narrow_wgmma`) instead where 128-row weight tiles would leave
    the GPU under one wave at M > 32 and K <= ``wgmma_narrow_max_k``: 64 weight rows on one
    warpgroup by 64 rows of x, 2 x stages, no split (twice the blocks with half the
    weights each, and no split-K sums).

    Fitted to H100 sweeps: e.g. M = 256 on 4096 x 6144 (24 blocks of 256 rows) 36.5 us
    with 128 rows against 63.6, 34.1 with narrow tiles; 4096 x 4096 44.7 -> 25.2 narrow
    (the tuner's find); M = 64 on 28672 x 8192 90.9 us at split 4 against 117.0 at split 2
    (`python -m lowvm.bench schedules`).
    """
    from lowvm.kernels.quant_gemm_prefill import threads_fit
    from lowvm.kernels.quant_gemm_wgmma import WGMMA_SCHEDULE

    t = THRESHOLDS
    if bk not in (64, 128):
        return None
    base = WGMMA_SCHEDULE
    steps = k // bk
    if m < t.wgmma_min_m:  # decode sizes (runs_wgmma: large K and N only)
        split, prefetch = 4, 2
        while split > 1 and steps % (split * prefetch):
            split //= 2
        if steps % (split * prefetch):
            prefetch = 1
        s = GemmSchedule(16, WEIGHT_BN, bk, 4, 1, split, 2, prefetch, wgmma=True)
        return s if threads_fit(as_dtype(wtype), s) else None
    if _narrow_wgmma(m, n, k):
        s = GemmSchedule(64, WEIGHT_BN, bk, 4, 1, 1, 2, 2 if steps % 2 == 0 else 1,
                         wgmma=True)
        return s if threads_fit(as_dtype(wtype), s) else None
    bn, warps = (base.bn, base.warps_m) if n % base.bn == 0 else (WEIGHT_BN, 4)
    bm = _wgmma_rows(m)
    if bm == 256 and math.ceil(m / 256) * (n // bn) < t.wgmma_min_blocks:
        bm = 128
    blocks = math.ceil(m / bm) * (n // bn)
    if bm <= 64:
        def more(split: int) -> bool:
            return blocks * 2 * split <= 2 * t.num_sms and steps // (2 * split) >= 16
    else:
        def more(split: int) -> bool:
            return blocks * split < t.wgmma_min_blocks and steps // (2 * split) >= 8
    split = 1
    while split < 8 and steps % (2 * split) == 0 and more(split):
        split *= 2
    prefetch = 1 if bm == 256 else 2
    while (steps // split) % prefetch:
        prefetch //= 2
    s = GemmSchedule(bm, bn, bk, warps, 1, split, base.stages, prefetch, wgmma=True)
    return s if threads_fit(as_dtype(wtype), s) else None


def _narrow_wgmma(m: int, n: int, k: int) -> bool:
    """Whether :func:`choose_wgmma_schedule` takes narrow tiles (see there): 128-row
    weight tiles by x tiles of 64, 128 or 256 rows (by M) would give under one wave of
    blocks."""
    if m <= 32 or k > THRESHOLDS.wgmma_narrow_max_k or n % WEIGHT_BN:
        return False
    return math.ceil(m / _wgmma_rows(m)) * (n // 128) < THRESHOLDS.num_sms


def _wgmma_rows(m: int) -> int:
    """Rows of x per wgmma block tile at batch ``m``: 32, 64, 128, else 256."""
    return 32 if m <= 32 else 64 if m <= 64 else 128 if m <= 128 else 256


def runs_wgmma(m: int, weight: Any) -> bool:
    """Whether ``quant_linear`` runs :func:`quant_gemm_wgmma` at batch ``m`` on an sm_90
    GPU (``wgmma_min_m``, or ``wgmma_decode_min_m`` on weights with K and N of at least
    ``wgmma_decode_min_dim`` and K of at least ``wgmma_decode_min_k``;
    ``wgmma_mid_m_min_weights`` unless narrow tiles apply with K <=
    ``wgmma_mid_m_narrow_max_k``; a schedule that fits the weight). ``weight``: a
    :class:`~lowvm.kernels.weights.QuantWeight`, or anything with its ``n``, ``k``, ``bk``
    and ``wtype``."""
    t = THRESHOLDS
    if m < t.wgmma_min_m and not (m >= t.wgmma_decode_min_m
                                  and min(weight.n, weight.k) >= t.wgmma_decode_min_dim
                                  and weight.k >= t.wgmma_decode_min_k):
        return False
    if (32 < m <= 64 and weight.n * weight.k < t.wgmma_mid_m_min_weights
            and not (weight.k <= t.wgmma_mid_m_narrow_max_k
                     and _narrow_wgmma(m, weight.n, weight.k))):
        return False
    return choose_wgmma_schedule(m, weight.n, weight.k, weight.bk, weight.wtype) is not None


def wgmma_refusal(s: GemmSchedule, n: int, k: int, bk: int, wtype: DType | None = None
                  ) -> str | None:
    """Why :func:`quant_gemm_wgmma` cannot run ``s`` on a weight ``[n, k]`` of format K
    tile ``bk`` (and type ``wtype``, when given), naming the values; None when it can: the
    one place the planner and the tuner's space ask."""
    if bk not in (64, 128) or s.bk != bk:
        return (f"bk={s.bk}: the wgmma GEMM takes the weight's K tile, 64 or 128 (group "
                f">= 64); this weight has {bk}")
    if s.warps_n != 1 or s.warps_m not in (4, 8):
        return f"warps_m={s.warps_m}, warps_n={s.warps_n}: accepted 4 x warpgroups (4 or 8), 1"
    if s.bm % 8 or not 8 <= s.bm <= 256:
        return f"bm={s.bm} rows of x: accepted a multiple of 8 in 8..256"
    if s.bn % (16 * s.warps_m) or n % s.bn:
        return (f"bn={s.bn} weight rows: accepted a multiple of 64 x warpgroups "
                f"({16 * s.warps_m}) dividing N={n}")
    if s.split < 1 or s.prefetch < 1 or (k // bk) % (s.split * s.prefetch):
        return (f"K / bk = {k // bk} steps must be a multiple of split x prefetch = "
                f"{s.split * s.prefetch} (both >= 1)")
    if (s.weights_shared or s.min_blocks != 1 or s.x_steps or s.l2_ahead or s.k_slice
            or s.x_whole or s.x_rows or s.swap_ab):
        return ("the wgmma GEMM takes no weights_shared, min_blocks, x_steps, l2_ahead, "
                "k_slice, x_whole, x_rows or swap_ab")
    if s.stages is not None and s.stages < 1:
        return f"stages={s.stages} must be None or >= 1"
    x_bytes = max(1, s.stages or 1) * (bk // 64) * s.prefetch * s.bm * 128  # 1 KB panels
    y_bytes = s.bm * (s.bn + 4) * 4
    if max(x_bytes, y_bytes) > 227 * 1024:
        return (f"needs {max(x_bytes, y_bytes)} bytes of shared memory per block, over "
                "227 KB; use fewer stages or a smaller bm")
    if wtype is not None:
        from lowvm.kernels.quant_gemm_prefill import threads_fit

        if not threads_fit(wtype, s):
            return (f"its {s.warps_m * 32} threads cannot split the {wtype.name} weight "
                    "tile evenly")
    return None
