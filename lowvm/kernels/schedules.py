"""Which kernel and schedule a quantized GEMM of batch ``M`` runs with, without tuning.

:func:`choose_schedule` (``quant_gemm``: decode tiles up to M = 16, else 64/128-row
tiles), :func:`choose_prefill_schedule` with :func:`prefill_split` (``quant_gemm_prefill``
for large M) and :func:`choose_wgmma_schedule` with :func:`runs_wgmma` (sm_90's wgmma
kernel) pick a :class:`~lowvm.kernels.gemm_schedule.GemmSchedule` from the problem's
shape; :func:`plan_refusal` and :func:`wgmma_refusal` say why a given schedule cannot run
on a weight. ``quant_gemm``'s choice is data: an ordered table of rules
(:data:`SCHEDULE_RULES`), each with its reason and the results file that shows it. Every
hand-tuned threshold is a field of :data:`THRESHOLDS`. The measurements behind both are in
docs/performance.md ("Schedule choices"), each with the command that re-measures it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from lowvm.dtypes import DType
from lowvm.dtypes import dtype as as_dtype
from lowvm.errors import LowvmError
from lowvm.kernels.gemm_schedule import GemmSchedule, ScheduleError
from lowvm.kernels.weights import WEIGHT_BN, WEIGHT_WARPS_N

__all__ = ["ScheduleThresholds", "THRESHOLDS", "NUM_SMS_DEFAULT", "PREFILL_KERNEL",
           "X_WHOLE_BYTES", "GemmShape", "ScheduleRule", "SCHEDULE_RULES", "schedule_rule",
           "choose_schedule", "choose_prefill_schedule", "prefill_split",
           "choose_wgmma_schedule", "runs_wgmma", "plan_refusal", "wgmma_refusal"]


@dataclass(frozen=True)
class ScheduleThresholds:
    """The hand-tuned thresholds of the built-in choice of kernel and schedule, fitted to
    H100 sweeps of the Llama shapes; what was measured to set each, and the command that
    re-measures it, is in docs/performance.md ("Schedule choices")."""

    #: SMs the schedules are sized for (the H100 SXM's 132)
    num_sms: int = 132
    #: which kernel ``quant_linear`` runs for large M (``prefill_split``) without a
    #: schedule: "quant_gemm_prefill" (measured faster there) or "quant_gemm"
    prefill_kernel: str = "quant_gemm_prefill"
    #: ... when its 256 x 128 tiles give at least this many blocks (with fewer,
    #: quant_gemm's smaller tiles measured faster)
    prefill_min_blocks: int = 80
    #: ... and only from this M (at M = 128 quant_gemm's 128-row tiles measured faster)
    prefill_min_m: int = 129
    #: below ``prefill_min_blocks`` blocks the prefill kernel splits K (2 or 4 ways, each
    #: block keeping at least this many K steps) to reach them
    prefill_split_min_steps: int = 24
    #: on sm_90 (H100/H200) ``quant_linear`` runs the wgmma kernel from this M (where the
    #: weight's K tile is 64 or 128): it beat quant_gemm and quant_gemm_prefill there
    wgmma_min_m: int = 17
    #: ... except at 32 < M <= 64 on weights of fewer elements than this, where
    #: quant_gemm's one-warp 64-row body measured faster
    wgmma_mid_m_min_weights: int = 100_000_000
    #: ... but narrow wgmma tiles (see ``wgmma_narrow_max_k``) won there up to this K
    wgmma_mid_m_narrow_max_k: int = 8192
    #: where 128-row weight tiles leave the GPU under one wave at M > 32, 64-row ones
    #: (one warpgroup) by 64 rows of x, unsplit, measured faster up to this K
    wgmma_narrow_max_k: int = 16384
    #: below ``wgmma_min_m``, from this M, on weights with K and N both >=
    #: ``wgmma_decode_min_dim``: 16-row x tiles on 64 weight rows (one warpgroup), K split
    #: 4, 2 stages, prefetch 2 (faster on the largest weights only)
    wgmma_decode_min_m: int = 9
    #: see ``wgmma_decode_min_m``
    wgmma_decode_min_dim: int = 8192
    #: ... and K of at least this (below it quant_gemm's two K steps of weights in flight
    #: won)
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
    ``blocks``, also keeping the grid in one wave (a second wave measured slower)."""
    return _prefetch_depth(
        steps, lambda depth: blocks <= num_sms * _X_WHOLE_BLOCKS_PER_SM[depth])


#: where the results the rules cite live
_RESULTS = "benchmarks/results/2026-11-27"


