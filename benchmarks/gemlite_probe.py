"""GemLite int4 g128 as our adapter runs it vs GemLite out of the box, kernel by kernel.

Why: the first H100 harness run (results/bench_h100_2026-11-24_s7_int4.*) has GemLite
timings far from the recorded anchors (4096x28672 M=1: 358.8 vs 40.1 us) with very wide
spreads (min 137, p90 398), and three M = 1 rows failing the fp16 tolerance.

For each shape (K x N) and M this builds, from the same quantised weight,
  adapter  ``lowvm.bench.gemlite_baseline.prepare`` + ``run`` (its routing and configs);
  default  ``gemlite.helper.A16Wn().from_weights(...)`` and the layer's own ``forward``
           (GemLite's kernel choice, its shipped H100 config, "fast" autotune elsewhere),
and for each reports:
  kernel/config  the GemLite matmul type that ran (its dispatch is hooked for one untimed
                 call) and the Triton autotuner's ``best_config``, with where it came from
                 (shipped file / seeded by the adapter / autotuned);
  gpu_us         GPU time of the call's own kernels (torch.profiler, flush kernels left
                 out; the memset GemLite launches for its atomics is included), median;
  ev_sync_us     CUDA events after a 512 MB L2 flush, a sync after each run, median of 30
                 (benchmarks/timing.py);
  ev_queue_us    the harness's own method (lowvm.bench.timing.time_cuda: 30 runs queued
                 without syncs, flush before each), median [min..p90];
  host_us        the host's time inside the call (Python, custom op, autotuner lookup,
                 Triton launch), median: where it nears the flush's ~190 us of GPU work,
                 the event timings above measure the host, not the kernel;
  rel_err        ||y - ref|| / ||ref|| against float64 with the weight GemLite holds;
and at M = 1 a diagnostic ``fp32_out_err``: the same GEMV_REVSPLITK with an fp32 output
(so its split-K atomics accumulate in fp32): if that error is ~1e-4 while rel_err is
~3e-3, the fp16 failures come from GemLite accumulating its K-split partial sums with fp16
atomics (``K / (2 BLOCK_K)`` of them per output), not from the quantisation or the adapter.

Rows where GemLite out of the box would autotune a tensor-core kernel (GEMM/GEMM_SPLITK,
~20 configs to compile, ~1 min each) are skipped unless ``--autotune all``; its GEMV
autotune (M = 1 on an unshipped shape, ~15 s) runs by default.

Usage (on the GPU machine):
  PYTHONPATH=.carry/gemlite_src:. python benchmarks/gemlite_probe.py --out probe.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
import traceback
from typing import Any

import torch
from timing import median_us

TOL = 3e-3
SHAPES = "4096x28672,4096x6144,8192x10240"   # K x N, as the harness prints them


def log(msg: str) -> None:
    print(msg, flush=True)


# --- GemLite state ---------------------------------------------------------------------

class GemliteState:
    """The config cache as loaded from GemLite's file, restorable between paths, and the
    Triton autotuners of every GemLite kernel (their per-key caches are cleared too, or one
    path would reuse the config the other chose)."""

    def __init__(self, gemlite: Any) -> None:
        self.gl = gemlite
        self.core = gemlite.core
        self.original = copy.deepcopy(self.core.GEMLITE_TRITON_CONFIG_CACHE)

    def kernels(self, name: str | None = None) -> list[Any]:
        mapping = self.core.GEMLITE_TRITON_MAPPING
        names = [name] if name else list(mapping)
        return [k for n in names for k in getattr(mapping[n], "kernel", [])]

    def reset(self) -> None:
        cache = self.core.GEMLITE_TRITON_CONFIG_CACHE
        cache.clear()                      # in place: the pruners import this very dict
        cache.update(copy.deepcopy(self.original))
        for k in self.kernels():
            if hasattr(k, "cache"):
                k.cache.clear()

    def source(self, matmul: str, sig: str) -> str:
        if sig in self.original.get(matmul, {}):
            return "shipped"
        if sig in self.core.GEMLITE_TRITON_CONFIG_CACHE.get(matmul, {}):
            return "seeded by adapter"
        return "autotuned"


def identify(state: GemliteState, fn: Any) -> dict[str, Any]:
    """Run ``fn`` once with GemLite's per-type forwards wrapped; which type ran, and the
    autotuner's chosen config."""
    mapping = state.core.GEMLITE_TRITON_MAPPING
    seen: list[tuple[str, tuple[int, ...]]] = []
    saved = {}
    for name, cls in mapping.items():
        orig = cls.forward
        saved[name] = orig

        def wrapper(x, *a, _name=name, _orig=orig, **kw):
            seen.append((_name, tuple(x.shape)))
            return _orig(x, *a, **kw)

        cls.forward = wrapper
    try:
        fn()
        torch.cuda.synchronize()
    finally:
        for name, cls in mapping.items():
            cls.forward = saved[name]
    out: dict[str, Any] = {"dispatch": [s[0] for s in seen]}
    if seen:
        name = seen[-1][0]
        out["kernel"] = name
        for k in state.kernels(name):
            best = getattr(k, "best_config", None)
            if best is None:
                continue
            cfg = dict(best.all_kwargs()) if hasattr(best, "all_kwargs") else dict(best.kwargs)
            cfg = {a: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
                   for a, v in cfg.items()}
            kname = getattr(getattr(k, "fn", None), "__name__", None) or repr(k)[:60]
            out.setdefault("configs", {})[kname] = cfg
    return out


