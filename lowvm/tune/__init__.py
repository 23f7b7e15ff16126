"""Schedule spaces, a static performance model and an autotuner with an on-disk cache.

The :class:`Autotuner` searches, by default, :func:`library_space`: the
:class:`~lowvm.kernels.gemm_schedule.GemmSchedule` variants of the library's built-in
choice (``choose_schedule``) that ``quant_linear`` can run for the problem. It ranks
them with :mod:`lowvm.tune.model`, measures the top candidates and always the built-in
choice through an injected ``measure(schedule) -> seconds``, and keeps the best per
(GPU, dtype, group, N, K, M bucket) in a JSON cache (``LOWVM_TUNE_CACHE``, default
``~/.cache/lowvm/tune.json``) that ``quant_linear`` reads back (``tuned_schedule``).
"""

from lowvm.tune.cache import TuneCache, TuneKey, default_cache_path, m_bucket
from lowvm.tune.errors import TuneError
from lowvm.tune.gpu import H100_SXM, GpuSpec
from lowvm.tune.model import Estimate, estimate, rank
from lowvm.tune.problem import Problem
from lowvm.tune.space import builtin_schedule, library_space, runnable_reason
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
    "Problem",
    "builtin_schedule",
    "library_space",
    "runnable_reason",
]
