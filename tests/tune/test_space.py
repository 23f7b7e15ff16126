"""CPU tests of the library's schedule space, its validity checks, and what the static
model makes of x_whole, x_rows, prefetch, k_slice and split-K."""

from __future__ import annotations

import dataclasses

import pytest

import lowvm
from lowvm.driver import generate_cuda
from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.kernels.library import X_WHOLE_BYTES, choose_schedule
from lowvm.kernels.quant_gemm import quant_gemm
from lowvm.tune import (
    H100_SXM,
    Problem,
    TuneError,
    builtin_schedule,
    estimate,
    library_space,
    rank,
    runnable_reason,
)
from lowvm.tune.model import occupancy
from lowvm.tune.space import SHARED_LIMIT, format_bk, shared_bytes


def _build(s: GemmSchedule, group: int) -> None:
    """Trace and generate CUDA for ``s`` (CPU only): what quant_linear compiles."""
    generate_cuda(quant_gemm.build(wtype=lowvm.int4, group=group, schedule=s))


@pytest.mark.slow
@pytest.mark.parametrize("m, group, every", [(1, 128, 1), (4, 128, 1), (1, 64, 2),
                                             (32, 128, 4), (128, 128, 3)])
def test_every_schedule_of_the_space_builds(m, group, every):
    """The space holds only schedules quant_gemm accepts (static asserts, shared-memory
    limit, code generation); large spaces are sampled."""
    p = Problem(m, 256, 1024, 4, group)
    space = library_space(p)
    assert len(set(space)) == len(space) > 50
    for s in space[::every]:
        _build(s, group)


@pytest.mark.parametrize("m, n, k, group", [(1, 4096, 4096, 128), (1, 4096, 14336, 128),
                                            (1, 14336, 4096, 128), (4, 4096, 4096, 128),
                                            (16, 4096, 14336, 128), (32, 4096, 6144, 128),
                                            (64, 14336, 4096, 128), (128, 4096, 4096, 128),
                                            (1, 4096, 4096, 32), (1, 1024, 256, 256)])
