"""GPU test: tune the library's quantized GEMM over schedules sharing one weight format."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_tune_quant_matmul_with_cuda_events(tmp_path):
    import torch

    from lowvm.bench import lowvm_entry
    from lowvm.kernels.library import quant_linear
    from lowvm.kernels.quant_gemm import GemmSchedule
    from lowvm.tune import Autotuner, Problem, Schedule, TuneCache
    from lowvm.tune.gpu import current_gpu
    from lowvm.tune.measure import cuda_measure

    m, n, k, group = 16, 512, 1024, 128
    w = (torch.randn(n, k, device="cuda") / 30).to(torch.float16)
    prep = lowvm_entry.prepare(w, "int4", group)
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    y = torch.empty(m, n, device="cuda", dtype=torch.float16)
    ref = x.double() @ prep.dequant.double().t()

    def build(s: Schedule):
        gs = GemmSchedule(s.bm, s.bn, s.bk, s.warps_m, s.warps_n, s.split_k, s.stages)

        def run():
            y.copy_(quant_linear(x, prep.weight, gs))
        run()
        err = torch.linalg.vector_norm(y.double() - ref) / torch.linalg.vector_norm(ref)
        assert err < 3e-3, (s, err)   # a wrong schedule must not win
        return run

    # the repacked format fixes bn = 64, bk = 128 and 4 warps along N
    space = [Schedule(bm, 64, 128, wm, 4, 2, split) for bm, wm in ((16, 1), (64, 2))
             for split in (1, 2)]
    tuner = Autotuner(cuda_measure(build), current_gpu(),
                      cache=TuneCache(tmp_path / "tune.json"), top_k=2, progress=False)
    result = tuner.tune(Problem(m, n, k, 4, group), "int4", space=space, exhaustive=True)
    assert result.measured == 4 and not result.failures
    assert result.schedule in space and 0 < result.seconds < 0.1
    assert result.model_gap is not None and result.model_gap >= 0
    again = tuner.tune(Problem(m, n, k, 4, group), "int4")
    assert again.from_cache and again.schedule == result.schedule
