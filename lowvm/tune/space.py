"""The schedules the library can run for one problem: its built-in choice and variants.

Most tilings of a GEMM cannot read the library's repacked weights (the format fixes
``bk`` and a 64-wide N tile read by 4 warps, or 1-2 of those warps' rows), and a generic
tiling has no name for what makes the library's decode kernel fast (x held whole in
shared memory, register prefetch depth, K slices). So the space searched for the library
starts at :func:`~lowvm.kernels.schedules.choose_schedule`'s choice and varies what
``quant_gemm`` takes, keeping only schedules that pass the checks the library applies
before it compiles one (:func:`runnable_reason`: ``schedules.plan_refusal``,
``quant_gemm``'s static asserts and the compiler's shared-memory limit), so every
candidate measured is one ``quant_linear`` would accept.
"""

from __future__ import annotations

import itertools

from lowvm.dtypes import dtype as as_dtype
from lowvm.kernels.dispatch import is_sm90
from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.kernels.schedules import (
    NUM_SMS_DEFAULT,
    X_WHOLE_BYTES,
    choose_schedule,
    choose_wgmma_schedule,
    plan_refusal,
    runs_wgmma,
    wgmma_refusal,
)
from lowvm.kernels.weights import WEIGHT_BN, WEIGHT_WARPS_N, weight_bk
from lowvm.tune.errors import TuneError
from lowvm.tune.problem import Problem

__all__ = ["SPLITS", "PREFETCHES", "STAGES", "K_SLICES", "SHARED_LIMIT", "format_bk",
           "builtin_schedule", "runnable_reason", "shared_bytes", "library_space",
           "wgmma_runs", "WGMMA_BMS"]

#: split-K factors tried (each needs K / bk steps divisible by split x steps per copy)
SPLITS = (1, 2, 4, 8, 16)
#: K steps of weights held in flight in registers
PREFETCHES = (1, 2, 4)
#: pipeline depths of streamed x (None: one buffer, copied and waited for in place)
STAGES: tuple[int | None, ...] = (None, 2, 3, 4)
#: K slices of the step's MMAs tried at 16 < M <= 64 (0: the whole step)
K_SLICES = (0, 16, 32)


def format_bk(problem: Problem) -> int:
    """The K tile of the weight format ``prepare_weight`` makes for ``problem``'s group
    (what every runnable schedule's ``bk`` must be)."""
    return weight_bk(problem.group, problem.k)


def _check_problem(problem: Problem) -> None:
    if problem.n % WEIGHT_BN:
        raise TuneError(f"Problem.n={problem.n}: the library's weight format needs N to be a "
                        f"multiple of {WEIGHT_BN}")
    bk = format_bk(problem)
    if problem.k % bk or problem.group % bk:
        raise TuneError(f"Problem: K={problem.k} and group={problem.group} must be multiples "
                        f"of the format's K tile {bk}")


def wgmma_runs(problem: Problem, sm90: bool | None = None) -> bool:
    """Whether untuned ``quant_linear`` runs the wgmma kernel for ``problem`` (on sm_90:
    ``sm90`` None asks torch about the current device): then the built-in choice and the
    space are wgmma schedules."""
    from types import SimpleNamespace

    if problem.bits > 8:
        return False
    weight = SimpleNamespace(n=problem.n, k=problem.k, bk=format_bk(problem),
                             wtype=_wtype(problem))
    if not runs_wgmma(problem.m, weight):
        return False
    if sm90 is None:
        import torch

        sm90 = torch.cuda.is_available() and is_sm90(torch.cuda.current_device())
    return bool(sm90)


def _wtype(problem: Problem):
    """A weight type of the problem's width (the tiling depends on the width alone)."""
    return as_dtype(f"int{problem.bits}")


