"""How good the tuner's static model is: exhaustive tuning against its top-k, per problem.

For each problem (int4 g128 weights, float16 activations) the library's whole schedule
space is measured (``Autotuner.tune(exhaustive=True)``: DESIGN.md's method through
``lowvm.tune.measure``), which reports the model's top-1 against the measured best, the
best of its top-k, and where the best sat in its ranking; then a plain top-k tune on a
fresh cache is timed, as a user runs it. Every candidate's kernel is compiled first in a
process pool (the disk cache), so the exhaustive wall time is mostly measuring.
Usage: python benchmarks/tune_accuracy.py --out tune_accuracy.json
       [--problems MxKxN,...] [--top-k 8] [--workers 16]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

PROBLEMS = "1x4096x4096,1x4096x28672,1x14336x4096,16x4096x6144,16x8192x10240,64x4096x28672," \
           "256x4096x4096"


def _compile(job: tuple[bool, str, dict]) -> str:
    """Compile one candidate's kernel into the disk cache (a worker process; no GPU)."""
    from lowvm.driver import arch_for, generate_cuda
    from lowvm.dtypes import dtype
    from lowvm.kernels.quant_gemm import quant_gemm
    from lowvm.kernels.quant_gemm_wgmma import quant_gemm_wgmma
    from lowvm.runtime import cached_cubin

    wgmma, wtype, constants = job
    program = (quant_gemm_wgmma if wgmma else quant_gemm).build(wtype=dtype(wtype), **constants)
    cuda = generate_cuda(program)
    try:
        cached_cubin(cuda.source, arch_for(cuda, "sm_90"), "auto")
    except Exception as exc:  # the tuner records the failure when it measures
        return f"{type(exc).__name__}: {str(exc)[:120]}"
    return ""


def _job(s, wtype: str, group: int) -> tuple[bool, str, dict]:
    """What ``library._plan`` / ``_wgmma_plan`` compile for schedule ``s``."""
    constants = s.wgmma_constants() if s.wgmma else s.constants()
    return s.wgmma, wtype, dict(group=group, zero_point=False, **constants)


def main() -> None:
    import torch

    from lowvm.kernels import library
    from lowvm.tune import Autotuner, Problem, TuneCache, builtin_schedule
    from lowvm.tune.gpu import current_gpu
    from lowvm.tune.measure import cuda_measure, quant_linear_build
    from lowvm.tune.space import library_space

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tune_accuracy.json")
    ap.add_argument("--problems", default=PROBLEMS, help="comma list of MxKxN")
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    args = ap.parse_args()
    gpu, group, rows = current_gpu(), 128, []
    rng = np.random.default_rng(0)
    for spec in args.problems.split(","):
        m, k, n = (int(v) for v in spec.split("x"))
        problem = Problem(m, n, k, 4, group)
        builtin = builtin_schedule(problem)
        space = library_space(problem, builtin)
        t0 = time.perf_counter()
        with ProcessPoolExecutor(args.workers) as pool:
            errors = [e for e in pool.map(_compile, [_job(s, "int4", group) for s in space])
                      if e]
        compile_s = time.perf_counter() - t0
        codes, scales = library.quantize_to_codes(
            rng.standard_normal((n, k)).astype(np.float32), "int4", group)
        weight = library.prepare_weight(codes, scales, "int4", group, device="cuda")
        measure = cuda_measure(quant_linear_build(weight, m))
        with tempfile.TemporaryDirectory() as tmp:
            tuner = Autotuner(measure, gpu, cache=TuneCache(os.path.join(tmp, "a.json")),
                              top_k=args.top_k, progress=False)
            t0 = time.perf_counter()
            full = tuner.tune(problem, "int4", exhaustive=True)
            exhaustive_s = time.perf_counter() - t0
            quick_tuner = Autotuner(measure, gpu, cache=TuneCache(os.path.join(tmp, "b.json")),
                                    top_k=args.top_k, progress=False)
            t0 = time.perf_counter()
            quick = quick_tuner.tune(problem, "int4")
            topk_s = time.perf_counter() - t0
        print(full.summary(), flush=True)
        rows.append(dict(
            m=m, k=k, n=n, wgmma=builtin.wgmma, space=full.space_size, measured=full.measured,
            failures=len(full.failures), compile_errors=len(errors), compile_s=compile_s,
            exhaustive_s=exhaustive_s, topk_measured=quick.measured, topk_s=topk_s,
            best_us=full.seconds * 1e6, best=str(full.schedule),
            builtin_us=(full.builtin_seconds or 0) * 1e6,
            model_pick=str(full.model_pick), model_pick_us=(full.model_pick_seconds or 0) * 1e6,
            model_gap=full.model_gap, topk_gap=full.topk_gap,
            best_rank_in_model=full.best_rank_in_model,
            builtin_rank_in_model=full.builtin_rank_in_model,
            topk_pick=str(quick.schedule), topk_pick_us=quick.seconds * 1e6))
        del weight
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"),
                       top_k=args.top_k, group=group, dtype="int4", rows=rows), f, indent=1)
    print(f"\n{'M':>4} {'K':>6} {'N':>6} {'wgmma':>5} {'space':>5} {'fail':>4} {'best us':>8} "
          f"{'built-in':>8} {'model gap':>9} {'top-k gap':>9} {'best rank':>9} "
          f"{'top-k s':>7} {'exh. s':>7}")
    for r in rows:
        print(f"{r['m']:>4} {r['k']:>6} {r['n']:>6} {int(r['wgmma']):>5} {r['space']:>5} "
              f"{r['failures']:>4} {r['best_us']:8.1f} {r['builtin_us']:8.1f} "
              f"{100 * (r['model_gap'] or 0):8.1f}% {100 * (r['topk_gap'] or 0):8.1f}% "
              f"{r['best_rank_in_model'] or 0:>9} {r['topk_s']:7.1f} {r['exhaustive_s']:7.1f}")


if __name__ == "__main__":
    main()
