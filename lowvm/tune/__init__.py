"""Schedules, a static performance model and an autotuner with an on-disk cache.

A :class:`Schedule` (tile sizes, warps, pipeline stages, split-K factor) is what a VM
program template takes as compile-time constants (``schedule.constants()``). The
:class:`Autotuner` ranks a path's schedule space with :mod:`lowvm.tune.model`, measures
only the top candidates through an injected ``measure(schedule) -> seconds`` and keeps
the best per (GPU, dtype, group, N, K, M bucket) in a JSON cache
(``LOWVM_TUNE_CACHE``, default ``~/.cache/lowvm/tune.json``).
"""

from lowvm.tune.cache import TuneCache, TuneKey, default_cache_path, m_bucket
from lowvm.tune.errors import TuneError
from lowvm.tune.gpu import H100_SXM, GpuSpec
from lowvm.tune.model import Estimate, estimate, rank
from lowvm.tune.schedule import PATHS, Problem, Schedule, feasible, path_for_m, schedule_space
from lowvm.tune.tuner import Autotuner, TuneResult

__all__ = [
    "Autotuner",
    "TuneResult",
    "TuneCache",
    "TuneKey",
    "TuneError",
    "default_cache_path",
    "m_bucket",
    "GpuSpec",
    "H100_SXM",
    "Estimate",
    "estimate",
    "rank",
    "PATHS",
    "Problem",
    "Schedule",
    "feasible",
    "path_for_m",
    "schedule_space",
]
