"""Where one captured decode step's time goes, kernel by kernel (torch.profiler/CUPTI).

Builds the serving example's Llama-3-8B-shaped model (random float16 weights), an int4
g128 copy (q/k/v and gate/up fused and, with ``--attention lowvm``, the default, lowvm's
decode attention, as the example serves it), captures each one's decode
step in a CUDA graph exactly as ``serving_examples/quantize_and_generate.py``'s loop mode
does, replays it ``--steps`` times under the profiler and sums the GPU time per kernel
category per step: lowvm GEMMs, cuBLAS GEMMs, attention, the rest (norms, rotary,
residuals, argmax: inductor/triton and torch kernels). The sum is the GPU's busy time;
the step's wall time (also printed) adds the gaps between kernels.
Usage: python benchmarks/profile_step.py --out profile_step.json [--skip lm_head]
[--attention sdpa] [--no-fp16] [--top 25]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import time
from collections import defaultdict

import torch

import lowvm

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "serving_examples" / \
    "quantize_and_generate.py"


def load_example():
    spec = importlib.util.spec_from_file_location("quantize_and_generate", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def category(name: str) -> str:
    """A kernel's category, from its name."""
    low = name.lower()
    if "lowvm_quant_gemm" in low or "lowvm_finish_split" in low:
        return "lowvm GEMM"
    if any(tag in low for tag in ("gemm", "gemv", "cutlass", "xmma", "nvjet", "splitkreduce")):
        return "cuBLAS GEMM"
    if "attention" in low or "flash" in low or "fmha" in low or "sdpa" in low:
        return "attention"
    return "other"


def profile(loop, steps: int, top_n: int) -> dict:
    """Per-step GPU µs by category and the top kernels, over ``steps`` replays."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    loop._prefill()
    loop._run_step()
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            loop._run_step()
        torch.cuda.synchronize()
    per_kernel: dict[str, list[float]] = defaultdict(list)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time_total > 0:
            per_kernel[ev.name].append(ev.device_time_total)
    by_cat: dict[str, float] = defaultdict(float)
    counts: dict[str, float] = defaultdict(float)
    for name, times in per_kernel.items():
        by_cat[category(name)] += sum(times) / steps
        counts[category(name)] += len(times) / steps
    top = sorted(((sum(t) / steps, len(t) / steps, n) for n, t in per_kernel.items()),
                 reverse=True)[:top_n]
    loop._prefill()
    start = time.perf_counter()
    for _ in range(steps):
        loop._run_step()
    torch.cuda.synchronize()
    wall_us = (time.perf_counter() - start) / steps * 1e6
    return dict(wall_us_per_step=wall_us, busy_us_per_step=sum(by_cat.values()),
                by_category_us=dict(by_cat), kernels_per_step=dict(counts),
                top_kernels=[dict(us=u, per_step=c, name=n[:120]) for u, c, n in top])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="profile_step.json")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip", default="lm_head", help="layers left float16 (comma list)")
    ap.add_argument("--attention", default="lowvm", choices=("lowvm", "sdpa"),
                    help="the int4 model's attention (lowvm.use_decode_attention or SDPA)")
    ap.add_argument("--no-fp16", action="store_true", help="profile the int4 model only")
    ap.add_argument("--top", type=int, default=25, help="kernels listed per model")
    args = ap.parse_args()
    if not 1 <= args.steps <= 120:
        ap.error(f"--steps must be in [1, 120] (the static cache's room); got {args.steps}")
    qg = load_example()
    ex = qg.parse_args(["--config", "llama3-8b"])
    dense, _ = qg.build_model(ex, "cuda")
    skip = tuple(s for s in args.skip.split(",") if s)
    quant, _ = qg.quantized_copy(dense, "int4", 128, skip)
    lowvm.fuse_projections(quant)
    if args.attention == "lowvm":
        lowvm.use_decode_attention(quant)
    ids = qg.prompts(1, 16, dense.config.vocab_size, "cuda", 0)
    results = {}
    models = [] if args.no_fp16 else [("float16", dense)]
    for name, model in (*models, (f"int4 g128 fused, {args.attention} attention", quant)):
        loop = qg.DecodeLoop(model, ids, args.steps + 8, compile_mode="default")
        loop.capture()
        results[name] = profile(loop, args.steps, args.top)
        loop.close()
        print(name, json.dumps(results[name]["by_category_us"]), flush=True)
    with open(args.out, "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"),
                       skip=list(skip), attention=args.attention, results=results), f,
                  indent=1)
    print("\n model             wall us  busy us  lowvm GEMM  cuBLAS GEMM  attention    other")
    for name, r in results.items():
        c = r["by_category_us"]
        print(f" {name[:16]:<16} {r['wall_us_per_step']:8.0f} {r['busy_us_per_step']:8.0f} "
              + " ".join(f"{c.get(k, 0):11.0f}" for k in ("lowvm GEMM", "cuBLAS GEMM",
                                                          "attention", "other")))
    for name, r in results.items():
        counts = {k: round(v) for k, v in r["kernels_per_step"].items()}
        print(f"\n {name}: kernels per step {json.dumps(counts)}")
        for t in r["top_kernels"]:
            print(f"  {t['us']:8.1f} us  x{t['per_step']:<5.1f} {t['name'][:90]}")


if __name__ == "__main__":
    main()
