"""GPU test: tune the existing quantized matmul over the schedules it accepts."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_tune_quant_matmul_with_cuda_events(tmp_path):
    import torch

    import lowvm
    from lowvm.bench import lowvm_entry
    from lowvm.kernels.quant_matmul import quant_matmul
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
        c = {key: v for key, v in s.constants().items() if key not in ("stages", "split_k")}
        kernel = lowvm.compile(quant_matmul, wtype=lowvm.int4, group=group, **c)

        def run():
            kernel(m, n, k, x, prep.packed, prep.scales, y)
        run()
        err = torch.linalg.vector_norm(y.double() - ref) / torch.linalg.vector_norm(ref)
        assert err < 3e-3, (s, err)   # a wrong schedule must not win
        return run

    # quant_matmul takes 2 threads per row of bn: 128 threads -> bn = 64.
    space = [Schedule(bm, 64, bk, 2, 2) for bm in (32, 64) for bk in (64, 128)]
    tuner = Autotuner(cuda_measure(build), current_gpu(),
                      cache=TuneCache(tmp_path / "tune.json"), top_k=2, progress=False)
    result = tuner.tune(Problem(m, n, k, 4, group), "int4", space=space, exhaustive=True)
    assert result.measured == 4 and not result.failures
    assert result.schedule in space and 0 < result.seconds < 0.1
    assert result.model_gap is not None and result.model_gap >= 0
    again = tuner.tune(Problem(m, n, k, 4, group), "int4")
    assert again.from_cache and again.schedule == result.schedule
