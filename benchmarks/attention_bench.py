"""One decode step's attention of a Llama-3-8B layer (32 query heads, 8 KV heads, head_dim
128, a float16 static cache of ``length`` positions), timed inside CUDA graphs:

* ``lowvm``: ``torch.ops.lowvm.decode_attention`` (the VM program), mask conversion included;
* ``repeat_sdpa``: what transformers' SDPA path runs under torch.compile (``repeat_kv`` of
  K and V, then SDPA with the boolean mask);
* ``gqa_sdpa``: SDPA with ``enable_gqa=True`` and no mask (flash; a lower bound for torch,
  not a correct static-cache step: it attends to the unfilled positions too).

Median of 10 replays of a graph of 50 calls, per call, in microseconds; JSON to --json.

    python benchmarks/attention_bench.py --lengths 144,512,1024,2048,4096 --batches 1,16
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

import lowvm
import lowvm.nn.attention as attn
from lowvm.kernels.decode_attention import decode_attention

HEADS, KV_HEADS, DIM = 32, 8, 128


def graph_us(fn, calls: int = 50, replays: int = 10) -> float:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / calls)
    return statistics.median(times)


def measure(batch: int, length: int, stages: list[int]) -> dict:
    """One row: every variant's microseconds per call at this batch and cache length."""
    torch.manual_seed(0)
    q = torch.randn(batch, HEADS, 1, DIM, dtype=torch.float16, device="cuda")
    k, v = (torch.randn(batch, KV_HEADS, length, DIM, dtype=torch.float16, device="cuda")
            for _ in range(2))
    mask = torch.zeros(batch, 1, 1, length, dtype=torch.bool, device="cuda")
    mask[..., : length - 13] = True  # a static cache with its last slots empty
    scale = DIM ** -0.5

    def lowvm_call():
        m = attn._keep_mask(mask, batch, length, q.device)
        return torch.ops.lowvm.decode_attention(q.view(batch, HEADS, DIM), k, v, m, scale)

    def repeat_sdpa():
        kr = k.repeat_interleave(HEADS // KV_HEADS, 1)
        vr = v.repeat_interleave(HEADS // KV_HEADS, 1)
        return F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask, scale=scale)

    def gqa_sdpa():
        return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)

    def staged(program):
        def call():
            m = attn._keep_mask(mask, batch, length, q.device)
            out = torch.empty(batch, HEADS, DIM, dtype=q.dtype, device=q.device)
            program(batch, length, q, k, v, m, out, scale)
            return out
        return call

    variants = [("lowvm", lowvm_call), ("repeat_sdpa", repeat_sdpa), ("gqa_sdpa", gqa_sdpa)]
    for depth in stages:
        program = lowvm.compile(decode_attention, kv_heads=KV_HEADS, group=HEADS // KV_HEADS,
                                head_dim=DIM, stages=depth)
        variants.append((f"lowvm_s{depth}", staged(program)))
    ref = repeat_sdpa().view(batch, HEADS, DIM).float()
    err = (lowvm_call().float() - ref).abs().max().item()
    row = {"batch": batch, "length": length, "max_abs_diff_vs_sdpa": err}
    for name, fn in variants:
        try:
            row[f"{name}_us"] = graph_us(fn)
        except Exception as exc:  # noqa: BLE001  (recorded)
            row[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:200]
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="144,512,1024,2048,4096")
    p.add_argument("--batches", default="1,16")
    p.add_argument("--stages", default="",
                   help="comma-separated software-pipeline depths of the program to time "
                        "besides the op's own (e.g. 3,4: rows lowvm_s3_us, lowvm_s4_us)")
    p.add_argument("--json")
    args = p.parse_args()
    stages = [int(x) for x in args.stages.split(",") if x]
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        for length in (int(n) for n in args.lengths.split(",")):
            rows.append(measure(batch, length, stages))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'batch':>5s} {'length':>6s} {'lowvm us':>9s} {'repeat+sdpa':>11s} "
          f"{'gqa sdpa':>9s} {'max diff':>9s}  other variants (us)")
    for r in rows:
        print(f"{r['batch']:5d} {r['length']:6d} {r.get('lowvm_us', float('nan')):9.2f} "
              f"{r.get('repeat_sdpa_us', float('nan')):11.2f} "
              f"{r.get('gqa_sdpa_us', float('nan')):9.2f} {r['max_abs_diff_vs_sdpa']:9.1e}  "
              + " ".join(f"{k[:-3]} {v:.2f}" for k, v in r.items()
                         if k.startswith("lowvm_s") and k.endswith("_us")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
