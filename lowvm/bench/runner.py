"""One benchmark run on the GPU: check each kernel, time it, collect the rows.

For each shape a random fp16 weight is made and every kernel prepared once; for each M
a fresh ``x`` is drawn, and each kernel is first checked against a float64 reference
(``||y - ref|| / ||ref||`` with ``ref = x @ W_kernel^T``, ``W_kernel`` the weight the
kernel actually holds, e.g. dequantised) with the output memory poisoned beforehand,
then timed by :func:`lowvm.bench.timing.time_cuda`. A wrong result, an exception or a
run slower than the budget becomes a failed/skipped row instead of a timing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lowvm.bench import results, timing
from lowvm.bench.candidates import Candidate, build_candidates, probe_optional
from lowvm.bench.counting import NOMINAL_HBM_TBPS
from lowvm.bench.errors import BenchError
from lowvm.bench.shapes import Shape
from lowvm.dtypes import DType

__all__ = ["RunConfig", "run_benchmark", "relative_error"]


@dataclass
class RunConfig:
    """Everything a run needs, as parsed from the command line."""

    shapes: tuple[Shape, ...]
    ms: tuple[int, ...]
    dtypes: tuple[DType, ...]
    groups: tuple[int, ...]
    baselines: tuple[str, ...]
    optional: tuple[str, ...]
    with_lowvm: bool = True
    runs: int = timing.MIN_RUNS
    warmup: int = 5
    max_run_ms: float = 250.0
    tol: float | None = None          # overrides every kernel's own tolerance
    hbm_tbps: float | None = None     # the floor's bandwidth; default: measured read
    measure_hbm: bool = True
    seed: int = 0


def relative_error(out: Any, ref: Any) -> float:
    """``||out - ref|| / ||ref||`` in float64 (inf for a non-finite output)."""
    import torch

    diff = torch.linalg.vector_norm(out.to(torch.float64) - ref).item()
    norm = torch.linalg.vector_norm(ref).item()
    if not math.isfinite(diff):
        return math.inf
    return diff / norm if norm else diff


def _check(c: Candidate, x: Any, tol: float | None) -> tuple[float, str]:
    """Run once on poisoned memory; (relative error, '' or why it failed)."""
    import torch

    weight = c.ref_weight()
    m, n = x.shape[0], weight.shape[0]
    poison = torch.full((m, n), float("nan"), dtype=torch.float16, device=x.device)
    del poison  # the allocator hands this block to the kernel's output next
    y = c.fn(x)
    torch.cuda.synchronize()
    if tuple(y.shape) != (m, n):
        return math.nan, f"output shape {tuple(y.shape)}, expected {(m, n)}"
    ref = x.to(torch.float64) @ weight.to(torch.float64).t()
    err = relative_error(y, ref)
    limit = c.tol if tol is None else tol
    if not err <= limit:
        return err, f"relative error {err:.2e} > {limit:.1e} against the float64 reference"
    return err, ""


def _measure(c: Candidate, shape: Shape, m: int, x: Any, cfg: RunConfig,
             flush: timing.L2Flusher, floor_tbps: float) -> results.Row:
    args = (c.kernel, c.family, c.wtype, c.fmt, shape.k, shape.n, m)
    xa = x.to(c.act_dtype)
    try:
        err, why = _check(c, xa, cfg.tol)
    except Exception as exc:
        return results.unmeasured_row(*args, "failed", f"{type(exc).__name__}: {exc}"[:200],
                                      floor_tbps)
    if why:
        return results.unmeasured_row(*args, "failed", why, floor_tbps, rel_err=err)
    one = timing.time_cuda(lambda: c.fn(xa), runs=1, warmup=0, flush=flush)
    if one.median_us > cfg.max_run_ms * 1e3:
        return results.unmeasured_row(
            *args, "skipped", f"one run took {one.median_us / 1e3:.0f} ms > --max-run-ms "
            f"{cfg.max_run_ms:g}", floor_tbps, rel_err=err)
    t = timing.time_cuda(lambda: c.fn(xa), runs=cfg.runs, warmup=cfg.warmup, flush=flush)
    return results.measured_row(*args, t, floor_tbps, rel_err=err)


def run_benchmark(cfg: RunConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure every (shape, M, kernel) of ``cfg``; returns the results document."""
    import datetime

    import torch

    if not torch.cuda.is_available():
        raise BenchError("no CUDA device: the benchmark runs on a GPU (use --list to see "
                         "what it would run)")
    if cfg.runs < timing.MIN_RUNS:
        raise BenchError(f"--runs {cfg.runs}: DESIGN.md's method takes the median of at "
                         f"least {timing.MIN_RUNS} runs")
    started = time.perf_counter()
    notes = probe_optional(cfg.optional)
    for note in notes:
        log(note)
    hbm: dict[str, Any] = {}
    if cfg.measure_hbm:
        bw = timing.measure_hbm()
        hbm.update(copy_tbps=bw.copy_tbps, read_tbps=bw.read_tbps, buffer_bytes=bw.nbytes)
    if cfg.hbm_tbps is not None:
        hbm.update(floor_tbps=cfg.hbm_tbps, floor_source="--hbm-tbps")
    elif "read_tbps" in hbm:
        hbm.update(floor_tbps=hbm["read_tbps"], floor_source="measured read bandwidth")
    else:
        hbm.update(floor_tbps=NOMINAL_HBM_TBPS,
                   floor_source="nominal H100 read bandwidth of 2026-11-22")
    floor_tbps = hbm["floor_tbps"]
    flush = timing.L2Flusher()
    rows: list[results.Row] = []
    gen = torch.Generator(device="cuda")
    for shape in cfg.shapes:
        gen.manual_seed(cfg.seed)
        weight = (torch.randn(shape.n, shape.k, device="cuda", generator=gen)
                  / math.sqrt(shape.k)).to(torch.float16)
        log(f"[{shape}] preparing kernels")
        ready, missing = build_candidates(weight, cfg.dtypes, cfg.groups, cfg.baselines,
                                          cfg.with_lowvm, optional=cfg.optional)
        for m in cfg.ms:
            x = torch.randn(m, shape.k, device="cuda", generator=gen).to(torch.float16)
            for c in ready:
                row = _measure(c, shape, m, x, cfg, flush, floor_tbps)
                rows.append(row)
                shown = f"{row.median_us:.1f} us" if row.status == "ok" else row.status
                log(f"[{shape} M={m}] {c.kernel}: {shown}")
            for u in missing:
                rows.append(results.unmeasured_row(u.kernel, u.family, u.wtype, u.fmt,
                                                   shape.k, shape.n, m, u.status, u.note,
                                                   floor_tbps))
        del ready, weight
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    try:
        from lowvm.runtime import driver_version
        driver: Any = driver_version()
    except Exception:  # the figure is informative only
        driver = None
    method = {
        "timer": "CUDA events around the kernel alone",
        "l2_flush_bytes": timing.FLUSH_BYTES,
        "warmup": cfg.warmup,
        "runs": cfg.runs,
        "statistic": "median",
        "weights": f"randn/sqrt(K) fp16, seed {cfg.seed}; tinygemm and cublas_bf16 use bf16",
        "floor": "(weight + scale bytes) / floor_tbps",
        "check": "relative error against x @ W_kernel^T in float64, before timing",
        "max_run_ms": cfg.max_run_ms,
    }
    return results.document(
        rows, gpu=torch.cuda.get_device_name(), date=datetime.datetime.now(
            datetime.timezone.utc).isoformat(timespec="seconds"),
        torch_version=torch.__version__, cuda_version=torch.version.cuda, hbm=hbm,
        method=method, driver=driver, sm_count=props.multi_processor_count,
        notes=notes, wall_s=round(time.perf_counter() - started, 1))
