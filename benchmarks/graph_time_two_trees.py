"""int4 QuantLinear and cuBLAS float16 in CUDA graphs, for the lowvm checkout at ``argv[1]``.

``python benchmarks/graph_time_two_trees.py <checkout> <label>``: run once per checkout
(e.g. ``git archive <commit> | tar -x -C <dir>`` for the commit before a change, and the
working tree after it) on the same GPU, one call after the other, to time a schedule
change before and after with the float16 baseline in both runs. Each line: label, K x N,
M, µs per call of six rotating int4 g128 weights (two float16 ones) replayed 10 times in
one graph of 4 rounds.
"""
import sys

import torch

sys.path.insert(0, sys.argv[1])
from lowvm import QuantLinear  # noqa: E402


def t(fns, reps=10):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(4):
            for f in fns:
                f()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / (reps * 4 * len(fns))


with torch.no_grad():
    for K, N in [(8192, 10240), (28672, 8192)]:
        lin = torch.nn.Linear(K, N, bias=False, dtype=torch.float16, device="cuda")
        qs = [QuantLinear.from_linear(lin, "int4", 128).cuda() for _ in range(6)]
        ds = [torch.nn.Linear(K, N, bias=False, dtype=torch.float16, device="cuda")
              for _ in range(2)]
        for M in (4, 16):
            x = torch.randn(M, K, dtype=torch.float16, device="cuda")
            lowvm_us = t([lambda q=q, x=x: q(x) for q in qs])
            cublas_us = t([lambda d=d, x=x: d(x) for d in ds])
            print(sys.argv[2], f"{K}x{N}", M, f"lowvm_int4 {lowvm_us:.1f}",
                  f"cublas_fp16 {cublas_us:.1f}", flush=True)
