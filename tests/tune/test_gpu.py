"""GPU test: tune the library's quantized GEMM at decode over its own schedule space, and
check the tuned pick is no slower than the built-in choice it would replace."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _tuning_set_up(tmp_path, monkeypatch, m: int, seed: int):
    """(weight, problem, built-in schedule, measure, cache) for an int4 g128 4096 x 4096
    weight at batch ``m``; quant_linear without a schedule (the reference) reads the
    test's own cache, not a stale user one."""
    import numpy as np

    from lowvm.kernels import library
    from lowvm.tune import Problem, TuneCache, builtin_schedule
    from lowvm.tune.measure import cuda_measure, quant_linear_build

    monkeypatch.setenv("LOWVM_TUNE_CACHE", str(tmp_path / "tune.json"))
    n, k, group = 4096, 4096, 128
    codes, scales = library.quantize_to_codes(
        np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32), "int4", group)
    weight = library.prepare_weight(codes, scales, "int4", group, device="cuda")
    problem = Problem(m, n, k, 4, group)
    measure = cuda_measure(quant_linear_build(weight, m))   # checks each output first
    return weight, problem, builtin_schedule(problem), measure, TuneCache(tmp_path / "tune.json")


def test_tuned_decode_pick_is_no_slower_than_the_builtin_choice(tmp_path, monkeypatch):
    from lowvm.tune import Autotuner, lookup
    from lowvm.tune.gpu import current_gpu

    m = 1
    weight, problem, builtin, measure, cache = _tuning_set_up(tmp_path, monkeypatch, m, 5)
    tuner = Autotuner(measure, current_gpu(), cache=cache, top_k=6, progress=False)

    result = tuner.tune(problem, "int4")
    print(result.summary())
    assert result.builtin == builtin and result.measured in (6, 7)
    assert str(builtin) not in result.failures, result.failures
    assert len(result.failures) < result.measured, result.failures
    assert 0 < result.seconds <= result.builtin_seconds < 1e-3

    # re-measured independently, interleaved, best of three rounds each
    pick_t, base_t = [], []
    for _ in range(3):
        pick_t.append(measure(result.schedule))
        base_t.append(measure(builtin))
    print(f"re-measured: pick {min(pick_t) * 1e6:.2f} us, built-in {min(base_t) * 1e6:.2f} us")
    assert min(pick_t) <= 1.05 * min(base_t), (result.schedule, pick_t, base_t)

    # the cache gives quant_linear exactly the measured schedule, every field
    assert lookup.tuned_schedule(m, weight, cache) == result.schedule
    again = tuner.tune(problem, "int4")
    assert again.from_cache and again.schedule == result.schedule


def test_tuned_wgmma_pick_is_used_by_quant_linear(tmp_path, monkeypatch):
    """On sm_90 at M = 256 the tuner measures wgmma schedules against the built-in
    wgmma choice, and quant_linear then runs the cached pick (results still correct)."""
    import torch

    from lowvm.kernels import dispatch, library
    from lowvm.tune import Autotuner, lookup
    from lowvm.tune.gpu import current_gpu

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernel needs sm_90a (H100/H200)")
    m, k = 256, 4096
    weight, problem, builtin, measure, cache = _tuning_set_up(tmp_path, monkeypatch, m, 6)
    assert builtin.wgmma
    result = Autotuner(measure, current_gpu(), cache=cache, top_k=3,
                       progress=False).tune(problem, "int4")
    print(result.summary())
    assert result.builtin == builtin and result.schedule.wgmma
    assert len(result.failures) < result.measured, result.failures
    assert lookup.tuned_schedule(m, weight, cache) == result.schedule
    dispatch._PLANS.clear()
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    y = library.quant_linear(x, weight)
    (key, (gemm, _, _)), = [(key, p) for key, p in dispatch._PLANS.items()
                            if key[0] == dispatch.WGMMA]
    consts, pick = dict(gemm.program.constants), result.schedule
    assert key[-1] is None  # no schedule given: the plan took the cached pick
    assert (consts["bm"], consts["bn"], consts["split"], consts["stages"],
            consts["prefetch"]) == (pick.bm, pick.bn, pick.split, pick.stages, pick.prefetch)
    ref = library.quant_linear(x, weight, builtin)
    assert float((y.float() - ref.float()).norm() / ref.float().norm()) < 2e-3
