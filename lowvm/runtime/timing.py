"""GPU timing methods shared by the benchmark harness and the autotuner.

A quantized GEMM's 4-bit weight for a Llama projection fits in the H100's 50 MB L2, so a
naive loop times cache reads, not HBM. Four methods, each with its reason to exist:

* ``write-flushed``: CUDA events around one call, after writing a 512 MB buffer (the
  L2 then holds dirty lines of that buffer, which it must write back);
* ``read-flushed``: the same, after reading a 512 MB buffer (the L2 holds clean lines);
* ``graph``: R calls on R distinct weight copies (200 MB or more together, so every
  weight comes from HBM) captured back to back in one CUDA graph and replayed behind a
  GPU sleep, so no host launch gap is timed; the time per call is how a decode step
  runs its GEMMs;
* ``eager``: the same calls issued back to back from Python, no flush: host-bound
  where the host path is slower than the kernel, as in an eager generate loop.

Each figure is the median over runs (or replays), so one slow run (a clock change, a
context switch) does not move it. :func:`summarize` and :func:`copies_for` are pure
Python, tested on the CPU.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from lowvm.errors import LowvmError

__all__ = [
    "METHODS",
    "FLUSH_BYTES",
    "GRAPH_MIN_BYTES",
    "MIN_RUNS",
    "MIN_REPLAYS",
    "TimingError",
    "Timing",
    "HbmBandwidth",
    "summarize",
    "copies_for",
    "L2Flusher",
    "L2ReadFlusher",
    "time_cuda",
    "time_flushed",
    "time_graph",
    "time_eager",
    "measure_hbm",
]

#: The methods, by the names used on the command line and in result rows.
METHODS = ("graph", "eager", "read-flushed", "write-flushed")
FLUSH_BYTES = 512 * 1024 * 1024
#: Weight bytes the copies of a graph or eager timing hold together (4x the L2).
GRAPH_MIN_BYTES = 200 * 10**6
MIN_RUNS = 30
MIN_REPLAYS = 15
#: GPU cycles slept ahead of the timed replays: longer than the host needs to enqueue them.
_SLEEP_CYCLES = 2_000_000


class TimingError(LowvmError, ValueError):
    """A timing argument (runs, calls, method) that cannot be used."""


@dataclass(frozen=True)
class Timing:
    """Statistics of the runs of one kernel, in microseconds."""

    median_us: float
    min_us: float
    p10_us: float
    p90_us: float
    runs: int


def summarize(samples_us: Sequence[float]) -> Timing:
    """Median, minimum and 10th/90th percentiles of per-run times."""
    if not samples_us:
        raise TimingError("summarize: no timed runs")
    ordered = sorted(samples_us)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * (len(ordered) - 1) + 0.5))]

    return Timing(statistics.median(ordered), ordered[0], pct(0.1), pct(0.9), len(ordered))


def copies_for(bytes_per_copy: int, total: int = GRAPH_MIN_BYTES, cap: int = 64) -> int:
    """How many distinct weight copies hold ``total`` bytes together (at least 2)."""
    if bytes_per_copy <= 0:
        raise TimingError(f"bytes_per_copy={bytes_per_copy}: must be positive")
    return max(2, min(cap, math.ceil(total / bytes_per_copy)))


class L2Flusher:
    """A 512 MB device buffer written before each timed run (``write-flushed``)."""

    def __init__(self, nbytes: int = FLUSH_BYTES) -> None:
        import torch

        self.buffer = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        self._value = 0

    def __call__(self) -> None:
        self._value = (self._value + 1) & 0xFF  # a new value each time: a real write
        self.buffer.fill_(self._value)


class L2ReadFlusher:
    """A 512 MB device buffer read (reduced) before each timed run (``read-flushed``)."""

    def __init__(self, nbytes: int = FLUSH_BYTES) -> None:
        import torch

        self.buffer = torch.ones(nbytes, dtype=torch.uint8, device="cuda")

    def __call__(self) -> None:
        self.buffer.max()


def time_cuda(fn: Callable[[], Any], runs: int = MIN_RUNS, warmup: int = 5,
              flush: Callable[[], Any] | None = None) -> Timing:
    """Time ``fn`` on the current stream: warm-up, then ``runs`` event-timed runs, each
    after ``flush()`` when given (outside the events)."""
    import torch

    if runs < 1:
        raise TimingError(f"runs={runs}: at least one timed run is needed")
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


def time_flushed(fn: Callable[[], Any], method: str, runs: int = MIN_RUNS, warmup: int = 5,
                 flushers: dict[str, Callable[[], Any]] | None = None) -> Timing:
    """``read-flushed`` or ``write-flushed`` timing of one call; ``flushers`` caches the
    512 MB buffers across calls (keyed by method)."""
    cache = flushers if flushers is not None else {}
    if method not in cache:
        if method == "write-flushed":
            cache[method] = L2Flusher()
        elif method == "read-flushed":
            cache[method] = L2ReadFlusher()
        else:
            raise TimingError(f"method={method!r}: flushed timing is 'read-flushed' or "
                              "'write-flushed'")
    return time_cuda(fn, runs=runs, warmup=warmup, flush=cache[method])


def _check_calls(calls: Sequence[Callable[[], Any]]) -> None:
    if not calls:
        raise TimingError("calls: at least one call is needed")


def time_graph(calls: Sequence[Callable[[], Any]], replays: int = MIN_REPLAYS,
               warmup: int = 3) -> Timing:
    """Per-call time of ``calls`` captured back to back in one CUDA graph: each of
    ``replays`` timed replays runs behind a GPU sleep, so the host's launch is hidden."""
    import torch

    _check_calls(calls)
    if replays < 1:
        raise TimingError(f"replays={replays}: at least one replay is needed")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile, allocate workspaces outside the capture
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(_SLEEP_CYCLES)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graph
    return summarize(samples)


def time_eager(calls: Sequence[Callable[[], Any]], replays: int = MIN_REPLAYS,
               rounds: int = 4) -> Timing:
    """Per-call time of ``calls`` issued eagerly back to back, ``rounds`` times per
    sample, no flush: bounded by the host where its path is slower than the kernel."""
    import torch

    _check_calls(calls)
    for call in calls:
        call()
    torch.cuda.synchronize()
    samples = []
    for _ in range(replays):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(rounds):
            for call in calls:
                call()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / (rounds * len(calls)))
    return summarize(samples)


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

    def timings() -> tuple[Timing, Timing]:  # the buffers die with this frame
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