def test_the_space_passes_the_librarys_checks_and_starts_at_its_choice(m, n, k, group):
    p = Problem(m, n, k, 4, group)
    bk = format_bk(p)
    space = library_space(p)
    assert space[0] == builtin_schedule(p) == choose_schedule(m, n, k, bk)
    for s in space:
        assert runnable_reason(s, m, n, k, bk) is None, s
        assert s.bk == bk and (k // bk) % (s.split * s.steps_per_copy) == 0
        assert shared_bytes(s) <= SHARED_LIMIT
        if s.x_whole:
            assert m <= 16 and s.x_whole == k // s.split and s.stages is None
            assert s.rows * s.x_whole * 2 <= X_WHOLE_BYTES or s == space[0]
        assert s.x_rows in (0, 1) and (s.x_rows == 0 or m == 1)
        assert s.k_slice == 0 or 16 < m <= 64 or s == space[0]


def test_the_space_varies_split_prefetch_stages_x_whole_and_k_slice():
    decode = library_space(Problem(1, 4096, 4096, 4, 128))   # 32 K steps
    assert {s.split for s in decode} == {1, 2, 4, 8, 16}
    assert {s.prefetch for s in decode} == {1, 2, 4}
    assert {s.stages for s in decode if not s.x_whole} == {None, 2, 3, 4}
    assert {s.x_rows for s in decode if s.x_whole} == {0, 1}
    assert {s.swap_ab for s in decode if s.x_rows == 1} == {True, False}
    assert not any(s.swap_ab for s in decode if s.x_rows != 1)
    assert any(s.weights_shared for s in decode) and {s.bn for s in decode} == {16, 32, 64}
    assert not any(s.k_slice for s in decode)
    assert {bool(s.x_whole) for s in library_space(Problem(4, 4096, 4096, 4, 128))} == {
        True, False}
    # 16 rows of x for K / split = 14336 / 8 columns are 56 KB: x_whole only at split 16
    wide = library_space(Problem(8, 4096, 14336, 4, 128))
    assert {s.split for s in wide if s.x_whole} == {16}
    mid = library_space(Problem(32, 4096, 4096, 4, 128))
    assert {(s.warps_m, s.k_slice) for s in mid} == {(1, 16), (1, 32), (2, 0), (2, 16),
                                                     (2, 32)}
    assert not any(s.x_whole or s.fused_split for s in mid)


def test_runnable_reason_rejects_what_quant_linear_rejects():
    """The cases test_quant_gemm checks quant_linear raises on (K = 256, bk = 128), and
    the compiler's shared-memory limit."""
    def why(**fields):
        return runnable_reason(GemmSchedule(**fields), 2, 128, 256, 128)

    assert why() is None
    assert "format" in why(bk=64)
    assert "steps per copy" in why(split=2, prefetch=4)
    assert "format" in why(bn=32, warps_n=2, stages=2, weights_shared=True)
    assert "format" in why(bn=32, warps_n=1)
    assert "x_whole" in runnable_reason(GemmSchedule(x_whole=512, x_rows=1), 1, 64, 1024,
                                        128)
    assert "l2_ahead" in runnable_reason(GemmSchedule(x_whole=256, x_rows=1, l2_ahead=1), 1,
                                         64, 256, 128)
    assert "shared memory" in why(bm=128, warps_m=4, stages=4, prefetch=2)


def test_problems_the_format_cannot_hold_are_named():
    with pytest.raises(TuneError, match="Problem.n=100"):
        library_space(Problem(1, 100, 1024, 4, 128))


# -- the static model on library schedules -------------------------------------------------

P1 = Problem(1, 4096, 4096, 4, 128)
WHOLE = GemmSchedule(split=8, prefetch=1, x_whole=512, x_rows=1)


def test_x_whole_ranks_above_the_same_schedule_streaming_x():
    for streamed in (dataclasses.replace(WHOLE, x_whole=0, x_rows=0),
                     dataclasses.replace(WHOLE, x_whole=0, x_rows=0, stages=2),
                     dataclasses.replace(WHOLE, x_whole=0, x_rows=0, stages=4)):
        whole, stream = estimate(WHOLE, P1, H100_SXM), estimate(streamed, P1, H100_SXM)
        assert whole.seconds < stream.seconds
        assert whole.latency < stream.latency and whole.l2 < stream.l2
        ranked = [s for s, _ in rank([streamed, WHOLE], P1, H100_SXM)]
        assert ranked == [WHOLE, streamed]


def test_x_whole_shared_memory_is_rows_times_columns():
    assert occupancy(WHOLE, P1, H100_SXM)[2] == 512 * 2              # one row
    sixteen = dataclasses.replace(WHOLE, x_rows=0)
    assert occupancy(sixteen, P1, H100_SXM)[2] == 16 * 512 * 2
    assert estimate(sixteen, P1, H100_SXM).l2 > estimate(WHOLE, P1, H100_SXM).l2


def test_prefetch_costs_registers_and_keeps_bytes_in_flight():
    p = Problem(1, 28672, 8192, 4, 128)     # 64 K steps per block unsplit
    base = GemmSchedule(x_whole=8192, x_rows=1)
    regs = [occupancy(dataclasses.replace(base, prefetch=d), p, H100_SXM)[1] for d in (1, 2, 4)]
    assert regs == sorted(regs) and regs[0] < regs[-1]
    mem = [estimate(dataclasses.replace(base, prefetch=d), p, H100_SXM).memory
           for d in (1, 2, 4)]
    assert mem[0] > mem[2]


def test_k_slice_lets_one_m_warp_hold_64_rows():
    p = Problem(64, 4096, 6144, 4, 128)
    one = GemmSchedule(bm=64, warps_m=1, stages=3, split=2, fused_split=False)
    regs = {ks: occupancy(dataclasses.replace(one, k_slice=ks), p, H100_SXM)[1]
            for ks in (0, 32, 16)}
    assert regs[0] > regs[32] > regs[16]
    two = dataclasses.replace(one, warps_m=2)   # converts every weight twice
    assert (estimate(two, p, H100_SXM).alu
            > estimate(dataclasses.replace(one, k_slice=16), p, H100_SXM).alu)


def test_split_k_adds_partial_sum_traffic_and_the_unfused_epilogue_costs_more():
    s = dataclasses.replace(WHOLE, x_whole=4096, split=1)
    costs = [estimate(dataclasses.replace(s, split=k, x_whole=4096 // k), P1,
                      H100_SXM).split_k for k in (1, 2, 4, 8)]
    assert costs[0] == 0 and costs[1:] == sorted(costs[1:]) and costs[1] > 0
    fused = estimate(dataclasses.replace(s, split=4, x_whole=1024), P1, H100_SXM)
    unfused = estimate(dataclasses.replace(s, split=4, x_whole=1024, fused_split=False), P1,
                       H100_SXM)
    assert unfused.split_k > fused.split_k


def test_the_model_ranks_the_builtin_choice_and_refuses_what_does_not_run():
    space = library_space(P1)
    ranked = rank(space, P1, H100_SXM)
    assert len(ranked) == len(space) and space[0] in [s for s, _ in ranked]
    assert not estimate(GemmSchedule(bk=64), P1, H100_SXM).fits     # not the format
    with pytest.raises(TuneError, match="schedule="):
        estimate("16x64", P1, H100_SXM)


def test_wgmma_runs_where_quant_linear_runs_the_wgmma_kernel():
    """wgmma_runs: the M (and weights) where untuned quant_linear runs the wgmma kernel
    on sm_90, so that the tuner's built-in choice and space are its schedules."""
    from lowvm.tune import Problem
    from lowvm.tune.space import wgmma_runs

    big = dict(n=28672, k=4096, bits=4, group=128)
    assert [wgmma_runs(Problem(m=m, **big), sm90=True) for m in (16, 17, 64, 4096)] == [
        False, True, True, True]
    assert not wgmma_runs(Problem(m=64, n=4096, k=14336, bits=4, group=128), sm90=True)
    assert not wgmma_runs(Problem(m=4096, **big), sm90=False)
    assert not wgmma_runs(Problem(m=256, n=4096, k=4096, bits=4, group=32), sm90=True)


def test_wgmma_space_varies_the_builtin_choice(monkeypatch):
    """Where quant_linear runs the wgmma kernel, the built-in choice is
    choose_wgmma_schedule's and the space its variants, each one the kernel accepts."""
    import lowvm
    import lowvm.tune.space as space
    from lowvm.kernels.library import choose_wgmma_schedule, wgmma_refusal
    from lowvm.tune import Problem
    from lowvm.tune.cache import schedule_from_entry, schedule_to_json

    monkeypatch.setattr(space, "wgmma_runs", lambda problem, sm90=None: True)
    p = Problem(m=256, n=6144, k=4096, bits=4, group=128)
    base = space.builtin_schedule(p)
    assert base == choose_wgmma_schedule(256, 6144, 4096, 128, lowvm.int4) and base.wgmma
    found = space.library_space(p)
    assert found[0] == base and len(found) == len(set(found)) > 20
    assert all(s.wgmma and wgmma_refusal(s, 6144, 4096, 128) is None for s in found)
    assert {s.bm for s in found} == {32, 64, 128, 256}
    assert space.runnable_reason(base, 256, 6144, 4096, 128) is None
    # the cache keeps the kind of kernel with every other field
    assert schedule_from_entry(schedule_to_json(base), 256) == base


def test_wgmma_refusal_names_the_value():
    from dataclasses import replace

    from lowvm.kernels.gemm_schedule import GemmSchedule
    from lowvm.kernels.library import wgmma_refusal

    ok = GemmSchedule(bm=128, bn=128, bk=128, warps_m=8, warps_n=1, split=2, stages=3,
                      prefetch=1, wgmma=True)
    assert wgmma_refusal(ok, 4096, 4096, 128) is None
    cases = [(dict(split=3), "split x prefetch"), (dict(bn=256), "N=4224"),
             (dict(bm=256, stages=4, prefetch=2), "shared memory"), (dict(bk=64), "bk=64")]
    for change, needle in cases:
        reason = wgmma_refusal(replace(ok, **change), 4224, 4096, 128)
        assert reason is not None and needle in reason, (change, reason)
    # a schedule not marked wgmma=True meets the kernel's field rules here
    unmarked = replace(ok, wgmma=False)
    assert wgmma_refusal(unmarked, 4096, 4096, 128) is None
    for change, needle in [(dict(bm=100), "bm=100"), (dict(warps_n=2), "warps_m=8"),
                           (dict(x_whole=512, stages=None), "x_whole=512")]:
        reason = wgmma_refusal(replace(unmarked, **change), 4096, 4096, 128)
        assert reason is not None and needle in reason, (change, reason)


def test_a_wgmma_schedule_is_not_a_quant_gemm_one():
    """plan_refusal (quant_gemm's planner, the tuner's check of non-wgmma schedules) names
    a wgmma schedule for what it is instead of running it through quant_gemm."""
    from lowvm.kernels.gemm_schedule import GemmSchedule
    from lowvm.kernels.library import plan_refusal

    s = GemmSchedule(bm=128, bn=128, bk=128, warps_m=8, warps_n=1, stages=3, wgmma=True)
    assert "wgmma schedule" in plan_refusal(s, 4096, 128)
