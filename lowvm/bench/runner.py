"""One benchmark run on the GPU: check each kernel, time it, collect the rows.

For each shape a random fp16 weight is made and every kernel prepared once; for each M
a fresh ``x`` is drawn, and each kernel is first checked against a float64 reference
(``||y - ref|| / ||ref||`` with ``ref = x @ W_kernel^T``, ``W_kernel`` the weight the
kernel actually holds, e.g. dequantised) with the output memory poisoned beforehand,
then timed by each method of the run (:mod:`lowvm.runtime.timing`: ``graph`` and
``eager`` over copies of the weight that overflow the L2, ``read-flushed`` and
``write-flushed`` one call after a 512 MB flush). A wrong result, an exception or a run
slower than the budget becomes a failed/skipped row instead of a timing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lowvm.bench import results
from lowvm.bench.candidates import Candidate, build_candidates, probe_optional
from lowvm.bench.counting import NOMINAL_HBM_TBPS
from lowvm.bench.errors import BenchError
from lowvm.bench.shapes import Shape
from lowvm.dtypes import DType
from lowvm.runtime import timing

__all__ = ["RunConfig", "Timer", "measure_candidate", "gpu_setup", "method_record",
           "run_benchmark", "relative_error"]


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
    methods: tuple[str, ...] = ("write-flushed",)
    scenario: str = "adhoc"
    replays: int = timing.MIN_REPLAYS


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


class Timer:
    """Times one candidate by one method, keeping the flush buffers and weight copies."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.flushers: dict[str, Any] = {}
        self.copies: dict[str, list[Callable[[Any], Any]]] = {}

    def forget_copies(self) -> None:
        self.copies.clear()

    def calls(self, c: Candidate, bytes_per_copy: int) -> list[Callable[[Any], Any]] | None:
        """``c.fn`` and copies of it on distinct weights, >= 200 MB together."""
        if c.replicate is None:
            return None
        if c.kernel not in self.copies:
            count = timing.copies_for(bytes_per_copy)
            self.copies[c.kernel] = [c.fn] + [c.replicate() for _ in range(count - 1)]
        return self.copies[c.kernel]

    def time(self, c: Candidate, xa: Any, method: str, bytes_per_copy: int
             ) -> tuple[timing.Timing | None, int, str]:
        """(timing or None, weight copies used, why not timed)."""
        cfg = self.cfg
        if method in ("read-flushed", "write-flushed"):
            return (timing.time_flushed(lambda: c.fn(xa), method, runs=cfg.runs,
                                        warmup=cfg.warmup, flushers=self.flushers), 1, "")
        fns = self.calls(c, bytes_per_copy)
        if fns is None:
            return None, 0, f"{method}: the kernel's weight cannot be copied"
        calls = [lambda f=f: f(xa) for f in fns]
        if method == "graph":
            return timing.time_graph(calls, replays=cfg.replays), len(calls), ""
        return timing.time_eager(calls, replays=cfg.replays), len(calls), ""


def measure_candidate(c: Candidate, shape: Shape, m: int, x: Any, cfg: RunConfig, timer: Timer,
             floor_tbps: float, schedule: str = "") -> list[results.Row]:
    """One row per method for ``c`` at ``(shape, m)``: checked once, then timed."""
    args = (c.kernel, c.family, c.wtype, c.fmt, shape.k, shape.n, m)
    extra = dict(scenario=cfg.scenario, schedule=schedule)

    def unmeasured(status: str, why: str, err: float | None = None) -> list[results.Row]:
        return [results.unmeasured_row(*args, status, why, floor_tbps, rel_err=err,
                                       method=meth, **extra) for meth in cfg.methods]

    xa = x.to(c.act_dtype)
    try:
        err, why = _check(c, xa, cfg.tol)
    except Exception as exc:
        return unmeasured("failed", f"{type(exc).__name__}: {exc}"[:200])
    if why:
        return unmeasured("failed", why, err)
    one = timing.time_flushed(lambda: c.fn(xa), "write-flushed", runs=1, warmup=0,
                              flushers=timer.flushers)
    if one.median_us > cfg.max_run_ms * 1e3:
        return unmeasured("skipped", f"one run took {one.median_us / 1e3:.0f} ms > "
                          f"--max-run-ms {cfg.max_run_ms:g}", err)
    rows = []
    nbytes = c.fmt.total_bytes(shape.k, shape.n)
    for method in cfg.methods:
        try:
            t, copies, why = timer.time(c, xa, method, nbytes)
        except Exception as exc:  # e.g. a kernel that cannot be captured in a graph
            t, copies, why = None, 0, f"{method}: {type(exc).__name__}: {exc}"[:200]
        if t is None:
            rows.append(results.unmeasured_row(*args, "skipped" if "copied" in why else
                                               "failed", why, floor_tbps, rel_err=err,
                                               method=method, **extra))
        else:
            rows.append(results.measured_row(*args, t, floor_tbps, rel_err=err,
                                             method=method, copies=copies, **extra))
    return rows


