"""The ``schedules`` scenario: the library's chosen schedule against its neighbours.

The thresholds in :mod:`lowvm.kernels.library` (split-K factors, prefetch depths, x held
whole, swap_ab at M = 1) were fitted by timing the built-in choice beside schedules one
or two fields away from it. This re-measures that evidence on the current machine: for
each shape, weight type and M, :func:`lowvm.tune.builtin_schedule` (what
``quant_linear`` runs untuned) and the :func:`neighbours` of it in
:func:`lowvm.tune.library_space` (the schedules ``quant_linear`` accepts), all timed by
the scenario's methods in one process. A row's ``schedule`` is "chosen" or the fields
that differ from the choice, as ``field=value/...`` (the syntax of
:func:`lowvm.kernels.gemm_schedule.with_fields`, so any row can be rebuilt).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from lowvm.bench import lowvm_entry, results
from lowvm.bench.candidates import TOL_FP16, Candidate, lowvm_name
from lowvm.bench.counting import quant_format
from lowvm.bench.runner import RunConfig, Timer, gpu_setup, measure_candidate, method_record
from lowvm.bench.shapes import Shape
from lowvm.dtypes import DType
from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.tune import Problem, builtin_schedule, library_space

__all__ = ["CHOSEN", "schedule_spec", "distance", "neighbours", "plan", "run_schedules"]

CHOSEN = "chosen"


def _field_text(value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    return "0" if value is None else str(value)


def schedule_spec(s: GemmSchedule, chosen: GemmSchedule) -> str:
    """``s`` as the fields it changes from ``chosen`` (``with_fields`` syntax), or
    :data:`CHOSEN`."""
    changed = [f"{f.name}={_field_text(getattr(s, f.name))}"
               for f in dataclasses.fields(GemmSchedule)
               if getattr(s, f.name) != getattr(chosen, f.name)]
    return "/".join(changed) or CHOSEN


def distance(s: GemmSchedule, chosen: GemmSchedule) -> int:
    """How many fields of ``s`` differ from ``chosen``."""
    return sum(getattr(s, f.name) != getattr(chosen, f.name)
               for f in dataclasses.fields(GemmSchedule))


def neighbours(space: Sequence[GemmSchedule], chosen: GemmSchedule, count: int
               ) -> list[GemmSchedule]:
    """The ``count`` schedules of ``space`` nearest ``chosen`` (fewest fields changed,
    then the space's order), ``chosen`` excluded."""
    ranked = sorted((distance(s, chosen), i, s) for i, s in enumerate(space) if s != chosen)
    return [s for _, _, s in ranked[:count]]


def plan(shape: Shape, wtype: DType, group: int, m: int, count: int,
         sm90: bool | None = None) -> list[tuple[str, GemmSchedule]]:
    """``[(spec, schedule)]`` timed for one problem: the choice first, then its
    neighbours. ``sm90`` as :func:`lowvm.tune.builtin_schedule` (None: ask the GPU)."""
    problem = Problem(m=m, n=shape.n, k=shape.k, bits=wtype.nbits, group=group)
    chosen = builtin_schedule(problem, sm90)
    space = library_space(problem, chosen)
    return [(CHOSEN, chosen)] + [(schedule_spec(s, chosen), s)
                                 for s in neighbours(space, chosen, count)]


def _candidate(prep: lowvm_entry.Prepared, wtype: DType, group: int,
               schedule: GemmSchedule) -> Candidate:
    import torch

    from lowvm.kernels.library import quant_linear

    def copy() -> Callable[[Any], Any]:
        qw = dataclasses.replace(prep.weight, packed=prep.weight.packed.clone(),
                                 scales=prep.weight.scales.clone())
        return lambda x: quant_linear(x, qw, schedule)

    return Candidate(lowvm_name(wtype, group), "lowvm", wtype.name,
                     quant_format(wtype.nbits, group), torch.float16,
                     lambda x: quant_linear(x, prep.weight, schedule),
                     lambda: lowvm_entry.dequantized(prep), TOL_FP16, copy)


def run_schedules(cfg: RunConfig, count: int, log: Callable[[str], None] = print
                  ) -> dict[str, Any]:
    """Time every planned schedule; returns the results document (kind "schedules")."""
    import torch

    from lowvm.bench.environment import collect

    started = time.perf_counter()
    hbm, notes = gpu_setup(cfg, log)
    rows: list[results.Row] = []
    timer = Timer(cfg)
    gen = torch.Generator(device="cuda")
    for shape in cfg.shapes:
        gen.manual_seed(cfg.seed)
        weight = (torch.randn(shape.n, shape.k, device="cuda", generator=gen)
                  / math.sqrt(shape.k)).to(torch.float16)
        for wtype in cfg.dtypes:
            for group in cfg.groups:
                prep = lowvm_entry.prepare(weight, wtype, group)
                for m in cfg.ms:
                    x = torch.randn(m, shape.k, device="cuda", generator=gen).to(torch.float16)
                    for spec, schedule in plan(shape, wtype, group, m, count):
                        candidate = _candidate(prep, wtype, group, schedule)
                        new = measure_candidate(candidate, shape, m, x, cfg, timer,
                                                hbm["floor_tbps"], schedule=spec)
                        for row in new:
                            shown = (f"{row.median_us:.1f} us" if row.status == "ok"
                                     else f"{row.status}: {row.note}")
                            log(f"[{shape} {wtype.name} M={m}] {spec} [{row.method}]: {shown}")
                        rows += new
                        timer.forget_copies()  # copies are per schedule
                del prep
                torch.cuda.empty_cache()
        del weight
    doc = results.document(rows, hbm=hbm, method=method_record(cfg), notes=notes,
                           wall_s=round(time.perf_counter() - started, 1), **collect())
    doc["kind"] = "schedules"
    return doc
