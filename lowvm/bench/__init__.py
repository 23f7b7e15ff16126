"""Benchmark harness for lowvm's quantized GEMMs against cuBLAS, tinygemm and others.

``python -m lowvm.bench`` times every chosen kernel on Llama-3 projection shapes with
the method of DESIGN.md ("How we measure"): CUDA events, warm-up, a 512 MB L2 flush
before each timed run, the median of at least 30 runs, every baseline in the same
process. ``python -m lowvm.bench.plot results.json`` draws the results. The modules
that count bytes, parse arguments and build the JSON import no GPU code, so they are
tested on the CPU.
"""

from lowvm.bench.errors import BenchError

__all__ = ["BenchError"]
