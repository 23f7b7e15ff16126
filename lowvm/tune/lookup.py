"""The tuning cache as ``quant_linear``'s schedule source (registered by ``lowvm``).

:func:`tuned_schedule` answers :func:`lowvm.kernels.schedule_source.set_schedule_source`'s
question, "a measured schedule for this batch and weight?", from the autotuner's cache.
"""

from __future__ import annotations

from typing import Any

from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.kernels.weights import QuantWeight
from lowvm.runtime.workspaces import warn_once
from lowvm.tune.cache import TuneCache, TuneKey, schedule_from_entry
from lowvm.tune.errors import TuneError
from lowvm.tune.space import runnable_reason

__all__ = ["tuned_schedule"]


def tuned_schedule(m: int, weight: QuantWeight, cache: Any = None) -> GemmSchedule | None:
    """The autotuner's pick (:mod:`lowvm.tune`) for this GPU, weight and M bucket, from its
    cache (``$LOWVM_TUNE_CACHE``, default ``~/.cache/lowvm/tune.json``), when there is
    one that this weight's repacked format can run; else None (``choose_schedule``).

    The entry is rebuilt field for field (``x_whole``, ``x_rows``, ``prefetch``,
    ``k_slice``, ...: the tuner measured exactly that schedule against the built-in
    choice); an entry of the first cache format is mapped as before, with a one-time
    warning. A pick this call could not run (another format, K steps it does not divide,
    x_whole too short for this K) is ignored, so the planner never raises on it.
    ``quant_linear`` asks once per call shape and process: a schedule tuned later is used
    by the next process. An unreadable cache or entry is reported once and ignored.
    """
    try:
        gpu = _device_name(weight.packed.device)
        entry = (cache or TuneCache()).get(TuneKey.for_problem(
            gpu, weight.wtype.name, weight.group, weight.n, weight.k, m))
        if entry is None:
            return None
        s = schedule_from_entry(entry, m)
    except TuneError as exc:
        warn_once(f"tune-cache: {exc}")
        return None
    if runnable_reason(s, m, weight.n, weight.k, weight.bk) is not None:
        return None
    return s


def _device_name(device: Any) -> str:
    import torch

    return torch.cuda.get_device_name(device)