def _log_rows(log: Callable[[str], None], label: str, rows: list[results.Row]) -> None:
    for row in rows:
        shown = f"{row.median_us:.1f} us" if row.status == "ok" else row.status
        log(f"{label} {row.kernel} {row.schedule} [{row.method}]: {shown}".replace("  ", " "))


def gpu_setup(cfg: RunConfig, log: Callable[[str], None]) -> tuple[dict[str, Any], list[str]]:
    """Check the device and the options, measure HBM: ``(hbm, notes)``."""
    import torch

    if not torch.cuda.is_available():
        raise BenchError("no CUDA device: the benchmark runs on a GPU (use --list to see "
                         "what it would run)")
    if cfg.runs < timing.MIN_RUNS:
        raise BenchError(f"--runs {cfg.runs}: the method takes the median of at least "
                         f"{timing.MIN_RUNS} runs")
    if cfg.replays < timing.MIN_REPLAYS:
        raise BenchError(f"--replays {cfg.replays}: the graph and eager methods take the "
                         f"median of at least {timing.MIN_REPLAYS} replays")
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
    return hbm, notes


def method_record(cfg: RunConfig) -> dict[str, Any]:
    """How the run timed, stored beside its rows."""
    return {
        "methods": list(cfg.methods),
        "flushed": "CUDA events around one call after a 512 MB L2 flush (read: a "
                   "reduction over the buffer; write: a fill), median of the runs",
        "graph": f"calls on distinct weight copies (>= {timing.GRAPH_MIN_BYTES // 10**6} MB "
                 "together) captured back to back in one CUDA graph, replayed behind a GPU "
                 "sleep; time per call, median of the replays",
        "eager": "the same calls issued back to back from Python, no flush; time per call",
        "l2_flush_bytes": timing.FLUSH_BYTES,
        "warmup": cfg.warmup,
        "runs": cfg.runs,
        "replays": cfg.replays,
        "statistic": "median",
        "weights": f"randn/sqrt(K) fp16, seed {cfg.seed}; tinygemm and cublas_bf16 use bf16",
        "floor": "(weight + scale bytes) / floor_tbps",
        "check": "relative error against x @ W_kernel^T in float64, before timing",
        "max_run_ms": cfg.max_run_ms,
    }


def run_benchmark(cfg: RunConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Measure every (shape, M, kernel, method) of ``cfg``; returns the results document."""
    import torch

    from lowvm.bench.environment import collect

    started = time.perf_counter()
    hbm, notes = gpu_setup(cfg, log)
    floor_tbps = hbm["floor_tbps"]
    timer = Timer(cfg)
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
                new = measure_candidate(c, shape, m, x, cfg, timer, floor_tbps)
                _log_rows(log, f"[{shape} M={m}]", new)
                rows += new
            for u in missing:
                rows += [results.unmeasured_row(u.kernel, u.family, u.wtype, u.fmt, shape.k,
                                                shape.n, m, u.status, u.note, floor_tbps,
                                                method=meth, scenario=cfg.scenario)
                         for meth in cfg.methods]
        timer.forget_copies()
        del ready, weight
        torch.cuda.empty_cache()
    return results.document(
        rows, hbm=hbm, method=method_record(cfg), notes=notes,
        wall_s=round(time.perf_counter() - started, 1), **collect())