@dataclass(frozen=True)
class GemmShape:
    """What the rules of :data:`SCHEDULE_RULES` read: the problem, the SMs, whether x may
    be held whole, and the tile and K split these imply."""

    m: int
    n: int
    k: int
    bk: int
    num_sms: int = NUM_SMS_DEFAULT
    #: whether x may be held whole in shared memory (``choose_schedule(x_whole=...)``)
    x_whole: bool = True

    @property
    def bm(self) -> int:
        """Rows of x per block: 16 (decode), 64, else 128."""
        return 16 if self.m <= 16 else 64 if self.m <= 64 else 128

    @property
    def warps_m(self) -> int:
        return 1 if self.m <= 16 else 2 if self.m <= 64 else 4

    @property
    def blocks(self) -> int:
        """Blocks of the unsplit grid."""
        return (self.n // WEIGHT_BN) * math.ceil(self.m / self.bm)

    @property
    def steps(self) -> int:
        """K steps of the whole K range."""
        return self.k // self.bk

    @functools.cached_property
    def split(self) -> int:
        """The K split before the rules: M > 16 doubles it up to ~2 blocks per SM (tiles
        reuse weights across rows); decode (M <= 16) up to 8 while the grid is under ~4
        blocks per SM or a block would still stream >= 24 K steps, not at all from 3
        blocks per SM, and to 16 at M = 1 with x held whole (a K range is then cheap to
        start) while still under 4 blocks per SM; every block keeps >= 4 K steps."""
        blocks, steps, sms = self.blocks, self.steps, self.num_sms
        split = 1
        if self.m > 16:
            while (blocks * split < 2 * sms and steps % (2 * split) == 0
                   and steps // (2 * split) >= 4):
                split *= 2
        elif blocks < 3 * sms:
            while (split < 8 and steps % (2 * split) == 0 and steps // (2 * split) >= 4
                   and (blocks * split < 4 * sms or steps // (2 * split) >= 24)):
                split *= 2
        if (self.m == 1 and self.x_whole and split == 8 and blocks * split < 4 * sms
                and steps % 16 == 0 and steps // 16 >= 4):
            split = 16
        return split

    @property
    def block_steps(self) -> int:
        """K steps per block at :attr:`split`."""
        return self.steps // self.split

    @property
    def x_bytes(self) -> int:
        """Shared bytes of x for a block's K range at :attr:`split`: one row at M = 1,
        else ``bm`` rows (those past M zero-filled)."""
        return (1 if self.m == 1 else self.bm) * (self.k // self.split) * 2


@dataclass(frozen=True)
class ScheduleRule:
    """One rule of the built-in choice: where it applies, the schedule fields it sets
    (over the shape's tile and split), why, and the results file that shows it."""

    name: str
    applies: Callable[[GemmShape], bool]
    fields: Callable[[GemmShape], dict[str, Any]]
    #: one line: what was measured faster
    reason: str
    #: a results file (``benchmarks/results/<date>/<scenario>/<gpu>.json``) with rows the
    #: rule chooses for, re-measured by its ``environment.command``; None where none has
    #: such rows yet
    results: str | None


#: the built-in choice of ``quant_gemm``'s schedule: the first rule that applies gives
#: the fields; the figures behind each are in docs/performance.md ("Schedule choices")
SCHEDULE_RULES: tuple[ScheduleRule, ...] = (
    ScheduleRule(
        "stream-at-split-4",
        lambda s: (8 < s.m <= 16 and s.x_whole and s.split == 8 and s.steps % 8 == 0
                   and s.x_bytes <= X_WHOLE_BYTES and s.blocks * 4 >= s.num_sms),
        lambda s: dict(split=4, stages=None, prefetch=2),
        "where 16 rows would be held whole at split 8, x streamed at split 4 with two "
        "steps of weights in flight measured faster",
        f"{_RESULTS}/schedules/nvidia-h100-80gb-hbm3.json"),
    ScheduleRule(
        "x-held-whole",
        lambda s: ((s.m == 1 or 8 < s.m <= 16) and s.x_whole
                   and s.x_bytes <= X_WHOLE_BYTES),
        lambda s: dict(stages=None, prefetch=_x_whole_prefetch(
            s.block_steps, s.blocks * s.split, s.num_sms), x_whole=s.k // s.split,
            x_rows=1 if s.m == 1 else 0, swap_ab=s.m == 1),
        "x held whole leaves the main loop without x copies and barriers; at M = 1 one "
        "row, the weights as the MMA's A operand (half the MMAs)",
        f"{_RESULTS}/gemm-decode/nvidia-h100-80gb-hbm3.json"),
    ScheduleRule(
        "small-m-streams-per-step",
        lambda s: s.m <= 8 and s.x_whole and s.x_bytes <= X_WHOLE_BYTES,  # M = 1: above
        lambda s: dict(stages=None, prefetch=_x_whole_prefetch(
            s.block_steps, s.blocks * s.split, s.num_sms)),
        "at 2 <= M <= 8 the 16 rows held whole cost each block their copy before its "
        "first MMA: x streamed per step measured faster",
        f"{_RESULTS}/schedules/nvidia-h100-80gb-hbm3.json"),
    ScheduleRule(
        "decode-prefetch",
        lambda s: s.m <= 16 and s.split < 8,
        lambda s: dict(stages=2 if s.m > 1 else None,
                       prefetch=_prefetch_depth(s.block_steps)),
        "under split 8 weights prefetched up to 4 steps ahead (>= 8 steps per prefetched "
        "one) and, from M = 2, x pipelined two deep measured faster",
        f"{_RESULTS}/schedules/nvidia-h100-80gb-hbm3.json"),
    ScheduleRule(
        "split-8-two-ahead",
        lambda s: s.m <= 16 and 8 <= s.block_steps < 24 and s.block_steps % 2 == 0,
        lambda s: dict(stages=2, prefetch=2),
        "split-8 grids of 8..23 K steps per block: two steps of weights in flight with x "
        "double-buffered measured faster than x three deep",
        f"{_RESULTS}/schedules/nvidia-h100-80gb-hbm3.json"),
    ScheduleRule(
        "decode-x-three-deep",
        lambda s: s.m <= 16,
        lambda s: dict(stages=3, prefetch=1),
        "the other split-8 decode grids: x pipelined three deep, one step of weights "
        "ahead, measured faster than two steps of weights",
        f"{_RESULTS}/schedules/nvidia-h100-80gb-hbm3.json"),
    ScheduleRule(
        "mid-m-one-warp",
        lambda s: 16 < s.m <= 64,
        lambda s: dict(warps_m=1, k_slice=min(s.bk, 16 if s.k >= 14336 or s.split == 1
                                              else 32),
                       stages=2, prefetch=1, fused_split=False),
        "one M-warp over 64 rows in K slices converts each weight once: faster than two "
        "M-warps; split sums by a second kernel",
        f"{_RESULTS}/gemm-prefill/nvidia-h100-80gb-hbm3.json"),
    ScheduleRule(
        "tall-tiles",
        lambda s: s.m > 64,
        lambda s: dict(stages=3, prefetch=1, fused_split=False),
        "128-row tiles on 4 M-warps, x three deep, split sums by a second kernel: where "
        "neither the prefill nor the wgmma kernel runs (groups of 16 or 32; off sm_90 "
        "below the prefill thresholds)",
        None),
)


def schedule_rule(shape: GemmShape) -> ScheduleRule:
    """The first rule of :data:`SCHEDULE_RULES` that applies to ``shape``."""
    return next(rule for rule in SCHEDULE_RULES if rule.applies(shape))


def choose_schedule(m: int, n: int, k: int, bk: int, num_sms: int = NUM_SMS_DEFAULT,
                    x_whole: bool = True) -> GemmSchedule:
    """A schedule for batch ``m``: the shape's tile and K split (:class:`GemmShape`) with
    the fields of the first rule of :data:`SCHEDULE_RULES` that applies. ``x_whole=False``
    leaves out the rules that hold x whole (for K ranges that do not fit)."""
    shape = GemmShape(m, n, k, bk, num_sms, x_whole)
    base = dict(bm=shape.bm, bn=WEIGHT_BN, bk=bk, warps_m=shape.warps_m,
                warps_n=WEIGHT_WARPS_N, split=shape.split)
    return GemmSchedule(**{**base, **schedule_rule(shape).fields(shape)})


def plan_refusal(s: GemmSchedule, k: int, bk: int) -> str | None:
    """Why :func:`quant_linear` refuses ``s`` for K = ``k`` and a weight of format K tile
    ``bk`` (naming the values and what is accepted), or None: the one place both the
    planner and the tuner's space (``lowvm.tune.space.runnable_reason``) ask. The rules
    of the schedule's fields alone are :class:`GemmSchedule`'s own."""
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

    Fitted to H100 sweeps (docs/performance.md, "Schedule choices").
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
    one place the planner and the tuner's space ask. The rules of the schedule's fields
    alone are :class:`GemmSchedule`'s own (``wgmma=True``), applied here too to a schedule
    that is not marked."""
    if not s.wgmma:  # the kernel's own rules, for a schedule not marked as its
        try:
            replace(s, wgmma=True)
        except ScheduleError as exc:
            return str(exc)
    if bk not in (64, 128) or s.bk != bk:
        return (f"bk={s.bk}: the wgmma GEMM takes the weight's K tile, 64 or 128 (group "
                f">= 64); this weight has {bk}")
    if n % s.bn:
        return f"bn={s.bn} weight rows: accepted a multiple dividing N={n}"
    if (k // bk) % (s.split * s.prefetch):
        return (f"K / bk = {k // bk} steps must be a multiple of split x prefetch = "
                f"{s.split * s.prefetch}")
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