def short_config(info: dict[str, Any]) -> str:
    for cfg in (info.get("configs") or {}).values():
        parts = [f"BM{cfg.get('BLOCK_SIZE_M')}", f"BN{cfg.get('BLOCK_SIZE_N')}",
                 f"BK{cfg.get('BLOCK_SIZE_K')}"]
        if "SPLIT_K" in cfg:
            parts.append(f"SK{cfg['SPLIT_K']}")
        parts.append(f"w{cfg.get('num_warps')}s{cfg.get('num_stages')}")
        return " ".join(parts)
    return "?"


# --- measurements -----------------------------------------------------------------------

def gpu_kernel_us(fn: Any, flush: Any, runs: int = 20) -> tuple[float, dict[str, Any]]:
    """The profiler's GPU time of the call's own kernels per call, averaged over ``runs``
    (the flush's ``FillFunctor<unsigned char>`` left out), and each kernel's share."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        flush()
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            flush()
            fn()
        torch.cuda.synchronize()
    kernels: dict[str, Any] = {}
    total = 0.0
    for ev in prof.key_averages():
        dev = getattr(ev, "device_time_total", None)
        if dev is None:
            dev = getattr(ev, "cuda_time_total", 0.0)
        if not dev or "unsigned char" in ev.key:   # the L2 flush's fill
            continue
        if getattr(ev, "device_type", None) is not None and "CUDA" not in str(ev.device_type):
            continue
        per_call = dev / runs
        kernels[ev.key[:120]] = {"count_per_call": ev.count / runs, "us_per_call": per_call}
        total += per_call
    return total, kernels


def host_us(fn: Any, flush: Any, runs: int = 30) -> float:
    times = []
    for _ in range(runs):
        flush()                 # keeps the GPU busy, so fn() only enqueues
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(times)


def rel_err(y: Any, ref: Any) -> float:
    diff = torch.linalg.vector_norm(y.to(torch.float64) - ref).item()
    norm = torch.linalg.vector_norm(ref).item()
    return diff / norm if math.isfinite(diff) and norm else math.inf


def measure(fn: Any, x: Any, ref: Any, flusher: Any, runs: int) -> dict[str, Any]:
    from lowvm.bench import timing as bench_timing

    r: dict[str, Any] = {}
    y = fn()
    torch.cuda.synchronize()
    r["rel_err"] = rel_err(y, ref)
    r["ok_tol"] = r["rel_err"] <= TOL
    try:
        r["gpu_us"], r["gpu_kernels"] = gpu_kernel_us(fn, flusher)
    except Exception as exc:  # profiler trouble must not lose the other figures
        r["gpu_error"] = f"{type(exc).__name__}: {exc}"
    r["ev_sync_us"] = median_us(fn, flusher, runs=runs)
    t = bench_timing.time_cuda(fn, runs=runs, warmup=5, flush=flusher)
    r["ev_queue_us"] = t.median_us
    r["ev_queue_min_us"] = t.min_us
    r["ev_queue_p90_us"] = t.p90_us
    r["host_us"] = host_us(fn, flusher)
    return r


# --- the probe --------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default=SHAPES, help="K x N list, comma-separated")
    ap.add_argument("--ms", default="1,16,64")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--autotune", choices=("none", "gemv", "all"), default="gemv",
                    help="which out-of-the-box autotunes to allow (default: GEMV only)")
    ap.add_argument("--budget-s", type=float, default=170.0,
                    help="skip further autotuning rows once this much wall time is spent")
    args = ap.parse_args()
    started = time.perf_counter()
    doc: dict[str, Any] = {"rows": [], "errors": [], "tol": TOL}

    def save() -> None:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1, default=str)

    try:
        import gemlite
        from gemlite.triton_kernels.utils import get_closest_m

        from lowvm.bench import gemlite_baseline as gb
        from lowvm.bench import timing as bench_timing
        gb._ensure_configs(gemlite)
    except Exception as exc:
        doc["errors"].append(f"setup: {type(exc).__name__}: {exc}")
        traceback.print_exc()
        save()
        return 1

    state = GemliteState(gemlite)
    doc.update(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
               gemlite=getattr(gemlite, "__version__", "?"),
               triton=__import__("triton").__version__,
               config_kernels={k: len(v) for k, v in state.original.items()},
               autotune_setting={k: getattr(gemlite.triton_kernels.config.AUTOTUNE, k, None)
                                 for k in ("GEMV", "GEMV_REVSPLITK", "GEMV_SPLITK",
                                           "GEMM_SPLITK", "GEMM")})
    log(f"gpu {doc['gpu']}, torch {doc['torch']}, triton {doc['triton']}, gemlite "
        f"{doc['gemlite']}; shipped config entries {doc['config_kernels']}")
    flusher = bench_timing.L2Flusher()
    gen = torch.Generator(device="cuda")
    ms = [int(v) for v in args.ms.split(",")]

    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.lower().split("x"))
        try:
            gen.manual_seed(0)
            weight = (torch.randn(n, k, device="cuda", generator=gen)
                      / math.sqrt(k)).to(torch.float16)
            state.reset()
            gw = gb.prepare(weight, 4, 128)
            _, scales, zeros = gb.quantize(weight, 4, 128)   # as prepare() made them
            default_layer = gemlite.helper.A16Wn(device="cuda").from_weights(
                gw.codes, scales, zeros, W_nbits=4, group_size=128)
            w64 = gb.dequantized(gw)
            fp32_layer = None
        except Exception as exc:
            msg = f"[{shape}] setup failed: {type(exc).__name__}: {exc}"
            log(msg)
            traceback.print_exc()
            doc["errors"].append(msg)
            save()
            continue
        for m in ms:
            x = torch.randn(m, k, device="cuda", generator=gen).to(torch.float16)
            ref = x.to(torch.float64) @ w64.t()
            sig = gb.signature(get_closest_m(m), n, k, 128, 4)
            auto = gemlite.core.get_matmul_type(m, 4)
            paths = [("default", lambda x=x, layer=default_layer: layer(x)),
                     ("adapter", lambda x=x, w=gw: gb.run(w, x))]
            for path, fn in paths:
                row: dict[str, Any] = {"k": k, "n": n, "m": m, "path": path,
                                       "gemlite_choice": auto, "signature": sig}
                tag = f"[{k}x{n} M={m} {path}]"
                try:
                    state.reset()
                    gw.plans.pop(m, None)
                    if path == "default":
                        shipped = sig in state.original.get(auto, {})
                        would_tune = not shipped
                        row["would_autotune"] = would_tune
                        gemv = auto.startswith("GEMV")
                        if would_tune and (args.autotune == "none"
                                           or (args.autotune == "gemv" and not gemv)):
                            row["status"] = (f"skipped: GemLite would autotune {auto} here "
                                             "(nothing shipped); --autotune all runs it")
                            log(f"{tag} {row['status']}")
                            doc["rows"].append(row)
                            save()
                            continue
                        if would_tune and time.perf_counter() - started > args.budget_s:
                            row["status"] = "skipped: --budget-s spent"
                            log(f"{tag} {row['status']}")
                            doc["rows"].append(row)
                            save()
                            continue
                    else:
                        plan = gb._plan(gw, m)
                        row["plan"] = {"kernel": plan.kernel, "source": plan.source}
                    t0 = time.perf_counter()
                    info = identify(state, fn)   # first call: compile / autotune
                    row["first_call_s"] = round(time.perf_counter() - t0, 2)
                    row.update(info)
                    row["config_source"] = state.source(info.get("kernel", auto), sig)
                    row["config"] = short_config(info)
                    row.update(measure(fn, x, ref, flusher, args.runs))
                    row["status"] = "ok"
                    log(f"{tag} {row.get('kernel')} ({row['config_source']}; "
                        f"{row['config']}) first call {row['first_call_s']} s | gpu "
                        f"{row.get('gpu_us', math.nan):.1f} us, events sync "
                        f"{row['ev_sync_us']:.1f}, queued {row['ev_queue_us']:.1f} "
                        f"[{row['ev_queue_min_us']:.1f}..{row['ev_queue_p90_us']:.1f}], "
                        f"host {row['host_us']:.1f} us | rel err {row['rel_err']:.2e}"
                        f"{'' if row['ok_tol'] else ' > tol'}")
                    for name, kv in (row.get("gpu_kernels") or {}).items():
                        log(f"    {kv['us_per_call']:8.1f} us  x{kv['count_per_call']:.1f}  "
                            f"{name}")
                except Exception as exc:
                    row["status"] = f"failed: {type(exc).__name__}: {exc}"[:300]
                    log(f"{tag} {row['status']}")
                    traceback.print_exc()
                doc["rows"].append(row)
                save()
            if m == 1:   # the fp16-atomic diagnosis: same kernel, fp32 output
                try:
                    state.reset()
                    if fp32_layer is None:
                        fp32_layer = gemlite.GemLiteLinearTriton(
                            4, group_size=128, in_features=k, out_features=n,
                            input_dtype=gemlite.DType.FP16, output_dtype=gemlite.DType.FP32,
                            scaled_activations=False)
                        fp32_layer.pack(gw.codes, scales, zeros, bias=None)
                    gb._plan(gw, 1)   # the adapter's config (seeded where not shipped)
                    y32 = fp32_layer.forward_manual(x, matmul_type="GEMV_REVSPLITK")
                    y16 = gb.run(gw, x)
                    torch.cuda.synchronize()
                    diag = {"k": k, "n": n, "m": 1, "path": "diag_fp32_out",
                            "kernel": "GEMV_REVSPLITK", "status": "ok",
                            "fp32_out_err": rel_err(y32, ref),
                            "fp16_out_err": rel_err(y16, ref),
                            "fp16_of_fp32_err": rel_err(y32.to(torch.float16), ref)}
                    cfg = short_config(identify(state, lambda x=x, w=gw: gb.run(w, x)))
                    diag["config"] = cfg
                    bk = [int(p[2:]) for p in cfg.split() if p.startswith("BK")]
                    if bk:
                        diag["fp16_atomic_adds_per_output"] = k // (2 * bk[0])
                    log(f"[{k}x{n} M=1 diag] GEMV_REVSPLITK ({cfg}): fp16 output "
                        f"{diag['fp16_out_err']:.2e}, fp32 output {diag['fp32_out_err']:.2e}"
                        f" (rounded once to fp16: {diag['fp16_of_fp32_err']:.2e}); "
                        f"{diag.get('fp16_atomic_adds_per_output', '?')} fp16 atomic adds "
                        "per output")
                except Exception as exc:
                    diag = {"k": k, "n": n, "m": 1, "path": "diag_fp32_out",
                            "status": f"failed: {type(exc).__name__}: {exc}"[:300]}
                    log(f"[{k}x{n} M=1 diag] {diag['status']}")
                    traceback.print_exc()
                doc["rows"].append(diag)
                save()
        gw = default_layer = fp32_layer = weight = w64 = None  # free before the next shape
        torch.cuda.empty_cache()

    doc["wall_s"] = round(time.perf_counter() - started, 1)
    save()
    log("")
    log(f"{'K x N':<12}{'M':>4} {'path':<8} {'kernel':<15} {'config src':<18}"
        f"{'config':<26}{'gpu':>7}{'ev_sync':>8}{'ev_queue':>9}{'host':>7}{'rel_err':>9}")
    for r in doc["rows"]:
        if r.get("path") == "diag_fp32_out":
            if r.get("status") == "ok":
                log(f"{r['k']}x{r['n']:<7}{1:>4} {'diag':<8} fp32-out err {r['fp32_out_err']:.1e}"
                    f" vs fp16-out {r['fp16_out_err']:.1e} "
                    f"({r.get('fp16_atomic_adds_per_output', '?')} fp16 adds/output)")
            continue
        head = f"{r['k']}x{r['n']:<7}{r['m']:>4} {r['path']:<8} "
        if r.get("status") != "ok":
            log(head + str(r.get("status"))[:90])
            continue

        def f(v: Any) -> str:
            return f"{v:.1f}" if isinstance(v, (int, float)) else "-"
        log(head + f"{str(r.get('kernel')):<15} {r['config_source']:<18}{r['config']:<26}"
            f"{f(r.get('gpu_us')):>7}{f(r['ev_sync_us']):>8}{f(r['ev_queue_us']):>9}"
            f"{f(r['host_us']):>7}{r['rel_err']:>9.1e}" + ("" if r["ok_tol"] else " FAIL"))
    log(f"(us; gpu = profiler kernel time per call; ev_* = CUDA events after a 512 MB "
        f"flush; host = Python+launch time of one call; tol {TOL:g}; wall {doc['wall_s']} s)")
    log(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
