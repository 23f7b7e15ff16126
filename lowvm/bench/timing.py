"""GPU timing by DESIGN.md's method, and the HBM bandwidth of the machine itself.

Every timed run is preceded by a write of a 512 MB buffer, which evicts the 50 MB L2:
a 4-bit weight of a Llama projection fits in L2 and would otherwise be read from cache,
not HBM. CUDA events bracket the kernel alone (the flush is outside them), and the
median of the runs is the figure, so one slow run (a clock change, a context switch)
does not move it. ``summarize`` is pure Python so the statistics are tested on the CPU.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lowvm.bench.errors import BenchError

__all__ = [
    "FLUSH_BYTES",
    "MIN_RUNS",
    "Timing",
    "HbmBandwidth",
    "summarize",
    "L2Flusher",
    "time_cuda",
    "measure_hbm",
]

FLUSH_BYTES = 512 * 1024 * 1024
MIN_RUNS = 30


@dataclass(frozen=True)
class Timing:
    """Statistics of the runs of one kernel, in microseconds."""

    median_us: float
    min_us: float
    p10_us: float
    p90_us: float
    runs: int


def summarize(samples_us: list[float]) -> Timing:
    """Median, minimum and 10th/90th percentiles of per-run times."""
    if not samples_us:
        raise BenchError("summarize: no timed runs")
    ordered = sorted(samples_us)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * (len(ordered) - 1) + 0.5))]

    return Timing(statistics.median(ordered), ordered[0], pct(0.1), pct(0.9), len(ordered))


class L2Flusher:
    """A 512 MB device buffer written before each timed run."""

    def __init__(self, nbytes: int = FLUSH_BYTES) -> None:
        import torch

        self.buffer = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        self._value = 0

    def __call__(self) -> None:
        self._value = (self._value + 1) & 0xFF  # a new value each time: a real write
        self.buffer.fill_(self._value)


def time_cuda(fn: Callable[[], Any], runs: int = MIN_RUNS, warmup: int = 5,
              flush: L2Flusher | None = None) -> Timing:
    """Time ``fn`` on the current stream: warm-up, then ``runs`` event-timed runs,
    each after an L2 flush (when ``flush`` is given)."""
    import torch

    if runs < 1:
        raise BenchError(f"runs={runs}: at least one timed run is needed")
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for i in range(runs):
        if flush is not None:
            flush()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return summarize([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)])


@dataclass(frozen=True)
class HbmBandwidth:
    """Measured HBM bandwidth in TB/s: a device-to-device copy (read + write bytes
    counted) and a read-only reduction."""

    copy_tbps: float
    read_tbps: float
    nbytes: int


def measure_hbm(nbytes: int = 2 * 1024**3, runs: int = MIN_RUNS) -> HbmBandwidth:
    """Copy ``nbytes`` and sum ``nbytes`` of float32, far larger than L2."""
    import torch

    def timings() -> tuple[Timing, Timing]:
        src = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
        dst = torch.empty_like(src)
        return (time_cuda(lambda: dst.copy_(src), runs=runs, warmup=3),
                time_cuda(lambda: torch.sum(src), runs=runs, warmup=3))

    copy, read = timings()
    torch.cuda.empty_cache()  # give the 2 x nbytes back before the kernels run
    return HbmBandwidth(
        copy_tbps=2 * nbytes / (copy.median_us * 1e-6) / 1e12,
        read_tbps=nbytes / (read.median_us * 1e-6) / 1e12,
        nbytes=nbytes,
    )
