"""The autotuner: rank with the model, measure the top few and the built-in choice, keep
the best on disk.

Measuring is the expensive part (a compile and 30 timed runs per candidate), so the
static model orders the space and only the ``top_k`` best predicted are measured, plus
always the library's built-in choice (``choose_schedule``): the model only has to rank
well enough to prune, and a tuned entry can never be one that measured slower than what
``quant_linear`` would run without it. A candidate replaces the built-in choice only
when it measured more than ``min_gain`` faster, so timing noise alone does not write a
different schedule into the cache. The default space is the library's
(:func:`~lowvm.tune.space.library_space`: schedules ``quant_linear`` accepts for the
problem); another list of schedules can be passed.

The measurement is injected (``measure(schedule) -> seconds``): on the GPU it compiles
and times a kernel (:func:`lowvm.tune.measure.cuda_measure`); in tests it is a fake.
With ``exhaustive=True`` every feasible schedule is measured and the result says how far
the model's pick, and the best of its top-k, are from the true best: the check that the
model ranks well enough to trust.
"""

from __future__ import annotations

import datetime
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.tune.cache import TuneCache, TuneKey, schedule_from_entry, schedule_to_json
from lowvm.tune.errors import TuneError
from lowvm.tune.gpu import GpuSpec
from lowvm.tune.model import rank
from lowvm.tune.problem import Problem

__all__ = ["Autotuner", "TuneResult"]


@dataclass
class TuneResult:
    """What one ``tune`` call chose and how."""

    key: TuneKey
    schedule: GemmSchedule
    seconds: float                       # measured (or cached) time of ``schedule``
    from_cache: bool
    space_size: int = 0                  # feasible schedules the model ranked
    measured: int = 0                    # candidates measured by this call
    failures: dict[str, str] = field(default_factory=dict)  # schedule -> error
    model_pick: GemmSchedule | None = None   # the model's top-1
    model_pick_seconds: float | None = None
    exhaustive: bool = False
    best_rank_in_model: int | None = None  # where the measured best sat in the ranking
    topk_best_seconds: float | None = None  # best of the model's top-k (exhaustive only)
    builtin: GemmSchedule | None = None   # the library's own choice, always measured
    builtin_seconds: float | None = None  # its measured time (inf: it failed)
    builtin_rank_in_model: int | None = None  # where the model put it (None: unranked)

    @property
    def is_builtin(self) -> bool:
        """Whether the winner is the built-in choice (nothing better was found)."""
        return self.builtin is not None and self.schedule == self.builtin

    @property
    def gain_over_builtin(self) -> float | None:
        """``built-in time / winner time - 1``: 0 when the built-in choice won, 0.1 when
        the winner is 10 % faster (None without a built-in choice; inf when it failed)."""
        if self.builtin_seconds is None:
            return None
        return self.builtin_seconds / self.seconds - 1

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
        versus = ""
        if self.builtin is not None:
            versus = ("; the built-in choice" if self.is_builtin else
                      f"; {100 * (self.gain_over_builtin or 0):.1f}% faster than the "
                      f"built-in choice ({(self.builtin_seconds or 0) * 1e6:.1f} us)")
        if self.from_cache:
            return (f"{self.key}: {self.schedule} (cached, {self.seconds * 1e6:.1f} us"
                    f"{versus})")
        text = (f"{self.key}: {self.schedule}, {self.seconds * 1e6:.1f} us; measured "
                f"{self.measured} of {self.space_size} candidates{versus}")
        if self.exhaustive and self.model_gap is not None:
            text += (f"; model's pick {self.model_pick} is {100 * self.model_gap:.1f}% "
                     f"slower than the best, best of its top-k "
                     f"{100 * (self.topk_gap or 0):.1f}%, best ranked "
                     f"#{self.best_rank_in_model} by the model")
        return text


def _text_progress(items: Sequence[GemmSchedule], desc: str) -> Iterator[GemmSchedule]:
    """``desc: i/n`` lines on stderr: the bar's stand-in where tqdm is not installed."""
    for i, item in enumerate(items):
        print(f"{desc}: {i + 1}/{len(items)}", file=sys.stderr, flush=True)
        yield item


def _progress(items: Sequence[GemmSchedule], desc: str, enabled: bool
              ) -> Iterable[GemmSchedule]:
    """A tqdm bar over ``items`` when ``enabled`` (text lines without tqdm)."""
    if not enabled:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _text_progress(items, desc)
    return tqdm(items, desc=desc, unit="schedule", leave=False)


