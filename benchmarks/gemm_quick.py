"""Quick GEMM timings on the GPU while the full harness (python -m lowvm.bench) matures.

Method as DESIGN.md: CUDA events, warm-up, 512 MB L2 flush before each timed run,
median of 30; cuBLAS fp16 in the same process. Every lowvm result is first checked
against a float32 product of the dequantised weight (relative error printed).
Usage: python benchmarks/gemm_quick.py --out results.json
(``--prefill-kernel quant_gemm_prefill`` also times quant_gemm_prefill for M > 64, beside
quant_gemm; ``--prefill-schedules`` lists its schedules as bm:bn:warps_m:warps_n:stages[:split].)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np
import torch
from timing import median_us

from lowvm.dtypes import decode
from lowvm.dtypes import dtype as as_dtype
from lowvm.errors import LowvmError
from lowvm.kernels.gemm_schedule import GemmSchedule, with_fields
from lowvm.kernels.library import (
    choose_prefill_schedule,
    choose_schedule,
    choose_wgmma_schedule,
    overlapped_launches,
    prefill_quant_linear,
    prepare_weight,
    quant_linear,
    quantize_to_codes,
    wgmma_quant_linear,
)

SHAPES = [(4096, 28672), (4096, 6144), (14336, 4096), (8192, 10240), (28672, 8192)]


def parse_shape(spec: str) -> tuple[int, int]:
    """``--shapes`` item: an index into SHAPES, or ``KxN`` (e.g. 4096x1024)."""
    if "x" in spec:
        k, n = spec.split("x")
        return int(k), int(n)
    return SHAPES[int(spec)]


def timed(fn, flush, runs=30):
    """DESIGN.md's timing: the 512 MB ``flush`` written before each of ``runs`` calls."""
    return median_us(fn, flush.zero_, runs)


def graph_us(calls, replays: int = 20) -> float:
    """µs per call of ``calls`` captured back to back in one CUDA graph, replayed: how a
    decode step runs them (no launch gaps, no flush; each call should read its own weight
    copy so that together they overflow the L2 and every weight comes from HBM)."""
    for call in calls:  # compile, allocate split-K buffers
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    graph.reset()
    return start.elapsed_time(end) * 1e3 / (replays * len(calls))


