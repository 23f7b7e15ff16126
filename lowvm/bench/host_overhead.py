"""``python -m lowvm.bench.host_overhead --json PATH``: the host time of eager QuantLinear calls.

Why it exists: issued one by one from Python, outside a CUDA graph (an eager decode loop,
or any timing that launches call by call), a layer costs whatever its host path costs
whenever that is more than the kernel. The goal is at most 20 us of host time per eager
call at any M, so that such timings measure the kernel rather than Python.

What it measures, on a 4096 x 4096 int4 layer with groups of 128 (float16 activations,
M = 1, 16, 256 by default):

* ``host_us``: CPU wall time per eager ``layer(x)``, over ``--calls`` calls issued back
  to back across ``--copies`` distinct layers (as a model's layers follow each other).
  The calls run in chunks of ``--chunk``, with ``torch.cuda.synchronize()`` only between
  chunks, outside the timed windows: a kernel slower than the host would otherwise fill
  the driver's launch queue, after which every launch waits for the GPU and the host time
  read would be the kernel's.
* ``op_host_us``: the same through ``torch.ops.lowvm.quant_linear`` (the custom op, the
  path torch.compile and graph capture take), for comparison.
* ``kernel_us``: the kernel's own time per call, the same calls captured in one CUDA
  graph and replayed (:func:`lowvm.runtime.timing.time_graph`).
* ``launch_us`` and ``alloc_us``: what an eager call cannot go below, timed the same way:
  the layer's prepared kernel launch alone (its bound ``cuLaunchKernel``, fixed buffers)
  and allocating the output ``y`` alone (``x.new_empty``). ``host_us`` minus both is the
  Python of the call.

It prints a table and writes ``{"rows": [...], "ok": bool}`` (``ok``: every ``host_us``
within ``--limit-us``). The table, rows and chunked timing loop are plain Python, tested
without a GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["host_time_us", "make_row", "summarize", "format_table", "parse_args", "main",
           "LIMIT_US", "SHAPE"]

#: the goal: host microseconds per eager call, at any M
LIMIT_US = 20.0
#: (K, N, weight type, group size) of the layer measured
SHAPE = (4096, 4096, "int4", 128)


def host_time_us(call: Callable[[], Any], calls: int, chunk: int, sync: Callable[[], Any],
                 clock: Callable[[], int] = time.perf_counter_ns) -> float:
    """Microseconds of ``clock`` (nanoseconds) per ``call()``, over ``calls`` calls timed in
    chunks of at most ``chunk``; ``sync`` runs before each chunk, outside its window."""
    if calls < 1 or chunk < 1:
        raise ValueError(f"calls and chunk must be >= 1; got calls={calls}, chunk={chunk}")
    total, done = 0, 0
    while done < calls:
        n = min(chunk, calls - done)
        sync()
        start = clock()
        for _ in range(n):
            call()
        total += clock() - start
        done += n
    sync()
    return total / calls / 1e3


def make_row(m: int, host_us: float, op_host_us: float, kernel_us: float, calls: int,
             chunk: int, kernel: str | None = None, limit_us: float = LIMIT_US,
             launch_us: float | None = None, alloc_us: float | None = None
             ) -> dict[str, Any]:
    """One result row; ``host_ok`` when the eager host time is within ``limit_us``."""
    def rounded(us):
        return None if us is None else round(us, 3)

    return {"m": m, "host_us": round(host_us, 3), "op_host_us": round(op_host_us, 3),
            "kernel_us": round(kernel_us, 3), "host_ok": host_us <= limit_us,
            "calls": calls, "chunk": chunk, "kernel": kernel,
            "launch_us": rounded(launch_us), "alloc_us": rounded(alloc_us)}


def summarize(rows: Sequence[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """The JSON document: the rows, ``ok`` (every row's host time within its limit, and at
    least one row) and ``extra`` fields (device, shape, limit)."""
    return {**extra, "rows": list(rows), "ok": bool(rows) and all(r["host_ok"] for r in rows)}


def format_table(rows: Sequence[dict[str, Any]], limit_us: float = LIMIT_US) -> str:
    """The rows as an aligned text table."""
    head = ("M", "host us", "op host us", "kernel us (graph)", f"host <= {limit_us:g} us",
            "kernel", "launch us", "alloc us")

    def us(value):
        return "-" if value is None else f"{value:.2f}"

    body = [(str(r["m"]), f"{r['host_us']:.2f}", f"{r['op_host_us']:.2f}",
             f"{r['kernel_us']:.2f}", "yes" if r["host_ok"] else "NO", r.get("kernel") or "-",
             us(r.get("launch_us")), us(r.get("alloc_us")))
            for r in rows]
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths))
                     for line in (head, *body))


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas "
                                         f"(e.g. 1,16,256); got {text!r}")
    return values


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected one positive integer; got {text!r}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m lowvm.bench.host_overhead",
        description="Host time of eager QuantLinear calls (4096 x 4096 int4 g128) against "
                    "the kernel's time in a CUDA graph.")
    parser.add_argument("--json", metavar="PATH", help="write the result document here")
    parser.add_argument("--m", type=_positive_ints, default=[1, 16, 256],
                        help="batch sizes, comma-separated (default 1,16,256)")
    parser.add_argument("--calls", type=_positive_int, default=10_000,
                        help="eager calls timed per M (default 10000)")
    parser.add_argument("--chunk", type=_positive_int, default=200,
                        help="calls between synchronisations, below the launch queue's "
                             "depth (default 200)")
    parser.add_argument("--copies", type=_positive_int, default=8,
                        help="distinct layers the calls cycle through (default 8)")
    parser.add_argument("--limit-us", type=float, default=LIMIT_US,
                        help=f"host time per call that counts as ok (default {LIMIT_US:g})")
    return parser.parse_args(argv)


def _layers(copies: int) -> list[Any]:
    """``copies`` 4096 x 4096 int4 g128 layers of random codes and scales on CUDA."""
    import torch

    from lowvm.nn.layer.quant_linear import QuantLinear

    k, n, wtype, group = SHAPE
    layers = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for _ in range(copies):
        layer = QuantLinear(k, n, wtype, group, device="cuda")
        codes = torch.randint(0, 16, (n, k), device="cuda", generator=gen)
        scales = torch.rand(k // group, n, device="cuda", generator=gen) * 1e-2 + 1e-3
        layer.set_codes(codes, scales.half(), None)
        layers.append(layer)
    return layers


def _prepared(layer: Any) -> Any:
    """The layer's last prepared eager launch (a ``GemmLaunch``), or None."""
    launches = getattr(layer, "__dict__", {}).get("_eager_launches")
    prepared = list(getattr(launches, "_launches", {}).values())
    return prepared[-1] if prepared else None


