"""The timing method of DESIGN.md, shared by the benchmark scripts: CUDA events around one
call, something run ahead of each timing (an L2 flush), median of ``runs``."""

from __future__ import annotations

import statistics
import time

import torch

#: warm-up before timing: the GPU drops to idle clocks while the host prepares weights or
#: compiles, and one call does not bring them back (a first M = 1 timing after seconds of
#: host work measured 128.5 us instead of ~35 on 4096 x 28672: NOTES.md, fourth session)
WARMUP_S = 0.05


def median_us(fn, before, runs: int = 30) -> float:
    """Median µs of ``fn`` between CUDA events, ``before()`` enqueued ahead of each timing
    (it must keep the GPU busy for longer than the host takes to launch ``fn``, or the
    timing includes the host's launch path: see ``flush_effect.py``'s "none"), after
    ``WARMUP_S`` seconds of the same calls."""
    deadline = time.perf_counter() + WARMUP_S
    while True:
        before()
        fn()
        torch.cuda.synchronize()
        if time.perf_counter() > deadline:
            break
    times = []
    for _ in range(runs):
        before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)