def weight_copies(qw, wbytes: int, total: int = 256 * 2**20) -> list:
    """``qw`` and copies of it, ``total`` bytes together (at least 2): cold weights in a
    graph of back-to-back calls."""
    count = max(2, min(64, -(-total // wbytes)))
    return [qw] + [dataclasses.replace(qw, packed=qw.packed.clone(), scales=qw.scales.clone())
                   for _ in range(count - 1)]


def schedules_to_time(args, base: GemmSchedule, m: int,
                      streamed: GemmSchedule | None = None) -> list[GemmSchedule]:
    """The schedules the options ask for at batch ``m``, from the chosen one ``base``:
    ``--variants`` when given, else the sweeps of --splits/--prefetch/--stages/
    --weights-shared. ``streamed``: the choice without ``x_whole`` ('streamed' variants)."""
    if args.variants:
        return [parse_variant(spec, base, streamed) for spec in args.variants.split(",")]
    splits = sorted({1, 2, 4, 8, base.split}) if args.splits and m <= 16 else [base.split]
    depths = [int(v) for v in args.prefetch.split(",") if v] or [base.prefetch]
    stages = [int(v) or None for v in args.stages.split(",") if v] or [base.stages]
    variants = [(sp, d, st, False) for sp in splits for d in depths for st in stages]
    if "1" in args.weights_shared.split(",") and m <= 16:
        staged = [v for v in stages if v] or [4]
        variants = ([(sp, d, base.stages, False) for sp in splits for d in depths]
                    if "0" in args.weights_shared.split(",") else [])
        variants += [(sp, 1, st, True) for sp in splits for st in staged]
    return [dataclasses.replace(base, split=sp, prefetch=d, stages=st, weights_shared=sh,
                                min_blocks=1) for sp, d, st, sh in variants]


def parse_variant(spec: str, base: GemmSchedule, streamed: GemmSchedule | None = None
                  ) -> GemmSchedule:
    """One ``--variants`` item (see its help) as a schedule."""
    if spec == "base":
        return base
    if spec.startswith("streamed"):  # streamed, or streamed/field=value/...
        return with_fields(streamed or base, spec[len("streamed"):])
    if "=" in spec:  # field=value/field=value...: any GemmSchedule fields (stages 0: none)
        return with_fields(base, spec)
    sp, *rest = spec.split(":")
    depth, st, shared, mb, *more = (int(v) for v in rest)
    width = more[0] if more and more[0] else base.bn
    return dataclasses.replace(
        base, split={"0": base.split, "d": min(8, 2 * base.split)}.get(sp) or int(sp),
        prefetch=depth, stages=st or None, weights_shared=bool(shared), min_blocks=mb,
        bn=width, warps_n=width // 16 if width < 64 else base.warps_n,
        x_steps=more[1] if len(more) > 1 else 0, l2_ahead=more[2] if len(more) > 2 else 0)


def kernel_rows(kernel, run, scheds, x, qw, ref, flush, wbytes, tname):
    """Rows timing ``run(x, qw, s)`` for each schedule (a schedule the kernel refuses, e.g.
    over the shared memory limit, is skipped with the reason)."""
    m, k, n = x.shape[0], qw.k, qw.n
    rows = []
    for s in scheds:
        try:
            y = run(x, qw, s)
        except LowvmError as exc:
            print(f"skipped {s}: {str(exc).splitlines()[-1][:200]}", flush=True)
            continue
        err = float((y.float() - ref).norm() / ref.norm())
        us = timed(lambda s=s: run(x, qw, s), flush)
        rows.append(dict(kernel=kernel, dtype=tname, k=k, n=n, m=m, split=s.split,
                         prefetch=s.prefetch, stages=s.stages, bm=s.bm, bn=s.bn,
                         warps=f"{s.warps_m}x{s.warps_n}", x_whole=s.x_whole,
                         x_rows=s.x_rows, swap_ab=s.swap_ab, us=us, rel_err=err,
                         gbps=wbytes / us / 1e3, tflops=2 * m * n * k / us / 1e6,
                         floor_us=wbytes / 3.04e6))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def wgmma_rows(args, x, qw, ref, flush, wbytes, tname):
    """Rows timing quant_gemm_wgmma (the chosen schedule, or each of --wgmma-schedules:
    bm:bn:warpgroups:stages[:split[:prefetch]])."""
    m, k, n = x.shape[0], qw.k, qw.n
    scheds = [choose_wgmma_schedule(m, n, k, qw.bk, qw.wtype)]
    if args.wgmma_schedules:
        scheds = []
        for spec in args.wgmma_schedules.split(","):
            bm, bn, wg, st, *rest = (int(v) for v in spec.split(":"))
            split, pf = (rest + [1, 1])[:2]
            scheds.append(GemmSchedule(bm, bn, qw.bk, 4 * wg, 1, split, st or None, pf))
    return kernel_rows("wgmma", wgmma_quant_linear, scheds, x, qw, ref, flush, wbytes, tname)


def prefill_rows(args, x, qw, ref, flush, wbytes, tname):
    """Rows timing quant_gemm_prefill (the chosen schedule, or each of --prefill-schedules)."""
    m, k, n = x.shape[0], qw.k, qw.n
    scheds = [choose_prefill_schedule(m, n, k, qw.bk, qw.wtype)]
    if args.prefill_schedules:
        scheds = []
        for spec in args.prefill_schedules.split(","):
            bm, bn, wm, wn, st, *split = (int(v) for v in spec.split(":"))
            scheds.append(GemmSchedule(bm, bn, qw.bk, wm, wn, split[0] if split else 1,
                                       st or None, 1))
    return kernel_rows("prefill", prefill_quant_linear, scheds, x, qw, ref, flush, wbytes,
                       tname)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gemm_quick.json")
    ap.add_argument("--ms", default="1,16,64,256,4096")
    ap.add_argument("--types", default="int4")
    ap.add_argument("--shapes", default="all", help="all, or a comma list of SHAPES indices "
                    "and KxN shapes")
    ap.add_argument("--splits", action="store_true", help="also time every split for M<=16")
    ap.add_argument("--stages", default="", help="x pipeline stages to sweep ('1,2'; "
                    "default: the schedule's)")
    ap.add_argument("--weights-shared", default="", help="'0,1': also time M<=16 with "
                    "weights staged in shared memory (stages from --stages, default 4)")
    ap.add_argument("--prefetch", default="", help="prefetch depths to sweep (default: the "
                    "schedule's)")
    ap.add_argument("--variants", default="", help="schedules to time instead of the "
                    "sweeps above, comma separated: 'base' (the chosen one), 'streamed' (the "
                    "choice with x streamed, not x_whole; may be followed by /field=value) or "
                    "split:prefetch:"
                    "stages:weights_shared:min_blocks[:bn[:x_steps[:l2_ahead]]] (split 0: the "
                    "chosen one's, d: twice it, <= 8; stages 0: none; bn 16/32: narrow "
                    "blocks, 0: the chosen one's; x_steps: K steps of x per copy, 0: "
                    "prefetch's; l2_ahead: steps prefetched into the L2 beyond the registers), "
                    "or field=value/field=value/... of GemmSchedule (e.g. bm=64/warps_m=1/"
                    "k_slice=16)")
    ap.add_argument("--graph", action="store_true", help="time lowvm and cuBLAS inside a "
                    "CUDA graph of back-to-back calls over >= 256 MB of weight copies "
                    "(graph_us) instead of one launch after an L2 flush")
    ap.add_argument("--overlap", action="store_true", help="with --graph: capture lowvm's "
                    "GEMMs as overlapped launches (lowvm.overlapped_launches)")
    ap.add_argument("--prefill-kernel", default="quant_gemm",
                    choices=["quant_gemm", "quant_gemm_prefill"],
                    help="quant_gemm_prefill: also time it for M > 64")
    ap.add_argument("--wgmma", action="store_true", help="also time quant_gemm_wgmma "
                    "(sm_90a) for M > 16")
    ap.add_argument("--wgmma-schedules", default="", help="its schedules to sweep, "
                    "bm:bn:warpgroups:stages[:split[:prefetch]],... (default: the chosen one)")
    ap.add_argument("--prefill-schedules", default="", help="quant_gemm_prefill schedules "
                    "to sweep, bm:bn:warps_m:warps_n:stages,... (default: the chosen one)")
    args = ap.parse_args()
    flush = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    rows = []
    shapes = SHAPES if args.shapes == "all" else [parse_shape(s) for s in args.shapes.split(",")]
    rng = np.random.default_rng(0)
    for k, n in shapes:
        w = rng.standard_normal((n, k), dtype=np.float32)
        wdev = torch.from_numpy(w).to("cuda", torch.float16)
        for tname in args.types.split(","):
            wt = as_dtype(tname)
            t0 = time.time()
            codes, scales = quantize_to_codes(w, wt, 128)
            qw = prepare_weight(codes, scales, wt, 128)
            deq = torch.from_numpy(decode(codes, wt).astype(np.float32)).cuda() * torch.from_numpy(
                np.repeat(scales.T.astype(np.float32), 128, 1)).cuda()
            wbytes = qw.packed.numel() + qw.scales.numel() * 2
            copies = weight_copies(qw, wbytes) if args.graph else [qw]
            print(f"prepared {tname} {k}x{n} in {time.time() - t0:.1f}s", flush=True)
            for m in [int(v) for v in args.ms.split(",")]:
                x = torch.randn(m, k, device="cuda", dtype=torch.float16)
                base = choose_schedule(m, n, k, qw.bk)
                streamed = choose_schedule(m, n, k, qw.bk, x_whole=False)
                ref = (x.float() @ deq.T)
                for s in schedules_to_time(args, base, m, streamed):
                    if (k // s.bk) % (s.split * s.steps_per_copy):
                        print(f"skipped {s}: K / bk = {k // s.bk} steps is not a multiple "
                              f"of split x steps per copy = {s.split * s.steps_per_copy}",
                              flush=True)
                        continue
                    y = quant_linear(x, qw, s)
                    err = float((y.float() - ref).norm() / ref.norm())
                    if args.graph:
                        with overlapped_launches(args.overlap):
                            us = graph_us([lambda s=s, x=x, c=c: quant_linear(x, c, s)
                                           for c in copies])
                    else:
                        us = timed(lambda s=s, x=x, qw=qw: quant_linear(x, qw, s), flush)
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(200):  # host time per call (the GPU runs behind)
                        quant_linear(x, qw, s)
                    host_us = (time.perf_counter() - t0) / 200 * 1e6
                    torch.cuda.synchronize()
                    rows.append(dict(kernel="lowvm", dtype=tname, k=k, n=n, m=m, split=s.split,
                                     prefetch=s.prefetch, stages=s.stages,
                                     weights_shared=s.weights_shared,
                                     min_blocks=s.min_blocks, bn=s.bn, x_steps=s.x_steps,
                                     l2_ahead=s.l2_ahead, k_slice=s.k_slice,
                                     x_whole=s.x_whole, x_rows=s.x_rows,
                                     swap_ab=s.swap_ab, warps_m=s.warps_m,
                                     bm=s.bm, us=us, rel_err=err, graph=args.graph,
                                     overlap=args.overlap,
                                     host_us=host_us,
                                     gbps=wbytes / us / 1e3, tflops=2 * m * n * k / us / 1e6,
                                     floor_us=wbytes / 3.04e6))
                    print(json.dumps(rows[-1]), flush=True)
                if m > 64 and args.prefill_kernel == "quant_gemm_prefill":
                    rows += prefill_rows(args, x, qw, ref, flush, wbytes, tname)
                if args.wgmma:
                    rows += wgmma_rows(args, x, qw, ref, flush, wbytes, tname)
                if tname == args.types.split(",")[0]:
                    if args.graph:
                        dense = [wdev] + [wdev.clone() for _ in
                                          range(max(1, min(15, (256 << 20) // wdev.nbytes)))]
                        us = graph_us([lambda x=x, wd=wd: x @ wd.T for wd in dense])
                        del dense
                    else:
                        us = timed(lambda x=x, wd=wdev: x @ wd.T, flush)
                    rows.append(dict(kernel="cublas_fp16", dtype="float16", k=k, n=n, m=m,
                                     us=us, tflops=2 * m * n * k / us / 1e6,
                                     gbps=2 * n * k / us / 1e3))
                    print(json.dumps(rows[-1]), flush=True)
    with open(args.out, "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"),
                       torch=torch.__version__, rows=rows), f, indent=1)
    print("\n kernel       dtype   K      N     M    split pf  st  sh mb bn xw   sw    us      "
          "GB/s   TFLOP/s  floor  err")
    for r in rows:
        print(f" {r['kernel']:<12} {r['dtype']:<7} {r['k']:<6} {r['n']:<6} {r['m']:<5} "
              f"{r.get('split', '-')!s:<5} {r.get('prefetch', '-')!s:<3} "
              f"{r.get('stages', '-')!s:<3} {int(bool(r.get('weights_shared')))} "
              f"{r.get('min_blocks', '-')!s:<2} {r.get('bn', '-')!s:<2} "
              f"{r.get('x_whole', '-')!s:<5}{int(bool(r.get('swap_ab')))}{r['us']:8.1f} "
              f"{r['gbps']:7.0f} {r['tflops']:7.1f} "
              f"{r.get('floor_us', 0):7.1f}  {r.get('rel_err', 0):.1e}")


if __name__ == "__main__":
    main()