class Autotuner:
    """Choose schedules for problems on one GPU (see module doc)."""

    def __init__(self, measure: Callable[[Any], float], gpu: GpuSpec, *,
                 cache: TuneCache | None = None, top_k: int = 8,
                 progress: bool = True, min_gain: float = 0.01) -> None:
        if not isinstance(top_k, int) or top_k < 1:
            raise TuneError(f"top_k={top_k!r}: at least one candidate must be measured "
                            f"(a positive integer)")
        if not (isinstance(min_gain, (int, float)) and 0 <= min_gain < 1):
            raise TuneError(f"min_gain={min_gain!r}: accepted a fraction in [0, 1) (how "
                            f"much faster a candidate must be to replace the built-in "
                            f"choice)")
        self.measure = measure
        self.gpu = gpu
        self.cache = cache if cache is not None else TuneCache()
        self.top_k = top_k
        self.progress = progress
        self.min_gain = float(min_gain)

    def _time(self, s: GemmSchedule, failures: dict[str, str]) -> float:
        try:
            t = float(self.measure(s))
        except Exception as exc:  # a candidate that fails to compile or run loses
            failures[str(s)] = f"{type(exc).__name__}: {exc}"[:200]
            return math.inf
        if not (t > 0 and math.isfinite(t)):
            failures[str(s)] = f"measure returned {t!r}"
            return math.inf
        return t

    def tune(self, problem: Problem, dtype: str, *,
             space: Sequence[GemmSchedule] | None = None,
             builtin: GemmSchedule | None = None, exhaustive: bool = False,
             force: bool = False) -> TuneResult:
        """The best schedule for ``problem`` with ``dtype`` weights: from the cache, or
        by measuring the model's top-k (every feasible schedule if ``exhaustive``) and
        ``builtin``.

        ``space`` None: the library's space for ``problem`` and, unless ``builtin`` is
        given, its built-in choice (what ``quant_linear`` would run untuned). With a
        ``space``, ``builtin`` is measured only if given.
        """
        if not isinstance(problem, Problem):
            raise TuneError(f"problem={problem!r}: expected a lowvm.tune.Problem")
        key = TuneKey.for_problem(self.gpu.name, dtype, problem.group, problem.n,
                                  problem.k, problem.m)
        if not force and not exhaustive:
            hit = self.cache.get(key)
            if hit is not None:
                return self._cached(key, hit, problem.m)
        if space is None:
            from lowvm.tune.space import builtin_schedule, library_space

            builtin = builtin if builtin is not None else builtin_schedule(problem)
            candidates: list[GemmSchedule] = list(library_space(problem, builtin))
        else:
            candidates = list(space)
        ranked = rank(candidates, problem, self.gpu)
        if not ranked and builtin is None:
            raise TuneError(f"tune: no schedule of the {len(candidates)} given fits "
                            f"M={problem.m} N={problem.n} K={problem.k} group={problem.group}")
        order = [s for s, _ in ranked]
        chosen = list(order if exhaustive else order[:self.top_k])
        if builtin is not None and builtin not in chosen:
            chosen.append(builtin)   # measured whatever the model thinks of it
        failures: dict[str, str] = {}
        times = {s: self._time(s, failures)
                 for s in _progress(chosen, f"tuning {key}", self.progress)}
        position = {s: i for i, s in enumerate(order)}
        best = min(chosen, key=lambda s: (times[s], position.get(s, len(order))))
        if not math.isfinite(times[best]):
            raise TuneError(f"tune: every measured schedule failed for {key}: "
                            + "; ".join(f"{k}: {v}" for k, v in list(failures.items())[:3]))
        if (builtin is not None and best != builtin
                and times[best] * (1 + self.min_gain) >= times[builtin]):
            best = builtin   # not faster beyond noise: keep what the library runs anyway
        result = TuneResult(key, best, times[best], from_cache=False, space_size=len(order),
                            measured=len(chosen), failures=failures,
                            model_pick=order[0] if order else None,
                            model_pick_seconds=times[order[0]] if order else None,
                            exhaustive=exhaustive, builtin=builtin,
                            builtin_seconds=times[builtin] if builtin is not None else None,
                            builtin_rank_in_model=(position[builtin] + 1
                                                   if builtin in position else None))
        if exhaustive and order:
            result.best_rank_in_model = position[best] + 1 if best in position else None
            result.topk_best_seconds = min(times[s] for s in order[:self.top_k])
        self.cache.put(key, self._entry(result))
        return result

    @staticmethod
    def _cached(key: TuneKey, hit: dict[str, Any], m: int) -> TuneResult:
        """A result from a cache entry (either format) used at batch ``m``."""
        try:
            builtin = (schedule_from_entry({"schedule": hit["builtin"],
                                            "schedule_type": hit.get("schedule_type")}, m)
                       if hit.get("builtin") is not None else None)
            return TuneResult(key, schedule_from_entry(hit, m), float(hit["seconds"]),
                              from_cache=True, space_size=int(hit.get("space", 0)),
                              builtin=builtin,
                              builtin_seconds=(float(hit["builtin_seconds"])
                                               if hit.get("builtin_seconds") is not None
                                               else None))
        except TuneError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise TuneError(f"tuning cache entry {key} is malformed ({exc!r}); re-tune "
                            f"with force=True") from None

    @staticmethod
    def _entry(r: TuneResult) -> dict[str, Any]:
        entry = {**schedule_to_json(r.schedule), "seconds": r.seconds,
                 "measured": r.measured, "space": r.space_size, "exhaustive": r.exhaustive,
                 "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                     timespec="seconds")}
        if r.builtin is not None:
            entry["builtin"] = schedule_to_json(r.builtin)["schedule"]
            entry["builtin_seconds"] = (r.builtin_seconds
                                        if r.builtin_seconds is not None
                                        and math.isfinite(r.builtin_seconds) else None)
            entry["is_builtin"] = r.is_builtin
        return entry
