"""Host entry points of the quantized GEMM library: prepare weights once, multiply often.

``prepare_weight`` quantises (or takes codes), repacks for :func:`quant_gemm` and moves
everything to the GPU; ``quant_linear`` picks a kernel and a schedule for the batch size
(the decode program up to M = 16; on sm_90 the wgmma kernel above, and from M = 9 on
large weights, where :func:`runs_wgmma` says so; elsewhere the prefill kernel or
quant_gemm), compiles it once
per specialisation (memory and disk cached), and launches on torch's current stream. The
repacked format depends only on ``(wtype, bk)``, so every kernel and schedule shares one
copy of the weights.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from lowvm.dtypes import DType, decode, encode
from lowvm.dtypes import dtype as as_dtype
from lowvm.errors import LowvmError
from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.kernels.quant_gemm import finish_split, finish_split_bf16, quant_gemm, quant_gemm_bf16
from lowvm.kernels.weight_format import repack_weights

__all__ = ["QuantWeight", "prepare_weight", "quant_linear", "choose_schedule", "WEIGHT_BN",
           "overlapped_launches", "overlap_enabled",
           "tuned_schedule",
           "fits_float16",
           "NUM_SMS_DEFAULT", "PREFILL_KERNEL", "prefill_quant_linear",
           "choose_prefill_schedule", "prefill_split", "plan_refusal",
           "choose_wgmma_schedule", "wgmma_quant_linear", "runs_wgmma", "wgmma_refusal",
           "is_sm90"]

#: the weight tile width every schedule shares (the repacked format's N tile)
WEIGHT_BN = 64
WEIGHT_WARPS_N = 4
NUM_SMS_DEFAULT = 132
#: which kernel ``quant_linear`` runs for large M (``prefill_split``) without a schedule:
#: "quant_gemm_prefill" (measured 1.4-1.6x faster there on the H100) or "quant_gemm"
PREFILL_KERNEL = "quant_gemm_prefill"
#: ... when its 256 x 128 tiles give at least this many blocks: with fewer (M = 256 on
#: N = 4096, 6144 or 8192) it measured slower than quant_gemm's smaller tiles on the H100
#: (e.g. 14336 x 4096, M = 256: 404 vs 191 us), with 80 (8192 x 10240) faster (237 vs 283)
PREFILL_MIN_BLOCKS = 80
#: ... and only from this M: at M = 128 quant_gemm's 128-row tiles measured faster on all
#: five Llama shapes (4096 x 28672: 158.1 vs 201.2 us, 8192 x 10240: 131.2 vs 195.2;
#: NOTES.md, seventh session)
PREFILL_MIN_M = 129
#: below PREFILL_MIN_BLOCKS blocks the prefill kernel splits K (2 or 4 ways, each block
#: keeping at least this many K steps) to reach them: M = 256 on 14336 x 4096 measured
#: 133.2 us at split 4 against quant_gemm's 154.1, 28672 x 8192 396.1 at split 2 against
#: 533.4; 4096 x 6144 (split 2 would leave 16 steps) keeps quant_gemm, 79.9 vs 89.8
PREFILL_SPLIT_MIN_STEPS = 24
#: on sm_90 (H100/H200) ``quant_linear`` runs :func:`quant_gemm_wgmma` from this M (where
#: the weight's K tile is 64 or 128): in the eighth session's sweeps it beat quant_gemm and
#: quant_gemm_prefill at M = 64..4096 on the Llama shapes (e.g. 4096 x 28672: 46.8 vs 61.6
#: us at M = 64, 127.6 vs 198.2 at M = 256, 1867 vs 2650 at M = 4096; NOTES.md)
WGMMA_MIN_M = 17
#: ... except at 32 < M <= 64 on weights of fewer elements than this, where quant_gemm's
#: one-warp 64-row body measured faster (M = 64: 4096 x 6144 24.3 vs 30.0 us, 14336 x 4096
#: 38.4 vs 45.1, 8192 x 10240 51.3 vs 55.5; wgmma won on 4096 x 28672, 49.1 vs 61.1, and
#: 28672 x 8192, 91.9 vs 108.9; at M = 32 it won on all five; NOTES.md, eighth session)
WGMMA_MID_M_MIN_WEIGHTS = 100_000_000
#: ... but narrow wgmma tiles (see WGMMA_NARROW_MAX_K) won there up to this K (M = 64:
#: 4096 x 6144 22.2 vs 24.9 us, 8192 x 10240 47.6 vs 52.4, 4096 x 4096 20.5 vs 27.0; at
#: K = 14336, 60.4 vs 39.0)
WGMMA_MID_M_NARROW_MAX_K = 8192
#: where 128-row weight tiles leave the H100 under one wave at M > 32, 64-row ones (one
#: warpgroup) by 64 rows of x, unsplit, measured faster up to this K: M = 256 14336 x 4096
#: 75.7 vs 82.3 us, 8192 x 10240 107.1 vs 118.1; at K = 28672 (28672 x 8192) 296 vs 225
WGMMA_NARROW_MAX_K = 16384
#: below WGMMA_MIN_M, from this M, on weights with K and N both >= WGMMA_DECODE_MIN_DIM:
#: 16-row x tiles on 64 weight rows (one warpgroup), K split 4, 2 stages, prefetch 2.
#: M = 16 in CUDA graphs (ninth session): 8192 x 10240 30.9 vs 36.0 us, 28672 x 8192 61.5
#: vs 64.4; it lost on 14336 x 4096 (25.6 vs 20.9), 4096 x 28672 (37.3 vs 28.7) and the
#: 4096-deep projections, and at M = 1 (8-row tiles) everywhere (x copied every step).
#: At M = 9 (events / graphs): 8192 x 10240 37.1 -> 28.5 / 29.2 -> 28.6, 28672 x 8192
#: 61.6 -> 59.7 / 57.1 -> 59.8 (slower in graphs)
WGMMA_DECODE_MIN_M = 9
WGMMA_DECODE_MIN_DIM = 8192
#: the wgmma kernel's grid should have at least this many blocks: smaller x tiles first
#: (256 -> 128 rows), then K split 2, 4 or 8 ways
WGMMA_MIN_BLOCKS = 80


def weight_bk(group: int, k: int) -> int:
    """The K tile of the repacked format: 128, or the group when it is smaller."""
    g = k if group in (-1, k) else group
    return min(128, g)


@dataclass
class QuantWeight:
    """A weight ``[N, K]`` repacked for :func:`quant_gemm`, with its scales, on one device."""

    packed: Any  # torch uint8 [rows, bytes per thread]
    scales: Any  # torch float16 [K / group, N]
    wtype: DType
    group: int
    n: int
    k: int
    bk: int
    zeros: Any = None  # torch float16 [K / group, N] holding codes, or None (symmetric)

    def for_dtype(self, dtype: Any) -> tuple[Any, Any]:
        """(scales, zeros) in the activation type ``dtype`` (other-type copies made once)."""
        if self._native(dtype):
            return self.scales, self.zeros
        cache = self.__dict__.setdefault("_converted", {})
        if dtype not in cache:
            cache[dtype] = (self.scales.to(dtype),
                            None if self.zeros is None else self.zeros.to(dtype))
        return cache[dtype]

    def holds(self, dtype: Any) -> bool:
        """Whether :meth:`for_dtype` has ``dtype``'s scales (and zeros) without a cast."""
        return self._native(dtype) or dtype in self.__dict__.get("_converted", {})

    def _native(self, dtype: Any) -> bool:
        """Whether the stored scales (and zeros) are of ``dtype`` already."""
        return self.scales.dtype == dtype and (self.zeros is None or self.zeros.dtype == dtype)