def _kernel_name(layer: Any) -> str | None:
    """The GEMM program the layer's last prepared eager launch runs, where there is one."""
    return getattr(_prepared(layer), "kernel", None)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The rows on this machine's current CUDA device (see the module docstring)."""
    import torch

    layers = _layers(args.copies)
    with torch.no_grad():
        rows = [_row(layers, m, args) for m in args.m]
    return summarize(rows, device=torch.cuda.get_device_name(), torch=torch.__version__,
                     shape={"k": SHAPE[0], "n": SHAPE[1], "wtype": SHAPE[2],
                            "group_size": SHAPE[3], "activation": "float16"},
                     limit_us=args.limit_us, copies=args.copies)


def _row(layers: list[Any], m: int, args: argparse.Namespace) -> dict[str, Any]:
    """The row of batch size ``m``: eager and custom-op host time, graph kernel time."""
    import torch

    from lowvm.runtime.timing import time_graph

    x = torch.randn(m, SHAPE[0], dtype=torch.float16, device="cuda")
    next_layer = itertools.cycle(layers).__next__  # the loop's own cost: ~0.1 us
    op = torch.ops.lowvm.quant_linear

    def eager() -> None:
        next_layer()(x)

    def custom_op() -> None:
        layer = next_layer()
        op(x, layer.qweight, layer.scales, layer.zeros, layer.bias, SHAPE[2], SHAPE[3])

    for _ in range(3 * len(layers)):  # compile, prepare, allocate
        eager()
        custom_op()
    sync = torch.cuda.synchronize
    host = host_time_us(eager, args.calls, args.chunk, sync)
    op_host = host_time_us(custom_op, args.calls, args.chunk, sync)
    graph = time_graph([lambda layer=layer: layer(x) for layer in layers])
    # the floors: each layer's bound launch with one fixed y, and the allocation alone
    y = x.new_empty((m, SHAPE[1]))
    bound = itertools.cycle([_prepared(layer).gemm for layer in layers]).__next__
    ptr, out = x.data_ptr(), y.data_ptr()
    launch = host_time_us(lambda: bound()(ptr, out), args.calls, args.chunk, sync)
    alloc = host_time_us(lambda: x.new_empty((m, SHAPE[1])), args.calls, args.chunk, sync)
    return make_row(m, host, op_host, graph.median_us, args.calls, args.chunk,
                    _kernel_name(layers[0]), args.limit_us, launch, alloc)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print the table, write ``--json``; 0 when ok, 1 when not, 2 without CUDA."""
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("lowvm.bench.host_overhead: needs a CUDA device (torch.cuda.is_available() is "
              "False); run it on the GPU machine", file=sys.stderr)
        return 2
    result = measure(args)
    print(f"eager QuantLinear host time, {SHAPE[0]} x {SHAPE[1]} {SHAPE[2]} g{SHAPE[3]}, "
          f"float16, {result['device']}")
    print(format_table(result["rows"], args.limit_us))
    print("ok" if result["ok"] else f"NOT ok: some host time is above {args.limit_us:g} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
