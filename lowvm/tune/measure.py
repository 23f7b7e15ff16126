"""A GPU ``measure`` for the autotuner, by the benchmark's method.

``cuda_measure(build)`` turns ``build(schedule) -> run`` (compile the kernel with
``schedule.constants()``, bind its arguments, return a no-argument launcher) into the
``measure(schedule) -> seconds`` the :class:`~lowvm.tune.Autotuner` takes: CUDA events,
warm-up, the L2 flushed before each run, the median of ``runs``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lowvm.tune.schedule import Schedule

__all__ = ["cuda_measure"]


def cuda_measure(build: Callable[[Schedule], Callable[[], Any]], runs: int = 30,
                 warmup: int = 3) -> Callable[[Schedule], float]:
    """A measure function timing ``build(schedule)()`` on the current GPU."""
    from lowvm.bench.timing import L2Flusher, time_cuda

    flush: list[L2Flusher] = []  # allocated on first use, shared by every candidate

    def measure(schedule: Schedule) -> float:
        if not flush:
            flush.append(L2Flusher())
        run = build(schedule)
        return time_cuda(run, runs=runs, warmup=warmup, flush=flush[0]).median_us * 1e-6

    return measure
