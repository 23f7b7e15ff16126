"""CPU tests of schedules, their spaces, and the static model's sanity."""

from __future__ import annotations

import math

import pytest

from lowvm.tune import (
    H100_SXM,
    PATHS,
    Problem,
    Schedule,
    TuneError,
    estimate,
    feasible,
    path_for_m,
    rank,
    schedule_space,
)
from lowvm.tune.model import occupancy

S = Schedule(64, 128, 64, 2, 2, stages=3, split_k=1)


def test_constants_round_trip_and_name_every_field():
    c = S.constants()
    assert c == {"bm": 64, "bn": 128, "bk": 64, "warps_m": 2, "warps_n": 2, "stages": 3,
                 "split_k": 1}
    assert Schedule.from_constants(c) == S
    assert S.threads == 128


@pytest.mark.parametrize("kwargs, needle", [
    (dict(bm=24, bn=64, bk=64, warps_m=1, warps_n=1), "bm=24"),
    (dict(bm=16, bn=64, bk=64, warps_m=2, warps_n=1), "warps_m=2"),
    (dict(bm=16, bn=12, bk=64, warps_m=1, warps_n=1), "bn=12"),
    (dict(bm=16, bn=64, bk=40, warps_m=1, warps_n=1), "bk=40"),
    (dict(bm=16, bn=64, bk=64, warps_m=1, warps_n=1, stages=0), "stages=0"),
    (dict(bm=512, bn=512, bk=64, warps_m=8, warps_n=8), "1024 threads"),
])
def test_bad_schedules_raise(kwargs, needle):
    with pytest.raises(TuneError, match=needle):
        Schedule(**kwargs)


def test_from_constants_rejects_unknown_or_missing_keys():
    with pytest.raises(TuneError, match="unknown"):
        Schedule.from_constants({**S.constants(), "swizzle": 1})
    with pytest.raises(TuneError, match="incomplete"):
        Schedule.from_constants({"bm": 16})


def test_paths_cover_every_m():
    assert [path_for_m(m) for m in (1, 16, 17, 256, 257, 4096)] == [
        "decode", "decode", "small", "small", "prefill", "prefill"]
    assert set(PATHS) == {"decode", "small", "prefill"}
    with pytest.raises(TuneError):
        path_for_m(0)


def test_spaces_are_distinct_and_fit_their_path():
    decode, prefill = schedule_space("decode"), schedule_space("prefill")
    assert len(set(decode)) == len(decode) > 100
    assert all(s.bm == 16 for s in decode)
    assert any(s.split_k > 1 for s in decode)
    assert all(s.split_k == 1 and s.bm >= 64 for s in prefill)
    with pytest.raises(TuneError, match="path="):
        schedule_space("turbo")


def test_feasibility_along_k():
    p = Problem(1, 4096, 4096, 4, 128)
    assert feasible(Schedule(16, 64, 64, 1, 1, split_k=4), p)
    assert not feasible(Schedule(16, 64, 64, 1, 1, split_k=128), p)        # 4096 / 8192
    assert not feasible(Schedule(16, 64, 96, 1, 1), Problem(1, 64, 96 * 4, 4, 128))


def test_problem_validation_and_bytes():
    p = Problem(1, 28672, 4096, 4, 128)
    assert p.weight_bytes == 28672 * 4096 // 2 + 32 * 28672 * 2
    with pytest.raises(TuneError, match="group"):
        Problem(1, 64, 100, 4, 64)
    with pytest.raises(TuneError, match="m="):
        Problem(0, 64, 64, 4, 64)


# -- the static model -------------------------------------------------------------------

DECODE = Schedule(16, 64, 128, 1, 2, stages=3)


def test_more_bytes_take_longer():
    base = estimate(DECODE, Problem(1, 8192, 4096, 4, 128), H100_SXM)
    for bigger in (Problem(1, 16384, 4096, 4, 128), Problem(1, 8192, 8192, 4, 128),
                   Problem(1, 8192, 4096, 8, 128), Problem(1, 8192, 4096, 4, 32)):
        e = estimate(DECODE, bigger, H100_SXM)
        assert e.bytes_moved > base.bytes_moved
        assert e.memory > base.memory and e.seconds > base.seconds


