"""CPU tests of the tuning problem and the static model's sanity."""

from __future__ import annotations

import math

import pytest

from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.tune import H100_SXM, Problem, TuneError, estimate, library_space, rank
from lowvm.tune.model import occupancy


def _schedule(bm: int = 16, warps_m: int = 1, **fields) -> GemmSchedule:
    """A schedule quant_gemm runs on the library's format (64 columns on 4 warps, K tiles
    of 128)."""
    return GemmSchedule(bm=bm, bn=64, bk=128, warps_m=warps_m, warps_n=4, **fields)


def test_problem_validation_and_bytes():
    p = Problem(1, 28672, 4096, 4, 128)
    assert p.weight_bytes == 28672 * 4096 // 2 + 32 * 28672 * 2
    with pytest.raises(TuneError, match="group"):
        Problem(1, 64, 100, 4, 64)
    with pytest.raises(TuneError, match="m="):
        Problem(0, 64, 64, 4, 64)


# -- the static model -------------------------------------------------------------------

DECODE = _schedule(stages=3)
DEEP = _schedule(stages=2, prefetch=4)  # enough bytes in flight to stream at full rate
TALL = _schedule(128, 4, stages=3, fused_split=False)  # the M > 64 tiles


def test_more_bytes_take_longer():
    """On one grid (the same blocks) streaming at full rate, longer K and wider codes move
    more bytes and take longer."""
    base = estimate(DEEP, Problem(1, 8192, 4096, 4, 128), H100_SXM)
    for bigger in (Problem(1, 8192, 8192, 4, 128), Problem(1, 8192, 4096, 8, 128)):
        e = estimate(DEEP, bigger, H100_SXM)
        assert e.blocks == base.blocks and e.bytes_moved > base.bytes_moved
        assert e.memory > base.memory and e.seconds > base.seconds


def test_decode_time_is_near_the_bandwidth_floor_and_scales_with_bandwidth():
    p = Problem(1, 28672, 4096, 4, 128)
    e = estimate(DEEP, p, H100_SXM)
    floor = p.weight_bytes / (H100_SXM.hbm_tbps * 1e12)
    assert floor <= e.seconds < 3 * floor
    faster = estimate(DEEP, p, H100_SXM.with_(hbm_tbps=6.0))
    assert faster.memory < e.memory and faster.seconds < e.seconds
    # one K step in flight per block cannot cover the HBM latency: no gain from it
    shallow = (estimate(DECODE, p, H100_SXM), estimate(DECODE, p, H100_SXM.with_(hbm_tbps=6.0)))
    assert shallow[1].memory == shallow[0].memory > e.memory


def test_more_tokens_never_take_less_time():
    times = [estimate(TALL, Problem(m, 8192, 8192, 4, 128), H100_SXM).seconds
             for m in (1, 64, 256, 1024, 4096, 8192)]
    assert times == sorted(times)


def test_prefill_takes_at_least_its_flops_and_slower_tensor_cores_cost_time():
    p = Problem(4096, 28672, 4096, 4, 128)
    e = estimate(TALL, p, H100_SXM)
    flops = 2 * 4096 * 28672 * 4096
    assert e.seconds >= flops / (H100_SXM.tensor_tflops * 1e12)
    slow = estimate(TALL, p, H100_SXM.with_(tensor_tflops=100.0))
    assert slow.seconds > e.seconds


def test_split_k_costs_a_reduction_that_grows_with_the_split():
    p = Problem(16, 4096, 14336, 4, 128)
    costs = [estimate(_schedule(split=s, stages=3), p, H100_SXM).split_k
             for s in (1, 2, 4, 8)]
    assert costs[0] == 0 and costs[1:] == sorted(costs[1:]) and costs[1] > 0


def test_split_k_helps_when_few_blocks_run_long_k_loops():
    p = Problem(1, 4096, 28672, 4, 128)   # 14336x4096-like: long K, few N tiles
    one = estimate(_schedule(split=1, stages=3), p, H100_SXM)
    many = estimate(_schedule(split=16, stages=3), p, H100_SXM)
    assert one.blocks < H100_SXM.sms < many.blocks
    assert many.seconds < one.seconds / 4


def test_occupancy_limits_and_blocks_that_do_not_fit():
    p = Problem(4096, 4096, 4096, 4, 128)
    per_sm, regs, smem = occupancy(_schedule(64, 2, stages=2), p, H100_SXM)
    assert per_sm >= 2 and regs > 0 and smem > 0
    big_smem = _schedule(256, 4, stages=8)
    assert occupancy(big_smem, p, H100_SXM)[0] == 0
    assert math.isinf(estimate(big_smem, p, H100_SXM).seconds)
    deeper = [occupancy(_schedule(128, 4, stages=s), p, H100_SXM)
              for s in (2, 4, 6)]
    assert [d[2] for d in deeper] == sorted(d[2] for d in deeper)   # smem grows with stages
    assert deeper[0][0] >= deeper[-1][0]                              # occupancy cannot rise


def test_waves_over_132_sms():
    p = Problem(128, 64 * 132, 1024, 4, 128)
    one_wave = estimate(TALL, p, H100_SXM.with_(max_blocks_per_sm=1))
    assert one_wave.blocks == 132 and one_wave.waves == 1
    p2 = Problem(128, 64 * 133, 1024, 4, 128)
    two = estimate(TALL, p2, H100_SXM.with_(max_blocks_per_sm=1))
    assert two.waves == 2 and two.tensor > one_wave.tensor


def test_rank_orders_by_prediction_and_drops_what_does_not_fit():
    p = Problem(1, 4096, 2048, 4, 128)
    space = library_space(p)
    unrunnable = [_schedule(split=32), GemmSchedule(bk=64)]
    ranked = rank(space + unrunnable, p, H100_SXM)
    assert [s for s, _ in ranked if s in unrunnable] == []  # 16 steps; not the format
    assert len(ranked) == len(space) > 10
    secs = [e.seconds for _, e in ranked]
    assert secs == sorted(secs) and all(math.isfinite(t) for t in secs)
    with pytest.raises(TuneError, match="schedule="):
        estimate("16x64", p, H100_SXM)
