"""Host-side cost of one ``Kernel.launch``, eager and replayed from a CUDA graph.

A decode step launches hundreds of small kernels, so the microseconds the host spends per
launch (argument checks, the cuda-python call) can bound tokens per second; the target is
under 10 µs. This times 10,000 launches of a trivial kernel (one pointer, one int) with
``time.perf_counter``, with no synchronisation inside the loop and one at the end, and
compares with:

* a bare ``cuLaunchKernel`` with precomputed arguments (the floor lowvm's checks add to),
* ``Kernel.check_args`` alone,
* the same launches captured once into a CUDA graph and replayed (what a graph-captured
  decode step pays per kernel).

Usage: ``python benchmarks/launch_overhead.py [--out result.json] [--launches 10000]``.
Without a CUDA device it prints ``skipped: no CUDA device`` and exits with code 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

SOURCE = r"""
extern "C" __global__ void touch(float* p, int n) {
    if (n < 0 && threadIdx.x == 0) p[blockIdx.x] = 0.0f;  // never true: an empty launch
}
"""


def _write(path: str | None, result: dict[str, object]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=2) + "\n")


def _time(fn: Callable[[], object], n: int, sync: Callable[[], None]) -> tuple[float, float]:
    """(host seconds for n calls, seconds including the final synchronisation)."""
    sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    sync()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the results as JSON to this path")
    parser.add_argument("--launches", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=500)
    opts = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        _write(opts.out, {"skipped": "no CUDA device"})
        return 0

    import ctypes

    from cuda.bindings import driver as cu

    import lowvm
    from lowvm.runtime import Kernel, compile_cubin, compiler_identity, driver_version

    n = opts.launches
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    t0 = time.perf_counter()
    cubin = compile_cubin(SOURCE, arch)
    compile_s = time.perf_counter() - t0
    kernel = Kernel(
        cubin, "touch", 32, 0, [("p", "pointer", lowvm.float32), ("n", "scalar", lowvm.int32)]
    )
    buf = torch.zeros(1024, device="cuda")
    args = [buf, 1]
    grid = (1, 1, 1)
    sync = torch.cuda.synchronize

    def launch() -> None:
        kernel.launch(grid, args)

    for _ in range(opts.warmup):
        launch()
    eager_host, eager_total = _time(launch, n, sync)

    # The floor: cuLaunchKernel itself, arguments and stream precomputed.
    fn = kernel._functions[torch.cuda.current_device()]
    stream = torch.cuda.current_stream().cuda_stream
    packed = ((buf.data_ptr(), 1), (ctypes.c_void_p, ctypes.c_int))

    def raw() -> None:
        cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, packed, 0)

    for _ in range(opts.warmup):
        raw()
    raw_host, raw_total = _time(raw, n, sync)

    check_host, _ = _time(lambda: kernel.check_args(args, 0), n, sync)

    # Graph: capture n launches once, replay (after one warm replay).
    graph = torch.cuda.CUDAGraph()
    capture_stream = torch.cuda.Stream()
    with torch.cuda.stream(capture_stream):
        t0 = time.perf_counter()
        with torch.cuda.graph(graph):
            for _ in range(n):
                launch()
        capture_s = time.perf_counter() - t0
    graph.replay()
    sync()
    replay_host, replay_total = _time(graph.replay, 1, sync)

    us = 1e6 / n
    result = {
        "device": torch.cuda.get_device_name(),
        "arch": arch,
        "compiler": "/".join(compiler_identity("auto")),
        "driver": driver_version(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "launches": n,
        "compile_s": round(compile_s, 4),
        "eager_host_us_per_launch": round(eager_host * us, 3),
        "eager_total_us_per_launch": round(eager_total * us, 3),
        "raw_cuLaunchKernel_host_us": round(raw_host * us, 3),
        "raw_cuLaunchKernel_total_us": round(raw_total * us, 3),
        "check_args_us": round(check_host * us, 3),
        "graph_capture_s": round(capture_s, 4),
        "graph_replay_host_us_per_launch": round(replay_host * us, 4),
        "graph_replay_total_us_per_launch": round(replay_total * us, 4),
    }
    width = max(len(k) for k in result)
    for key, value in result.items():
        print(f"{key:<{width}}  {value}")
    _write(opts.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
