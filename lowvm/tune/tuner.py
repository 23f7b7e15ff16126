"""The autotuner: rank with the model, measure the top few, keep the best on disk.

Measuring is the expensive part (a compile and 30 timed runs per candidate), so the
static model orders the space and only the ``top_k`` best predicted are measured. The
measurement is injected (``measure(schedule) -> seconds``): on the GPU it compiles and
times a kernel (:func:`lowvm.tune.measure.cuda_measure`); in tests it is a fake. With
``exhaustive=True`` every feasible schedule is measured and the result says how far
the model's pick, and the best of its top-k, are from the true best: the check that
the model ranks well enough to trust.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lowvm.tune.cache import TuneCache, TuneKey
from lowvm.tune.errors import TuneError
from lowvm.tune.gpu import GpuSpec
from lowvm.tune.model import rank
from lowvm.tune.schedule import Problem, Schedule, path_for_m, schedule_space

__all__ = ["Autotuner", "TuneResult"]


@dataclass
class TuneResult:
    """What one ``tune`` call chose and how."""

    key: TuneKey
    schedule: Schedule
    seconds: float                       # measured (or cached) time of ``schedule``
    from_cache: bool
    space_size: int = 0                  # feasible schedules the model ranked
    measured: int = 0                    # candidates measured by this call
    failures: dict[str, str] = field(default_factory=dict)  # schedule -> error
    model_pick: Schedule | None = None   # the model's top-1
    model_pick_seconds: float | None = None
    exhaustive: bool = False
    best_rank_in_model: int | None = None  # where the measured best sat in the ranking
    topk_best_seconds: float | None = None  # best of the model's top-k (exhaustive only)

    @property
    def model_gap(self) -> float | None:
        """``model pick time / best time - 1`` (exhaustive mode): 0 means optimal."""
        if self.model_pick_seconds is None or not self.exhaustive:
            return None
        return self.model_pick_seconds / self.seconds - 1

    @property
    def topk_gap(self) -> float | None:
        """``best of the top-k / best time - 1`` (exhaustive mode)."""
        if self.topk_best_seconds is None or not self.exhaustive:
            return None
        return self.topk_best_seconds / self.seconds - 1

    def summary(self) -> str:
        if self.from_cache:
            return f"{self.key}: {self.schedule} (cached, {self.seconds * 1e6:.1f} us)"
        text = (f"{self.key}: {self.schedule}, {self.seconds * 1e6:.1f} us; measured "
                f"{self.measured} of {self.space_size} candidates")
        if self.exhaustive and self.model_gap is not None:
            text += (f"; model's pick {self.model_pick} is {100 * self.model_gap:.1f}% "
                     f"slower than the best, best of its top-k "
                     f"{100 * (self.topk_gap or 0):.1f}%, best ranked "
                     f"#{self.best_rank_in_model} by the model")
        return text


def _progress(items: Sequence[Schedule], desc: str, enabled: bool) -> Iterable[Schedule]:
    """A tqdm bar over ``items`` when tqdm is installed and ``enabled``."""
    if not enabled:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return items
    return tqdm(items, desc=desc, unit="schedule", leave=False)


class Autotuner:
    """Choose schedules for problems on one GPU (see module doc)."""

    def __init__(self, measure: Callable[[Schedule], float], gpu: GpuSpec, *,
                 cache: TuneCache | None = None, top_k: int = 8,
                 progress: bool = True) -> None:
        if top_k < 1:
            raise TuneError(f"top_k={top_k}: at least one candidate must be measured")
        self.measure = measure
        self.gpu = gpu
        self.cache = cache if cache is not None else TuneCache()
        self.top_k = top_k
        self.progress = progress

    def _time(self, s: Schedule, failures: dict[str, str]) -> float:
        try:
            t = float(self.measure(s))
        except Exception as exc:  # a candidate that fails to compile or run loses
            failures[str(s)] = f"{type(exc).__name__}: {exc}"[:200]
            return math.inf
        if not (t > 0 and math.isfinite(t)):
            failures[str(s)] = f"measure returned {t!r}"
            return math.inf
        return t

    def tune(self, problem: Problem, dtype: str, *, space: Sequence[Schedule] | None = None,
             exhaustive: bool = False, force: bool = False) -> TuneResult:
        """The best schedule for ``problem`` with ``dtype`` weights: from the cache, or
        by measuring the model's top-k (every feasible schedule if ``exhaustive``)."""
        key = TuneKey.for_problem(self.gpu.name, dtype, problem.group, problem.n,
                                  problem.k, problem.m)
        if not force and not exhaustive:
            hit = self.cache.get(key)
            if hit is not None:
                return TuneResult(key, Schedule.from_constants(hit["schedule"]),
                                  float(hit["seconds"]), from_cache=True,
                                  space_size=int(hit.get("space", 0)))
        candidates = list(space) if space is not None else schedule_space(path_for_m(problem.m))
        ranked = rank(candidates, problem, self.gpu)
        if not ranked:
            raise TuneError(f"tune: no schedule of the {len(candidates)} given fits "
                            f"M={problem.m} N={problem.n} K={problem.k} group={problem.group}")
        order = [s for s, _ in ranked]
        chosen = order if exhaustive else order[:self.top_k]
        failures: dict[str, str] = {}
        times = {s: self._time(s, failures)
                 for s in _progress(chosen, f"tuning {key}", self.progress)}
        best = min(chosen, key=lambda s: (times[s], order.index(s)))
        if not math.isfinite(times[best]):
            raise TuneError(f"tune: every measured schedule failed for {key}: "
                            + "; ".join(f"{k}: {v}" for k, v in list(failures.items())[:3]))
        result = TuneResult(key, best, times[best], from_cache=False, space_size=len(order),
                            measured=len(chosen), failures=failures, model_pick=order[0],
                            model_pick_seconds=times[order[0]], exhaustive=exhaustive)
        if exhaustive:
            result.best_rank_in_model = order.index(best) + 1
            result.topk_best_seconds = min(times[s] for s in order[:self.top_k])
        self.cache.put(key, self._entry(result))
        return result

    @staticmethod
    def _entry(r: TuneResult) -> dict[str, Any]:
        return {"schedule": r.schedule.constants(), "seconds": r.seconds,
                "measured": r.measured, "space": r.space_size, "exhaustive": r.exhaustive,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds")}
