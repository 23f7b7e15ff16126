"""Would reading a GEMM's weights into the L2 *before* it runs pay, in a decode step?

A decode step's DRAM is idle during attention, norms and every kernel's ramp and tail.
This probe times, inside one CUDA graph of ``--layers`` layers (each with its own weight
copy, so the L2 starts cold), a stand-in for the work between two GEMMs (decode SDPA over
a small cache) followed by ``quant_linear`` at M = 1, four ways:

- ``cold``: stand-in, GEMM;
- ``side``: a side stream reads the first ``--fraction`` of the GEMM's weight (a torch
  reduction) while the main stream runs the stand-in; the GEMM waits for both;
- ``hot``: every layer uses the same weight copy (the L2 bound for the GEMM);
- ``standin``: the stand-in alone (subtract it to get the GEMM's share).

Usage: python benchmarks/l2_prefetch_probe.py --out probe.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np
import torch

from lowvm.kernels.library import choose_schedule, prepare_weight, quant_linear, quantize_to_codes


def graph_us(body, layers: int, replays: int = 20) -> float:
    """µs per layer of ``body(i)`` for i < layers, captured in one graph and replayed."""
    for i in range(layers):
        body(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(layers):
            body(i)
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(replays):
        s.record()
        g.replay()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3 / layers)
    g.reset()
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="l2_prefetch_probe.json")
    ap.add_argument("--shapes", default="4096x4096,4096x6144,14336x4096,4096x28672")
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--fractions", default="1,0.5,0.25")
    ap.add_argument("--cache", type=int, default=256, help="stand-in SDPA cache length")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    q = torch.randn(1, 32, 1, 128, device="cuda", dtype=torch.float16)
    kv = torch.randn(2, 1, 32, args.cache, 128, device="cuda", dtype=torch.float16)

    def standin():
        return torch.nn.functional.scaled_dot_product_attention(q, kv[0], kv[1])

    rows = []
    side = torch.cuda.Stream()
    for spec in args.shapes.split(","):
        k, n = (int(v) for v in spec.split("x"))
        codes, scales = quantize_to_codes(rng.standard_normal((n, k), dtype=np.float32),
                                          "int4", 128)
        qw = prepare_weight(codes, scales, "int4", 128)
        copies = [qw] + [dataclasses.replace(qw, packed=qw.packed.clone(),
                                             scales=qw.scales.clone())
                         for _ in range(args.layers - 1)]
        x = torch.randn(1, k, device="cuda", dtype=torch.float16)
        sched = choose_schedule(1, n, k, qw.bk)
        wbytes = qw.packed.numel() + qw.scales.numel() * 2

        def layer(i, w=None, fraction=0.0, copies=copies, x=x, sched=sched):
            c = copies[i] if w is None else w
            if fraction:
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    flat = c.packed.view(-1)
                    flat[: int(flat.numel() * fraction) // 4 * 4].view(torch.int32).max()
                    c.scales.view(-1)[: int(c.scales.numel() * fraction)].max()
            standin()
            if fraction:
                torch.cuda.current_stream().wait_stream(side)
            quant_linear(x, c, sched)

        base = graph_us(lambda i: standin(), args.layers)
        cold = graph_us(lambda i: layer(i), args.layers)
        hot = graph_us(lambda i, c0=copies[0]: layer(i, c0), args.layers)
        row = dict(k=k, n=n, mb=wbytes / 2**20, split=sched.split, floor_us=wbytes / 3.04e6,
                   standin_us=base, cold_us=cold, hot_us=hot)
        for f in (float(v) for v in args.fractions.split(",")):
            row[f"side_{f:g}_us"] = graph_us(lambda i, f=f: layer(i, fraction=f), args.layers)
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(args.out, "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"),
                       rows=rows), f, indent=1)
    print("\n K x N         MB   floor standin  cold(gemm)  hot(gemm)  side f: gemm")
    for r in rows:
        sides = "  ".join(f"{key[5:-3]}:{r[key] - r['standin_us']:.1f}"
                          for key in r if key.startswith("side_"))
        print(f" {r['k']}x{r['n']:<7} {r['mb']:5.1f} {r['floor_us']:6.1f} {r['standin_us']:6.1f}"
              f"  {r['cold_us'] - r['standin_us']:9.1f}  {r['hot_us'] - r['standin_us']:9.1f}"
              f"  {sides}")


if __name__ == "__main__":
    main()