def test_decode_time_is_near_the_bandwidth_floor_and_scales_with_bandwidth():
    p = Problem(1, 28672, 4096, 4, 128)
    e = estimate(DECODE, p, H100_SXM)
    floor = p.weight_bytes / (H100_SXM.hbm_tbps * 1e12)
    assert floor <= e.seconds < 3 * floor
    faster = estimate(DECODE, p, H100_SXM.with_(hbm_tbps=6.0))
    assert faster.memory < e.memory and faster.seconds <= e.seconds


def test_more_tokens_never_take_less_time():
    times = [estimate(S, Problem(m, 8192, 8192, 4, 128), H100_SXM).seconds
             for m in (1, 64, 256, 1024, 4096, 8192)]
    assert times == sorted(times)


def test_prefill_is_compute_bound_and_slower_tensor_cores_cost_time():
    p = Problem(4096, 28672, 4096, 4, 128)
    e = estimate(Schedule(128, 128, 64, 2, 4, stages=3), p, H100_SXM)
    assert e.tensor >= e.memory
    flops = 2 * 4096 * 28672 * 4096
    assert e.seconds >= flops / (H100_SXM.tensor_tflops * 1e12)
    slow = estimate(Schedule(128, 128, 64, 2, 4, stages=3), p,
                    H100_SXM.with_(tensor_tflops=100.0))
    assert slow.seconds > e.seconds


def test_split_k_costs_a_reduction_that_grows_with_the_split():
    p = Problem(16, 4096, 14336, 4, 128)
    costs = [estimate(Schedule(16, 128, 128, 1, 4, split_k=s), p, H100_SXM).split_k
             for s in (1, 2, 4, 8)]
    assert costs[0] == 0 and costs[1:] == sorted(costs[1:]) and costs[1] > 0


def test_split_k_helps_when_few_blocks_run_long_k_loops():
    p = Problem(1, 4096, 28672, 4, 128)   # 14336x4096-like: long K, few N tiles
    one = estimate(Schedule(16, 256, 64, 1, 8, split_k=1), p, H100_SXM)
    many = estimate(Schedule(16, 256, 64, 1, 8, split_k=16), p, H100_SXM)
    assert one.blocks < H100_SXM.sms < many.blocks
    assert many.seconds < one.seconds / 4


def test_occupancy_limits_and_blocks_that_do_not_fit():
    p = Problem(4096, 4096, 4096, 4, 128)
    per_sm, regs, smem = occupancy(Schedule(64, 64, 64, 2, 2, stages=2), p, H100_SXM)
    assert per_sm >= 2 and regs > 0 and smem > 0
    big_smem = Schedule(256, 256, 256, 4, 4, stages=8)
    assert occupancy(big_smem, p, H100_SXM)[0] == 0
    assert math.isinf(estimate(big_smem, p, H100_SXM).seconds)
    deeper = [occupancy(Schedule(128, 128, 64, 2, 2, stages=s), p, H100_SXM)
              for s in (2, 4, 6)]
    assert [d[2] for d in deeper] == sorted(d[2] for d in deeper)   # smem grows with stages
    assert deeper[0][0] >= deeper[-1][0]                              # occupancy cannot rise


def test_waves_over_132_sms():
    p = Problem(128, 128 * 132, 1024, 4, 128)
    one_wave = estimate(Schedule(128, 128, 64, 2, 2), p, H100_SXM.with_(max_blocks_per_sm=1))
    assert one_wave.blocks == 132 and one_wave.waves == 1
    p2 = Problem(128, 128 * 133, 1024, 4, 128)
    two = estimate(Schedule(128, 128, 64, 2, 2), p2, H100_SXM.with_(max_blocks_per_sm=1))
    assert two.waves == 2 and two.tensor > one_wave.tensor


def test_rank_orders_by_prediction_and_drops_what_does_not_fit():
    p = Problem(1, 4096, 2048, 4, 128)
    space = schedule_space("decode")
    ranked = rank(space, p, H100_SXM)
    assert 0 < len(ranked) <= len(space)
    secs = [e.seconds for _, e in ranked]
    assert secs == sorted(secs) and all(math.isfinite(t) for t in secs)
    assert all(feasible(s, p) for s, _ in ranked)
    assert len(ranked) < len(space)  # split-k 16 with bk 256 does not tile K=2048