def builtin_schedule(problem: Problem, sm90: bool | None = None) -> GemmSchedule:
    """What ``quant_linear`` runs for ``problem`` without a tuned entry: the wgmma kernel's
    ``choose_wgmma_schedule`` where it runs it (:func:`wgmma_runs`), else ``quant_gemm``'s
    ``choose_schedule`` with the library's SM count (``_plan`` passes none), so the tuner
    compares against exactly the schedule it would replace."""
    _check_problem(problem)
    if wgmma_runs(problem, sm90):
        s = choose_wgmma_schedule(problem.m, problem.n, problem.k, format_bk(problem),
                                  _wtype(problem))
        if s is not None:
            return s
    return choose_schedule(problem.m, problem.n, problem.k, format_bk(problem),
                           NUM_SMS_DEFAULT)


def runnable_reason(s: GemmSchedule, m: int, n: int, k: int, bk: int) -> str | None:
    """Why ``quant_linear`` (``schedules.plan_refusal`` and ``quant_gemm``'s static asserts) would
    refuse ``s`` for ``x [m, k]`` and a weight ``[n, k]`` of format K tile ``bk``; None
    when it runs. Checked here so that neither the tuner nor a cached entry ever hands
    the library a schedule it raises on (a ``GemmSchedule`` checks its own fields when it
    is made)."""
    if s.wgmma:
        return wgmma_refusal(s, n, k, bk)
    refusal = plan_refusal(s, k, bk)
    if refusal:
        return refusal
    if n % s.bn or n % WEIGHT_BN:
        return f"bn={s.bn} does not tile N={n}"
    if s.bm % (16 * s.warps_m):
        return f"bm={s.bm} is not a multiple of 16 x warps_m={s.warps_m}"
    if k % s.bk:
        return f"bk={s.bk} does not divide K={k}"
    if s.x_whole and s.l2_ahead:  # quant_gemm runs it; l2_ahead measured slower
        return f"x_whole with l2_ahead={s.l2_ahead}: the tuner leaves the pair out"
    if shared_bytes(s) > SHARED_LIMIT:
        return (f"needs {shared_bytes(s)} bytes of shared memory per block, over the "
                f"{SHARED_LIMIT} the compiler accepts")
    return None


#: shared memory a block may use (sm_90's 227 KB; the compiler refuses more)
SHARED_LIMIT = 227 * 1024


#: x tile rows the wgmma space tries (wgmma's N)
WGMMA_BMS = (32, 64, 128, 256)


