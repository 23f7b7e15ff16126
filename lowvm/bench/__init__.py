"""Benchmark harness for lowvm's quantized GEMMs against cuBLAS, tinygemm, GemLite, Marlin.

``python -m lowvm.bench <scenario>`` runs one of the scenarios of
:mod:`lowvm.bench.scenarios` (GEMM tables, the schedules sweep, the serving loop, the
GPU tests, the sanitizers); with options only (``--shape``, ``--m``, ...) it times an
ad-hoc GEMM table. Timings follow :mod:`lowvm.runtime.timing` (graph, eager,
read-flushed, write-flushed; medians), every baseline in the same process, each result
checked against a float64 reference first. Results go to
``benchmarks/results/<date>/<scenario>/<gpu>.json`` with their environment;
``report`` turns them into docs/performance.md's tables and ``compare`` guards against
regressions. The modules that count bytes, parse arguments, plan and build the JSON
import no GPU code, so they are tested on the CPU.
"""

from lowvm.bench.errors import BenchError

__all__ = ["BenchError"]
