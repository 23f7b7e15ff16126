"""A fuzz run: generate N programs, check each, shrink the failures, report.

``--device cpu``: every program runs in the interpreter against the numpy reference;
every ``ptxas_every``-th one also has its CUDA generated and compiled by ptxas for
sm_80 and sm_90 (slow, so a subset). ``--device cuda``: every program also compiles
for the current GPU and runs there, compared with the interpreter.

Work is spread over a process pool (``spawn``: the workers never touch CUDA): each
worker generates its program from ``(seed, index)``, interprets it and, for the first
program of each structure, compiles the kernel into lowvm's disk cache, so the main
process, which launches on the GPU, finds every cubin compiled. Programs share
structures (``share`` consecutive indices, see :func:`lowvm.fuzz.generate.generate`),
so a 3000-program GPU run compiles about 750 kernels.
"""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lowvm.fuzz.build import program_name
from lowvm.fuzz.check import ARCHS, Verdict, check_cpu, check_gpu, check_ptxas
from lowvm.fuzz.generate import generate
from lowvm.fuzz.shrink import save_regression, shrink
from lowvm.fuzz.spec import Spec, features, spec_to_json

__all__ = ["FuzzConfig", "Outcome", "run", "summary_table", "check_program", "default_workers"]


@dataclass(frozen=True)
class FuzzConfig:
    """What a run does (see ``python -m lowvm.fuzz --help``)."""

    device: str = "cpu"
    programs: int = 100
    seed: int = 0
    share: int = 1
    workers: int = 1
    ptxas_every: int = 10
    shrink_limit: int = 10
    shrink_budget_s: float = 60.0
    regressions: Path | None = None
    arch: str | None = None  # cuda: the GPU's sm_XY (found by the main process)


@dataclass
class Outcome:
    """One program's result."""

    index: int
    spec: Spec
    verdict: Verdict
    ptxas: bool = False  # compiled with ptxas (cpu runs)
    interpreted: Any = field(default=None, repr=False)  # the interpreter's output buffer
    seconds: float = 0.0


def check_program(spec: Spec, device: str, ptxas: bool = False, arch: str | None = None,
                  interpreted: Any = None) -> tuple[Verdict, Any]:
    """All checks of one spec in order; the first failure decides the verdict. Returns
    the verdict and the interpreter's output buffer (None if it did not run)."""
    verdict, out = check_cpu(spec) if interpreted is None else (Verdict(), interpreted)
    if verdict.ok and ptxas:
        verdict = check_ptxas(spec)
    if device == "cuda" and out is not None and verdict.status != "error":
        gpu = check_gpu(spec, out, arch)
        if not gpu.ok and verdict.ok:
            verdict = gpu
    return verdict, out


def _task(args: tuple[FuzzConfig, int, bool]) -> Outcome:
    """A worker's share: generate, interpret, compare; ptxas; warm the cubin cache."""
    cfg, index, first_of_structure = args
    start = time.perf_counter()
    spec = generate(cfg.seed, index, cfg.share)
    ptxas = cfg.device == "cpu" and cfg.ptxas_every > 0 and index % cfg.ptxas_every == 0 \
        and shutil.which("nvcc") is not None
    verdict, out = check_program(spec, "cpu", ptxas)
    if cfg.device == "cuda" and first_of_structure and verdict.status != "error":
        _warm_cache(spec, cfg.arch)
    return Outcome(index, spec, verdict, ptxas, out, time.perf_counter() - start)


def _warm_cache(spec: Spec, arch: str | None) -> None:
    """Compile the kernel of ``spec`` into the disk cache (errors surface later, in the
    main process's compile, where they are reported)."""
    from lowvm.driver import arch_for, generate_cuda
    from lowvm.fuzz.build import build_program
    from lowvm.runtime import cached_cubin

    try:
        cuda = generate_cuda(build_program(spec))
        cached_cubin(cuda.source, arch_for(cuda, arch or "sm_80"))
    except Exception:  # noqa: BLE001 - reported by the main process's own attempt
        pass


def _outcomes(cfg: FuzzConfig):
    """Every program's outcome, in index order (from a pool when ``workers > 1``)."""
    seen: set[int] = set()
    tasks = []
    for i in range(cfg.programs):
        group = i // cfg.share
        tasks.append((cfg, i, group not in seen))
        seen.add(group)
    if cfg.workers <= 1:
        yield from map(_task, tasks)
        return
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(cfg.workers) as pool:
        yield from pool.imap(_task, tasks, chunksize=1)


def _gpu_check(cfg: FuzzConfig, outcome: Outcome) -> None:
    if outcome.verdict.status == "error" or outcome.interpreted is None:
        return
    gpu = check_gpu(outcome.spec, outcome.interpreted, cfg.arch)
    if not gpu.ok and outcome.verdict.ok:
        outcome.verdict = gpu


def _fails_like(cfg: FuzzConfig, verdict: Verdict, ptxas: bool):
    device = "cuda" if verdict.stage.startswith("gpu") else "cpu"

    def fails(spec: Spec) -> bool:
        got, _ = check_program(spec, device, ptxas or verdict.stage.startswith("ptxas"),
                               cfg.arch)
        return got.signature() == verdict.signature()
    return fails