def _wgmma_space(base: GemmSchedule, m: int, n: int, k: int, bk: int) -> list[GemmSchedule]:
    """The wgmma kernel's variants of ``base``: x tiles of 32..256 rows (16 too at M <= 16;
    none much taller than M), 64- or 128-row weight tiles, split in :data:`SPLITS`, one or
    two K steps of weights prefetched, 2..4 x stages; each passing :func:`wgmma_refusal`."""
    out, seen = [base], {base}
    weight_tiles = ((128, 8), (64, 4)) if n % 128 == 0 else ((64, 4),)
    bms = ((16,) if m <= 16 else ()) + WGMMA_BMS  # 16-row x tiles at decode sizes
    for bm, (bn, warps), split, prefetch, stages in itertools.product(
            bms, weight_tiles, SPLITS, (1, 2), (2, 3, 4)):
        if bm > 2 * max(m, 32) or (k // bk) % split or (k // bk) // split < 2:
            continue
        s = GemmSchedule(bm, bn, bk, warps, 1, split, stages, prefetch, wgmma=True)
        if s not in seen and wgmma_refusal(s, n, k, bk) is None:
            seen.add(s)
            out.append(s)
    return out


def shared_bytes(s: GemmSchedule) -> int:
    """Shared memory ``quant_gemm`` allocates for ``s`` with 16-bit activations: x held
    whole (``rows x x_whole``), or ``stages`` (at least one) buffers of ``bm x bk x steps
    per copy``, plus with ``weights_shared`` each stage's weight tile (8-bit bound) and
    scales and zeros."""
    if s.x_whole:
        return s.rows * s.x_whole * 2
    depth = max(1, s.stages or 1)
    x = depth * s.bm * s.bk * s.steps_per_copy * 2
    return x + (depth * (s.bn * s.bk + 4 * s.bn) if s.weights_shared else 0)


def _x_whole_fits(rows: int, cols: int, act_bytes: int) -> bool:
    """The library's own bound on x held whole (``X_WHOLE_BYTES`` per block), which keeps
    several blocks per SM."""
    return rows * cols * act_bytes <= X_WHOLE_BYTES


def library_space(problem: Problem, builtin: GemmSchedule | None = None
                  ) -> list[GemmSchedule]:
    """Every schedule ``quant_linear`` can run for ``problem`` that varies the built-in
    choice along the axes that decide its speed; the built-in choice first.

    Varied: split in :data:`SPLITS` (each block keeping >= 1 K step), N tiles of the
    format's 64, 32 or 16 columns (1-4 of its warps), and by path:

    * decode (M <= 16): x held whole (``x_whole``, where it fits ``X_WHOLE_BYTES``; at
      M = 1 also one row, ``x_rows=1``, with x as the MMA's A or B operand, ``swap_ab``)
      or streamed (``stages`` in :data:`STAGES`, or weights staged in shared memory),
      ``prefetch`` in :data:`PREFETCHES`;
    * 16 < M <= 64: one M-warp with ``k_slice`` 16 or 32, or two with any of
      :data:`K_SLICES`; x streamed; split sums finished by a second kernel like the
      built-in choice;
    * M > 64 (``quant_gemm``, which ``quant_linear`` runs when the prefill kernel would
      have too few blocks): 128- or 64-row tiles, x streamed;
    * where ``quant_linear`` runs the wgmma kernel (:func:`wgmma_runs`, on sm_90), its
      variants instead (:func:`_wgmma_space`).

    Fields the built-in choice leaves at their defaults and that measured slower where
    tried (``x_steps``, ``l2_ahead``, ``min_blocks``) stay as it has them.
    """
    base = builtin if builtin is not None else builtin_schedule(problem)
    _check_problem(problem)
    m, n, k, bk = problem.m, problem.n, problem.k, format_bk(problem)
    if base.wgmma:
        return _wgmma_space(base, m, n, k, bk)
    steps = k // bk
    decode = m <= 16
    if decode:
        tiles = [(16, 1, 0)]
    elif m <= 64:
        tiles = [(64, 1, 16), (64, 1, 32)] + [(64, 2, ks) for ks in K_SLICES]
    else:
        tiles = [(128, 4, 0), (64, 2, 0)]
    out: list[GemmSchedule] = [base]
    seen = {base}

    def add(s: GemmSchedule) -> None:
        if s not in seen and runnable_reason(s, m, n, k, bk) is None:
            seen.add(s)
            out.append(s)

    for (bm, warps_m, k_slice), split, (bn, warps_n) in itertools.product(
            tiles, SPLITS, ((WEIGHT_BN, WEIGHT_WARPS_N), (32, 2), (16, 1))):
        if steps % split or (k_slice and bk % k_slice):  # slices deeper than the step
            continue
        block_steps = steps // split
        common = dict(bm=bm, bn=bn, bk=bk, warps_m=warps_m, warps_n=warps_n, split=split,
                      k_slice=k_slice, fused_split=decode, x_steps=0, l2_ahead=0,
                      min_blocks=1, weights_shared=False)
        for prefetch in PREFETCHES:
            if block_steps % prefetch:
                continue
            if decode:
                for rows in ((1, bm) if m == 1 else (bm,)):
                    if _x_whole_fits(rows, k // split, problem.act_bytes):
                        for swap in ((True, False) if rows == 1 else (False,)):
                            add(GemmSchedule(**common, stages=None, prefetch=prefetch,
                                             x_whole=k // split, x_rows=1 if rows == 1 else 0,
                                             swap_ab=swap))
            for stages in STAGES:
                if stages is None or block_steps // prefetch >= stages:
                    add(GemmSchedule(**common, stages=stages, prefetch=prefetch))
        if bn == WEIGHT_BN:
            for stages in STAGES[1:]:
                if block_steps >= stages:
                    add(GemmSchedule(**{**common, "weights_shared": True}, stages=stages,
                                     prefetch=1))
    return out