def _check_shape(n: int, k: int, group: int, bk: int) -> None:
    if n % WEIGHT_BN:
        raise LowvmError(f"out_features (N) = {n} must be a multiple of {WEIGHT_BN}")
    if k % group:
        raise LowvmError(f"group_size = {group} must divide in_features (K) = {k}")
    if group % bk or k % bk:
        raise LowvmError(f"in_features (K) = {k} and group_size = {group} must be multiples "
                         f"of {bk}")


def prepare_weight(codes: np.ndarray, scales: np.ndarray, wtype: DType | str, group: int,
                   device: Any = "cuda", zeros: np.ndarray | None = None) -> QuantWeight:
    """Repack integer codes ``[N, K]`` of ``wtype`` and ``scales [K/group, N]`` for the GPU
    (with ``zeros [K/group, N]``, codes of the zero point, for asymmetric types)."""
    import torch

    wt = as_dtype(wtype)
    n, k = codes.shape
    bk = weight_bk(group, k)
    _check_shape(n, k, group, bk)
    if scales.shape != (k // group, n):
        raise LowvmError(f"scales must have shape [K/group, N] = [{k // group}, {n}], got "
                         f"{list(scales.shape)}")
    if zeros is not None and zeros.shape != scales.shape:
        raise LowvmError(f"zeros must have the shape of scales {list(scales.shape)}, got "
                         f"{list(zeros.shape)}")
    sched = GemmSchedule(bk=bk)
    packed = repack_weights(np.asarray(codes), wt, sched)

    def half(a: np.ndarray) -> Any:
        return torch.from_numpy(np.ascontiguousarray(a, np.float16)).to(device)

    return QuantWeight(torch.from_numpy(packed).to(device), half(scales), wt, group, n, k, bk,
                       None if zeros is None else half(zeros))


def quantize_to_codes(weight: np.ndarray, wtype: DType | str, group: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest symmetric group quantisation: ``(codes [N, K], scales [K/g, N])``."""
    wt = as_dtype(wtype)
    n, k = weight.shape
    groups = weight.reshape(n, k // group, group).astype(np.float64)
    scales = (np.abs(groups).max(axis=2) / wt.max_value).astype(np.float16)
    scales[scales == 0] = 1
    q = np.clip(groups / scales.astype(np.float64)[..., None], wt.min_value, wt.max_value)
    return encode(q.reshape(n, k), wt), np.ascontiguousarray(scales.T)


#: bytes of shared memory an ``x_whole`` decode schedule may hold x in (per block)
X_WHOLE_BYTES = 32 * 1024
#: blocks of an int4 ``x_whole`` decode GEMM that fit one SM, by prefetch depth (ptxas,
#: sm_90: 64, 72 and 96 registers for 128 threads)
_X_WHOLE_BLOCKS_PER_SM = {1: 8, 2: 7, 4: 5}


def _x_whole_prefetch(steps: int, blocks: int, num_sms: int) -> int:
    """K steps of weights in flight for an ``x_whole`` block of ``steps`` K steps in a
    grid of ``blocks``: the deepest of 4, 2, 1 that divides ``steps``, leaves >= 8 steps
    per prefetched one, and keeps the grid in one wave. Fitted to the H100 graph sweep of
    NOTES.md (sixth session), where a second wave cost 28672 x 8192 48 -> 67 us and deep
    prefetch on 4-step blocks 8.1 -> 9.1 us (4096 x 4096)."""
    for depth in (4, 2):
        if (steps % depth == 0 and steps >= 8 * depth
                and blocks <= num_sms * _X_WHOLE_BLOCKS_PER_SM[depth]):
            return depth
    return 1


def choose_schedule(m: int, n: int, k: int, bk: int, num_sms: int = NUM_SMS_DEFAULT,
                    x_whole: bool = True) -> GemmSchedule:
    """A schedule for batch ``m``: decode tiles with split-K to fill the GPU, or prefill.

    Decode (M <= 16) holds x for the block's whole K range in shared memory when it fits
    ``X_WHOLE_BYTES`` (``x_whole``; one row at M = 1, ``x_rows=1``): the main loop then
    has no x copy and no barrier (sm_90 SASS of the loop: 222 -> 136 instructions per warp
    and K step on split-8 shapes, 169 -> 131 on 4096 x 28672), with the weight prefetch
    depth of :func:`_x_whole_prefetch`. In CUDA graphs on the H100 at M = 1 this measured
    0 to 23 % faster than streaming x (8192 x 10240: 27.5 -> 21.2 us; NOTES.md, sixth
    session). ``x_whole=False`` gives the schedules that stream x through shared memory
    every step or every ``prefetch`` steps (the choice before; kept for comparison and for
    K ranges that do not fit). At M = 1 the step runs with the weights as the MMA's A
    operand (``swap_ab``): half the MMAs; in graphs int4 26.1 -> 24.2 us on 4096 x 28672,
    15.8 -> 14.8 on 14336 x 4096, int3 27.4 -> 21.6 and 15.5 -> 13.2 (NOTES.md, twelfth
    session; the split and prefetch rules stayed best for it). At 8 < M <= 16, where 16
    rows would be held at split 8, x
    is streamed at split 4 with two steps of weights in flight instead, where that still
    gives a block per SM (ninth session).

    Decode (M <= 16): split-K (its reduction fused into the GEMM) doubles while the grid
    has under ~4 blocks per SM, or while each block would still stream >= 24 K steps,
    keeping >= 4 steps per block and split <= 8 (16 at M = 1 with ``x_whole``); grids of
    >= 3 blocks per SM are not split. M > 16 splits only up to ~2 blocks per SM (more
    measured slower at M = 64), and finishes the sums with a second kernel (the in-kernel
    reduction measured slower there: 4096 x 6144, M = 64: 41.4 vs 33.3 us).
    Split-8 decode grids with 8..23 K steps per block prefetch two steps of weights with
    x double-buffered (14336 x 4096: 22.3 vs 24.7 us); other split-8 grids pipeline x three
    deep, one step of weights ahead.
    Fitted to the H100 decode sweeps of NOTES.md (2026-11-23, fused split-K): e.g.
    4096 x 6144 split 8 13.6 us, 8192 x 10240 split 4 28.2, 28672 x 8192 split 8 60.9,
    4096 x 28672 unsplit 35.4; inside a CUDA graph of back-to-back calls (``gemm_quick.py
    --graph``) no other schedule of the space measured more than 0.6 us faster on the
    Llama-3-8B decode shapes (fourth session).
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
        # (NOTES.md, sixth session)
        split = 16
    if (8 < m <= 16 and x_whole and split == 8 and steps % 8 == 0
            and bm * (k // split) * 2 <= X_WHOLE_BYTES and blocks * 4 >= num_sms):
        # where 16 rows would be held whole at split 8, streaming x at split 4 with two
        # steps of weights in flight measured faster: M = 16 in graphs 4096 x 6144 15.6 ->
        # 11.9 us, 4096 x 4096 12.1 -> 10.1 (events 19.1 -> 16.2, 15.6 -> 14.6); at M = 8
        # it was mixed (12.0 -> 10.9, 9.6 -> 9.9), so M <= 8 keeps x whole (NOTES.md,
        # ninth session)
        return GemmSchedule(bm=bm, bn=WEIGHT_BN, bk=bk, warps_m=warps_m,
                            warps_n=WEIGHT_WARPS_N, split=4, stages=None, prefetch=2)
    if m <= 16 and x_whole:
        rows = 1 if m == 1 else bm
        kb = k // split
        if rows * kb * 2 <= X_WHOLE_BYTES:
            return GemmSchedule(bm=bm, bn=WEIGHT_BN, bk=bk, warps_m=warps_m,
                                warps_n=WEIGHT_WARPS_N, split=split, stages=None,
                                prefetch=_x_whole_prefetch(steps // split, blocks * split,
                                                           num_sms),
                                x_whole=kb, x_rows=1 if rows == 1 else 0,
                                swap_ab=rows == 1)
    if m <= 16 and split < 8:
        return GemmSchedule(bm=bm, bn=WEIGHT_BN, bk=bk, warps_m=warps_m,
                            warps_n=WEIGHT_WARPS_N, split=split, stages=None,
                            prefetch=_largest_dividing(4, steps // split))
    if m <= 16 and 8 <= steps // split < 24 and (steps // split) % 2 == 0:
        # split-8 grids with 8..23 K steps per block: two steps of weights in flight and x
        # double-buffered (ptxas gives int4 96 registers, so 5 blocks fit per SM); measured
        # 22.5-22.7 vs 24.7 us (14336 x 4096, M = 1; NOTES.md, fourth session)
        return GemmSchedule(bm=bm, bn=WEIGHT_BN, bk=bk, warps_m=warps_m,
                            warps_n=WEIGHT_WARPS_N, split=split, stages=2, prefetch=2)
    if 16 < m <= 64:
        # one M-warp covers the 64 rows, the K step's MMAs over k_slice-deep slices, so
        # each weight is converted once, not once per M-warp: measured 7-17 % faster than
        # two M-warps on the five Llama shapes (4096 x 6144: 29.2 -> 26.0 us; slices of 16
        # won by 2-5 % where K >= 14336; NOTES.md, sixth session). With the related
        # addresses (seventh session) slices of 16 also won on the unsplit 4096 x 28672
        # grid, 66.7 -> 62.0 us, and lost 3 % on the split ones with K < 14336
        # Two x stages beat three by 1-3 % on all five shapes in two runs (4096 x 28672:
        # 63.1 -> 61.7 us); register caps and 32-wide blocks did not help (seventh session)
        warps_m, k_slice = 1, 16 if k >= 14336 or split == 1 else 32
    else:
        k_slice = 0
    # the other split-8 decode grids (and M > 16) pipeline x 3 deep instead, one step of
    # weights ahead: measured 13.6 vs 18.4 us (4096 x 6144) and 60.9 vs 71.0 (28672 x 8192)
    # at split 8 against two steps of weights (fourth session, 4 stages); with the related
    # shared addresses 4 stages lost 19-36 % on 28672 x 8192 at M = 4 / 16 and 3 stages
    # won: 91.8 -> 67.6 us at M = 16 (NOTES.md, seventh session)
    return GemmSchedule(bm=bm, bn=WEIGHT_BN, bk=bk, warps_m=warps_m, warps_n=WEIGHT_WARPS_N,
                        split=split, stages=2 if k_slice else 3, prefetch=1,
                        fused_split=m <= 16, k_slice=k_slice)


def tuned_schedule(m: int, weight: QuantWeight, cache: Any = None) -> GemmSchedule | None:
    """The autotuner's pick (:mod:`lowvm.tune`) for this GPU, weight and M bucket, from its
    cache (``$LOWVM_TUNE_CACHE``, default ``~/.cache/lowvm/tune.json``), when there is
    one that this weight's repacked format can run; else None (``choose_schedule``).

    The entry is rebuilt field for field (``x_whole``, ``x_rows``, ``prefetch``,
    ``k_slice``, ...: the tuner measured exactly that schedule against the built-in
    choice); an entry of the first cache format is mapped as before, with a one-time
    warning. A pick this call could not run (another format, K steps it does not divide,
    x_whole too short for this K) is ignored, so the planner never raises on it.
    ``quant_linear`` asks once per call shape and process: a schedule tuned later is used
    by the next process. An unreadable cache or entry is reported once and ignored.
    """
    from lowvm.tune.cache import TuneCache, TuneKey, gemm_schedule_from_entry
    from lowvm.tune.errors import TuneError
    from lowvm.tune.space import runnable_reason

    try:
        gpu = _device_name(weight.packed.device)
        entry = (cache or TuneCache()).get(TuneKey.for_problem(
            gpu, weight.wtype.name, weight.group, weight.n, weight.k, m))
        if entry is None:
            return None
        s = gemm_schedule_from_entry(entry, m)
    except TuneError as exc:
        _warn_once(f"tune-cache: {exc}")
        return None
    if runnable_reason(s, m, weight.n, weight.k, weight.bk) is not None:
        return None
    return s


def _device_name(device: Any) -> str:
    import torch

    return torch.cuda.get_device_name(device)


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    import warnings

    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(f"lowvm: {message}; using the built-in schedules", stacklevel=3)


def _largest_dividing(limit: int, steps: int) -> int:
    """The largest power of two <= limit dividing ``steps``."""
    p = limit
    while steps % p:
        p //= 2
    return p


_COMPILED: dict[tuple, Any] = {}


def _compiled(program, **constants):
    import lowvm

    key = (program.name, tuple(sorted((k, str(v)) for k, v in constants.items())))
    if key not in _COMPILED:
        _COMPILED[key] = lowvm.compile(program, **constants)
    return _COMPILED[key]


_PLANS: dict[tuple, tuple[Any, Any, int]] = {}


def _plan(m: int, weight: QuantWeight, bf16: bool, zero_point: bool,
          schedule: GemmSchedule | None) -> tuple[Any, Any, int]:
    """(compiled GEMM, compiled unfused split-K epilogue or None, rows per output tile
    when split > 1, else 0) for one call shape, cached so a repeated call (every decode
    step) costs one dict lookup."""
    key = _plan_key(m, weight, bf16, zero_point, schedule)
    plan = _PLANS.get(key)
    if plan is None:
        n, k = weight.n, weight.k
        tuned = None if schedule else tuned_schedule(m, weight)
        s = schedule or (tuned if tuned and not tuned.wgmma else None) or choose_schedule(
            m, n, k, weight.bk)
        refusal = plan_refusal(s, k, weight.bk)
        if refusal:
            raise LowvmError(f"schedule {s}: {refusal}")
        gemm = _compiled(quant_gemm_bf16 if bf16 else quant_gemm, wtype=weight.wtype,
                         group=weight.group, zero_point=zero_point, **s.constants())
        plan = _PLANS[key] = (gemm, _finisher(s, bf16), s.rows if s.split > 1 else 0)
    return plan


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


def _checked(x: Any, weight: QuantWeight) -> Any:
    """``x`` made contiguous, after the checks every entry point makes."""
    import torch

    if (not isinstance(x, torch.Tensor) or x.dtype not in (torch.float16, torch.bfloat16)
            or x.dim() != 2):
        raise LowvmError(f"x must be a 2-D float16 or bfloat16 torch tensor, got "
                         f"{getattr(x, 'dtype', x)!r} of shape {list(getattr(x, 'shape', []))}")
    if x.shape[1] != weight.k:
        raise LowvmError(f"x has {x.shape[1]} columns but the weight has K = {weight.k}")
    if x.device != weight.packed.device:
        raise LowvmError(f"x is on {x.device}, the weight on {weight.packed.device}")
    if x.dtype == torch.float16 and not fits_float16(weight.wtype):
        raise LowvmError(f"{weight.wtype.name} weights have values float16 cannot hold "
                         f"(the kernel converts codes to the activation type before scaling); "
                         f"use bfloat16 activations for this type")
    return x.contiguous()


@functools.cache
def fits_float16(wtype: DType) -> bool:
    """True when every value of ``wtype`` is exactly a float16 (e5m1/e6m1 overflow or
    underflow it; every type of <= 8 bits fits bfloat16)."""
    codes = np.arange(1 << wtype.nbits, dtype=np.uint64)
    values = decode(codes, wtype).astype(np.float64)
    values = values[np.isfinite(values)]
    with np.errstate(over="ignore"):  # overflowing to inf is the answer "no"
        return bool(np.array_equal(values.astype(np.float16).astype(np.float64), values))


def _run(x: Any, weight: QuantWeight, schedule: GemmSchedule | None, planner: Any) -> Any:
    """Launch the plan ``planner`` makes for this call (the GEMM, whose split-K sums are
    finished in-kernel, or for ``fused_split=False`` schedules the GEMM and
    :func:`finish_split`; both leave the per-stream workspace zeroed)."""
    import torch

    m, n, k = x.shape[0], weight.n, weight.k
    # a first bfloat16 call casts the scales (and zeros) right before the GEMM, which
    # reads them before its wait: that launch must not overlap the cast
    overlap = overlap_enabled() and weight.holds(x.dtype)
    scales, zeros = weight.for_dtype(x.dtype)
    gemm, finish, tile_rows = planner(m, weight, x.dtype == torch.bfloat16, zeros is not None,
                                      schedule)
    zeros = scales if zeros is None else zeros  # not read without zero_point
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if tile_rows:  # split-K: one counter per output tile (tiles are at least 16 wide)
        ws, counters = _split_buffers(x.device, m * n, -(-m // tile_rows) * (n // 16))
    else:
        ws, counters = _dummy(x.device), _dummy(x.device, torch.int32)
    gemm(m, n, k, x, weight.packed, scales, zeros, y, ws, counters,
         overlap=overlap and gemm.cuda.waits_prior_grid)
    if finish is not None:
        finish(m * n, ws, y)
    return y


def _finisher(s: GemmSchedule, bf16: bool) -> Any:
    """The compiled unfused split-K epilogue of schedule ``s``, or None."""
    if s.split == 1 or s.fused_split:
        return None
    return _compiled(finish_split_bf16 if bf16 else finish_split)


#: per (device, stream, capture): a zeroed float32 workspace and int32 tile counters for
#: split-K; every split GEMM leaves both zeroed again (``store_result``/``finish_split``)
_SPLIT: dict[tuple, tuple[Any, Any]] = {}
#: outgrown buffers: kernels recorded in a graph, or still queued, may use them (kept)
_RETIRED: list[tuple[Any, Any]] = []


def _split_buffers(device: Any, ws_numel: int, tiles: int) -> tuple[Any, Any]:
    """Workspace and counters of at least these sizes for the current stream.

    Launches on one stream run one after another, so they share one pair. While a CUDA
    graph is being captured the pair is the capture's own, zeroed by a memset recorded
    in the capture: a pair shared with other graphs could be dirtied by one of them
    replayed concurrently, or be zeroed only by the recording of an earlier graph. Each
    replay of a graph then re-zeroes its pair first.

    The memory itself is never taken from a graph's private pool (:func:`_unpooled`):
    the pair outlives the call, and torch.compile's CUDA-graph trees refuse a recording
    that leaves live tensors in their pool which they did not create.
    """
    stream, capture = _stream_and_capture(device)
    key = (device, stream, capture)
    have = _SPLIT.get(key)
    if have is None or have[0].numel() < ws_numel or have[1].numel() < tiles:
        before = (0, 0) if have is None else (have[0].numel(), have[1].numel())
        sizes = (max(ws_numel, 2 * before[0], 1 << 16), max(tiles, 2 * before[1], 4096))
        ws, counters = _unpooled(sizes, device)
        ws.zero_()  # on the current stream: run now, or recorded in the capture
        counters.zero_()
        if have is not None:  # kernels queued, or recorded in a graph, may still use it
            _RETIRED.append(have)
        have = _SPLIT[key] = (ws, counters)
    return have


#: per device: the stream the split-K buffers are allocated on, which runs no work
_ALLOCATION_STREAMS: dict[int, Any] = {}


def _unpooled(sizes: tuple[int, int], device: Any) -> tuple[Any, Any]:
    """An uninitialised float32 workspace and int32 counters, allocated by a helper
    thread on a stream of our own: torch routes a capturing stream's allocations, and
    CUDA-graph trees (while they warm a function up and while they record it) the
    allocating *thread's*, into a graph's private pool; a fresh thread's on a stream
    that never captures are in neither. That stream runs no work, so the block cannot
    be one that queued kernels of another stream still use (the caching allocator
    reuses a block on its own stream without waiting). The helper launches nothing and
    runs in relaxed capture mode, so it cannot invalidate a capture underway here."""
    import threading

    import torch

    def allocate() -> tuple[Any, Any]:
        return (torch.empty(sizes[0], dtype=torch.float32, device=device),
                torch.empty(sizes[1], dtype=torch.int32, device=device))

    device = torch.device(device)
    if device.type != "cuda":
        return allocate()
    index = device.index if device.index is not None else torch.cuda.current_device()
    device = torch.device("cuda", index)
    done: dict[str, Any] = {}

    def helper() -> None:
        from lowvm.runtime.driver import relaxed_capture_mode

        try:
            with torch.cuda.device(index), relaxed_capture_mode():
                if index not in _ALLOCATION_STREAMS:
                    _ALLOCATION_STREAMS[index] = torch.cuda.Stream(index)
                with torch.cuda.stream(_ALLOCATION_STREAMS[index]):
                    done["pair"] = allocate()
        except BaseException as exc:  # noqa: BLE001  (raised again in the caller)
            done["error"] = exc

    thread = threading.Thread(target=helper, name="lowvm-split-buffers")
    thread.start()
    thread.join()
    if "error" in done:
        raise done["error"]
    return done["pair"]


def _stream_and_capture(device: Any) -> tuple[int, int]:
    """torch's current stream on ``device`` and the id of the graph it is capturing
    (0: none)."""
    import torch

    from lowvm.runtime.driver import capture_id, raw_stream_getter

    stream = int(raw_stream_getter()(device.index if device.index is not None else 0))
    try:
        return stream, capture_id(stream)
    except Exception as exc:  # a driver binding without the query: torch's yes/no only
        if not torch.cuda.is_current_stream_capturing():
            return stream, 0
        _warn_once(f"cannot identify the CUDA graph being captured ({exc}); graphs "
                   "captured on one stream share split-K buffers, so replay them only "
                   "after their first replay in capture order")
        return stream, -1


#: per thread, set by :func:`overlapped_launches`
_OVERLAP = threading.local()


@contextlib.contextmanager
def overlapped_launches(enabled: bool = True) -> Iterator[None]:
    """GEMMs this thread launches inside start while the kernel before them is still
    finishing.

    Programmatic dependent launch (sm_90 and newer; nothing changes before): a GEMM
    loads its first weights, then waits for the previous kernel (``vm.wait_prior_grid``)
    before it reads x or writes anything, so its launch and first DRAM round trip hide
    behind that kernel's tail. The promise this asks for: no kernel launched right before
    a GEMM writes that GEMM's weights, scales or zeros (true of a model's forward; not of
    a repack or ``load_state_dict`` followed at once by a forward, which must run outside).
    A bfloat16 call that first casts the weight's float16 scales launches plainly (the
    cast is the kernel right before it), and ``weights_shared`` schedules wait before any
    load. For capturing decode steps in CUDA graphs, where small kernels' launch gaps add up.
    """
    before = overlap_enabled()
    _OVERLAP.on = bool(enabled)
    try:
        yield
    finally:
        _OVERLAP.on = before


def overlap_enabled() -> bool:
    """Whether this thread is inside :func:`overlapped_launches` (for other kernels that
    wait for the previous one themselves, e.g. :mod:`lowvm.nn.attention`'s)."""
    return bool(getattr(_OVERLAP, "on", False))


def quant_linear(x: Any, weight: QuantWeight, schedule: GemmSchedule | None = None) -> Any:
    """``x [M, K] @ dequant(weight)^T`` -> ``[M, N]`` on the GPU, float16 or bfloat16
    (``schedule``: that one, a wgmma one when ``schedule.wgmma``; see the module
    docstring for the kernel chosen without one)."""
    x = _checked(x, weight)
    m, n = x.shape[0], weight.n
    if schedule is not None and schedule.wgmma:
        return _run(x, weight, schedule, _wgmma_plan)
    if schedule is None and is_sm90(x.device) and runs_wgmma(m, weight):
        return _run(x, weight, None, _wgmma_plan)
    if (schedule is None and PREFILL_KERNEL == "quant_gemm_prefill"
            and prefill_split(m, n, weight.k, weight.bk)):
        return _run(x, weight, None, _prefill_plan)
    return _run(x, weight, schedule, _plan)


def prefill_split(m: int, n: int, k: int, bk: int) -> int:
    """The K split ``quant_linear`` runs :func:`quant_gemm_prefill` with at batch ``m``
    (see ``PREFILL_MIN_M``, ``PREFILL_MIN_BLOCKS``, ``PREFILL_SPLIT_MIN_STEPS``), or 0
    where ``quant_gemm`` measured faster."""
    if m < PREFILL_MIN_M:
        return 0
    blocks, steps = math.ceil(m / 256) * (n // 128), k // bk
    for split in (1, 2, 4):
        if blocks * split >= PREFILL_MIN_BLOCKS:
            ok = steps % split == 0 and steps // split >= PREFILL_SPLIT_MIN_STEPS
            return split if split == 1 or ok else 0
    return 0


def choose_prefill_schedule(m: int, n: int, k: int, bk: int, wtype: DType | str,
                            arch: str = "sm_90") -> GemmSchedule:
    """A :func:`quant_gemm_prefill` schedule: the architecture's default
    (``prefill_schedule_for``: 256 x 128 tiles on 4 x 2 warps from sm_90), or 128 x 64 on
    2 x 2 warps when N is not a multiple of 128 (both split every type's bytes); the
    256 x 128 tiles split K where :func:`prefill_split` says so."""
    from lowvm.kernels.quant_gemm_prefill import prefill_schedule_for, threads_fit

    s = prefill_schedule_for(arch)
    if n % s.bn or not threads_fit(as_dtype(wtype), s):
        s = GemmSchedule(bm=128, bn=WEIGHT_BN, bk=bk, warps_m=2, warps_n=2, split=1,
                         stages=s.stages, prefetch=1)
    split = max(1, prefill_split(m, n, k, bk)) if s.bm == 256 else 1
    return GemmSchedule(s.bm, s.bn, bk, s.warps_m, s.warps_n, split, s.stages, s.prefetch)


_PREFILL_PLANS: dict[tuple, tuple[Any, Any, int]] = {}


def _device_arch(device: Any) -> str:
    """``sm_XY`` of a CUDA device (what ``lowvm.compile`` builds for)."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def _plan_key(m: int, weight: QuantWeight, bf16: bool, zero_point: bool,
              schedule: GemmSchedule | None) -> tuple:
    """What a compiled plan depends on (the planners' cache key)."""
    return (m, weight.n, weight.k, weight.bk, weight.wtype, weight.group, bf16, zero_point,
            schedule)


def _prefill_plan(m: int, weight: QuantWeight, bf16: bool, zero_point: bool,
                  schedule: GemmSchedule | None) -> tuple[Any, Any, int]:
    key = _plan_key(m, weight, bf16, zero_point, schedule)
    plan = _PREFILL_PLANS.get(key)
    if plan is None:
        from lowvm.kernels.quant_gemm_prefill import (
            quant_gemm_prefill,
            quant_gemm_prefill_bf16,
            threads_fit,
        )

        n, k = weight.n, weight.k
        s = schedule or choose_prefill_schedule(m, n, k, weight.bk, weight.wtype,
                                                _device_arch(weight.packed.device))
        extra = {f: getattr(s, f) for f in ("x_steps", "l2_ahead", "k_slice", "x_whole",
                                            "x_rows", "swap_ab", "wgmma") if getattr(s, f)}
        if extra:
            raise LowvmError(f"prefill schedule {s}: {extra} are options of quant_gemm's "
                             "decode body or the wgmma kernel; quant_gemm_prefill takes none "
                             "of them")
        if s.bk != weight.bk or s.bn % WEIGHT_BN or n % s.bn:
            raise LowvmError(f"prefill schedule {s} does not fit the weight (bk={weight.bk}, "
                             f"N = {n}; bn must be a multiple of {WEIGHT_BN} dividing N)")
        if (k // s.bk) % (s.split * s.prefetch):
            raise LowvmError(f"prefill schedule {s}: K / bk = {k // s.bk} steps must be a "
                             f"multiple of split x prefetch = {s.split * s.prefetch}")
        if not threads_fit(weight.wtype, s):
            raise LowvmError(f"prefill schedule {s}: its {s.warps_m * s.warps_n * 32} threads "
                             f"cannot split the {weight.wtype.name} weight tile evenly; use "
                             f"one thread per 64 x 4 weight columns ({s.bn // WEIGHT_BN * 128})")
        gemm = _compiled(quant_gemm_prefill_bf16 if bf16 else quant_gemm_prefill,
                         wtype=weight.wtype, group=weight.group, zero_point=zero_point,
                         **s.constants())
        plan = _PREFILL_PLANS[key] = (gemm, _finisher(s, bf16), s.bm if s.split > 1 else 0)
    return plan


@functools.lru_cache(maxsize=4096)  # asked on every quant_linear call from WGMMA_MIN_M
def choose_wgmma_schedule(m: int, n: int, k: int, bk: int, wtype: DType | str
                          ) -> GemmSchedule | None:
    """A :func:`~lowvm.kernels.quant_gemm_wgmma.quant_gemm_wgmma` schedule (``warps_m`` =
    4 x warpgroups, ``warps_n`` = 1), or None where the kernel does not apply (K tiles
    other than 64 or 128, a type whose tile the threads cannot split).

    128 weight rows on two warpgroups (64 on one where N is not a multiple of 128) by
    ``bm`` rows of x: 32 up to M = 32, 64 up to 64, 128 up to 128, else 256 unless that
    leaves fewer than ``WGMMA_MIN_BLOCKS`` blocks (then 128). K is split 2, 4 or 8 ways:
    tiles of 128 or 256 rows while the grid is under ``WGMMA_MIN_BLOCKS`` blocks, tiles of
    32 or 64 rows (whose split-K sums are cheap) as far as two blocks per SM, each block
    keeping >= 16 K steps. Tiles of 256 rows prefetch one K step of weights (x: 3 stages
    of 64 KB), smaller ones two.

    Below ``WGMMA_MIN_M`` (decode sizes; ``quant_linear`` runs it where :func:`runs_wgmma`
    says so, ``wgmma_quant_linear`` and the tuner at any such M): 16 rows of x by 64
    weight rows on one warpgroup, K split 4 ways, prefetch 2 (less where K's steps do not
    divide).

    Narrow tiles (:func:`_narrow_wgmma`) instead where 128-row weight tiles would leave
    the GPU under one wave at M > 32 and K <= ``WGMMA_NARROW_MAX_K``: 64 weight rows on one
    warpgroup by 64 rows of x, 2 x stages, no split (twice the blocks with half the
    weights each, and no split-K sums).

    Fitted to the eighth session's H100 sweeps (NOTES.md): e.g. M = 256 on 4096 x 6144
    (24 blocks of 256 rows) 36.5 us with 128 rows against 63.6, 34.1 with narrow tiles;
    4096 x 4096 44.7 -> 25.2 narrow (the tuner's find); M = 64 on 28672 x 8192 90.9 us at
    split 4 against 117.0 at split 2.
    """
    from lowvm.kernels.quant_gemm_prefill import threads_fit
    from lowvm.kernels.quant_gemm_wgmma import WGMMA_SCHEDULE

    if bk not in (64, 128):
        return None
    base = WGMMA_SCHEDULE
    steps = k // bk
    if m < WGMMA_MIN_M:  # decode sizes (runs_wgmma: large K and N only)
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
    if bm == 256 and math.ceil(m / 256) * (n // bn) < WGMMA_MIN_BLOCKS:
        bm = 128
    blocks = math.ceil(m / bm) * (n // bn)
    if bm <= 64:
        def more(split: int) -> bool:
            return blocks * 2 * split <= 2 * NUM_SMS_DEFAULT and steps // (2 * split) >= 16
    else:
        def more(split: int) -> bool:
            return blocks * split < WGMMA_MIN_BLOCKS and steps // (2 * split) >= 8
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
    if m <= 32 or k > WGMMA_NARROW_MAX_K or n % WEIGHT_BN:
        return False
    return math.ceil(m / _wgmma_rows(m)) * (n // 128) < NUM_SMS_DEFAULT


def _wgmma_rows(m: int) -> int:
    """Rows of x per wgmma block tile at batch ``m``: 32, 64, 128, else 256."""
    return 32 if m <= 32 else 64 if m <= 64 else 128 if m <= 128 else 256


def runs_wgmma(m: int, weight: QuantWeight) -> bool:
    """Whether ``quant_linear`` runs :func:`quant_gemm_wgmma` at batch ``m`` on an sm_90
    GPU (``WGMMA_MIN_M``, or ``WGMMA_DECODE_MIN_M`` on weights with K and N of at least
    ``WGMMA_DECODE_MIN_DIM``; ``WGMMA_MID_M_MIN_WEIGHTS`` unless narrow tiles apply with
    K <= ``WGMMA_MID_M_NARROW_MAX_K``; a schedule that fits the weight)."""
    if m < WGMMA_MIN_M and not (m >= WGMMA_DECODE_MIN_M
                                and min(weight.n, weight.k) >= WGMMA_DECODE_MIN_DIM):
        return False
    if (32 < m <= 64 and weight.n * weight.k < WGMMA_MID_M_MIN_WEIGHTS
            and not (weight.k <= WGMMA_MID_M_NARROW_MAX_K
                     and _narrow_wgmma(m, weight.n, weight.k))):
        return False
    return choose_wgmma_schedule(m, weight.n, weight.k, weight.bk, weight.wtype) is not None


def is_sm90(device: Any) -> bool:
    """Whether ``device`` runs sm_90a code (H100/H200), asked of torch once per device."""
    if device not in _SM90:
        _SM90[device] = _device_arch(device) == "sm_90"
    return _SM90[device]


_SM90: dict[Any, bool] = {}


_WGMMA_PLANS: dict[tuple, tuple[Any, Any, int]] = {}


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


def _wgmma_plan(m: int, weight: QuantWeight, bf16: bool, zero_point: bool,
                schedule: GemmSchedule | None) -> tuple[Any, Any, int]:
    key = _plan_key(m, weight, bf16, zero_point, schedule)
    plan = _WGMMA_PLANS.get(key)
    if plan is None:
        from lowvm.kernels.quant_gemm_wgmma import quant_gemm_wgmma, quant_gemm_wgmma_bf16

        n, k = weight.n, weight.k
        s = (schedule or _tuned_wgmma(m, weight)
             or choose_wgmma_schedule(m, n, k, weight.bk, weight.wtype))
        if s is None:
            raise LowvmError(f"the wgmma GEMM needs K tiles of 64 or 128 (group >= 64); this "
                             f"weight has bk={weight.bk}")
        reason = wgmma_refusal(s, n, k, weight.bk, weight.wtype)
        if reason:
            raise LowvmError(f"wgmma schedule {s}: {reason}")
        gemm = _compiled(quant_gemm_wgmma_bf16 if bf16 else quant_gemm_wgmma,
                         wtype=weight.wtype, group=weight.group, zero_point=zero_point,
                         **s.wgmma_constants())
        plan = _WGMMA_PLANS[key] = (gemm, _finisher(s, bf16), s.bm if s.split > 1 else 0)
    return plan


def _tuned_wgmma(m: int, weight: QuantWeight) -> GemmSchedule | None:
    """The tuning cache's pick where it is a wgmma schedule (else None)."""
    s = tuned_schedule(m, weight)
    return s if s is not None and s.wgmma else None


def wgmma_quant_linear(x: Any, weight: QuantWeight, schedule: GemmSchedule | None = None
                       ) -> Any:
    """:func:`quant_linear` through :func:`~lowvm.kernels.quant_gemm_wgmma.quant_gemm_wgmma`
    (Hopper, sm_90a: weights dequantised into wgmma's register operand, x read by the
    tensor cores from shared memory), same weights."""
    return _run(_checked(x, weight), weight, schedule, _wgmma_plan)


def prefill_quant_linear(x: Any, weight: QuantWeight, schedule: GemmSchedule | None = None
                         ) -> Any:
    """:func:`quant_linear` through :func:`~lowvm.kernels.quant_gemm_prefill.quant_gemm_prefill`
    (each weight tile dequantised once per block; meant for M > 128), same weights."""
    return _run(_checked(x, weight), weight, schedule, _prefill_plan)


_DUMMIES: dict[Any, Any] = {}


def _dummy(device: Any, dtype: Any = None) -> Any:
    """A tiny buffer for pointer arguments a specialisation never reads."""
    import torch

    dtype = dtype or torch.float32
    if (device, dtype) not in _DUMMIES:
        _DUMMIES[device, dtype] = torch.zeros(4, dtype=dtype, device=device)
    return _DUMMIES[device, dtype]