def run(cfg: FuzzConfig, log=print) -> dict[str, Any]:
    """Run, shrink, report: the JSON-ready result (see :mod:`lowvm.fuzz`)."""
    start = time.perf_counter()
    if cfg.device == "cuda" and cfg.arch is None:
        from lowvm.driver import current_arch

        cfg = FuzzConfig(**{**cfg.__dict__, "arch": current_arch()})
    outcomes: list[Outcome] = []
    for outcome in _outcomes(cfg):
        if cfg.device == "cuda":
            _gpu_check(cfg, outcome)
        outcome.interpreted = None
        outcomes.append(outcome)
        if not outcome.verdict.ok:
            log(f"program {outcome.index}: {outcome.verdict.status} at "
                f"{outcome.verdict.stage}: {outcome.verdict.message[:300]}")
    checked = time.perf_counter() - start
    rows = _rows(cfg, outcomes, log)
    by_feature: dict[str, dict[str, int]] = {}
    for o in outcomes:
        for f in features(o.spec):
            entry = by_feature.setdefault(f, {"programs": 0, "failed": 0})
            entry["programs"] += 1
            entry["failed"] += not o.verdict.ok
    mismatches = sum(o.verdict.status == "mismatch" for o in outcomes)
    errors = sum(o.verdict.status == "error" for o in outcomes)
    return {
        "ok": mismatches == 0 and errors == 0,
        "programs": len(outcomes),
        "mismatches": mismatches,
        "errors": errors,
        "seed": cfg.seed,
        "device": cfg.device,
        "arch": cfg.arch,
        "share": cfg.share,
        "structures": len({program_name(o.spec) for o in outcomes}),
        "ptxas_compiled": sum(o.ptxas for o in outcomes),
        "ptxas_archs": list(ARCHS) if cfg.device == "cpu" else [],
        "seconds": {"check": round(checked, 1),
                    "total": round(time.perf_counter() - start, 1)},
        "by_stage": dict(collections.Counter(o.verdict.stage for o in outcomes
                                             if not o.verdict.ok)),
        "by_feature": dict(sorted(by_feature.items())),
        "rows": rows,
    }


def _gist(message: str) -> str:
    """A failure's message without places and names: what tells two bugs apart."""
    parts = [p for p in message.split(" | ") if not re.match(
        r"(\w+Error: )?\S+:\d+(:|$)|in the program at", p)]
    text = parts[0] if parts else message
    text = re.sub(r"%\w+", "%t", re.sub(r"\([^)]*\)", "", text))
    return re.sub(r"\d+", "N", text)[:80]


def _rows(cfg: FuzzConfig, outcomes: list[Outcome], log) -> list[dict[str, Any]]:
    """One row per failing program; the first ``shrink_limit`` distinct failures (by
    stage and message start) shrunk, and saved when ``cfg.regressions`` is set."""
    rows = []
    shrunk_for: dict[tuple[str, str, str], dict[str, Any]] = {}
    for o in outcomes:
        v = o.verdict
        if v.ok:
            continue
        row: dict[str, Any] = {"index": o.index, "status": v.status, "stage": v.stage,
                               "message": v.message, "program": program_name(o.spec),
                               "spec": spec_to_json(o.spec)}
        key = (v.status, v.stage, _gist(v.message))
        if key in shrunk_for:
            row["same_as"] = shrunk_for[key]["index"]
        elif len(shrunk_for) < cfg.shrink_limit:
            small, tries = shrink(o.spec, _fails_like(cfg, v, o.ptxas), cfg.shrink_budget_s)
            verdict, _ = check_program(small, "cuda" if v.stage.startswith("gpu") else "cpu",
                                       v.stage.startswith("ptxas"), cfg.arch)
            row["shrunk"] = spec_to_json(small)
            row["shrunk_message"] = verdict.message
            row["shrink_tries"] = tries
            if cfg.regressions is not None:
                path = save_regression(small, v.status, v.stage, verdict.message,
                                       cfg.regressions)
                row["regression"] = str(path)
            shrunk_for[key] = row
            log(f"program {o.index} shrunk in {tries} tries: {json.dumps(row['shrunk'])}")
        rows.append(row)
    return rows


def summary_table(result: dict[str, Any]) -> str:
    """The short text summary printed at the end of a run."""
    lines = [f"lowvm.fuzz: {result['programs']} programs ({result['structures']} "
             f"structures), seed {result['seed']}, device {result['device']}"
             + (f" ({result['arch']})" if result.get("arch") else "")
             + f", {result['seconds']['total']} s"]
    if result["ptxas_compiled"]:
        lines.append(f"  compiled with ptxas for {', '.join(result['ptxas_archs'])}: "
                     f"{result['ptxas_compiled']} programs")
    families = {k.split(":", 1)[1]: v for k, v in result["by_feature"].items()
                if k.startswith("family:")}
    lines.append(f"  {'family':<8} {'programs':>8} {'failed':>7}")
    for name, entry in families.items():
        lines.append(f"  {name:<8} {entry['programs']:>8} {entry['failed']:>7}")
    lines.append(f"  mismatches {result['mismatches']}, errors {result['errors']}"
                 + (f" (by stage: {result['by_stage']})" if result["by_stage"] else ""))
    for row in result["rows"][:10]:
        lines.append(f"  #{row['index']} {row['status']} at {row['stage']}: "
                     f"{row['message'][:110]}")
    lines.append("  OK" if result["ok"] else "  FAILED")
    return "\n".join(lines)


def default_workers() -> int:
    """Worker processes: the CPUs this process may use, at most 16."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(16, cpus))

