"""The harness's scenarios, as data: name -> what ``python -m lowvm.bench <name>`` runs.

A scenario is either a GEMM table (``kind`` "gemm": shapes x M x weight types x groups,
lowvm and the baselines, each timed by every listed method), a sweep of the library's
schedules (``kind`` "schedules": at each shape and decode M, the schedule
``quant_linear`` chooses against its neighbours in :func:`lowvm.tune.library_space`:
the evidence behind the thresholds in :mod:`lowvm.kernels`), or a command run as a
subprocess whose outcome becomes the result (``kind`` "serving", "pytest",
"sanitizers", or "json": a command that writes ``{out}/result.json`` with ``rows``).
Options on the command line (``--shape``, ``--m``, ``--dtype``, ...) override a
scenario's values; with no scenario name they define an ad-hoc one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lowvm.bench.errors import BenchError
from lowvm.bench.shapes import DEFAULT_GROUPS, DEFAULT_M, LLAMA_SHAPES, Shape
from lowvm.dtypes import all_dtypes
from lowvm.runtime.timing import METHODS

__all__ = ["KINDS", "Scenario", "SCENARIOS", "ADHOC", "scenario", "weight_type_names"]

KINDS = ("gemm", "schedules", "serving", "json", "pytest", "sanitizers")


def weight_type_names() -> tuple[str, ...]:
    """Every lowvm weight type of 1 to 8 bits, integers first; not int1, whose two values
    (-1, 0) no symmetric scale maps a group onto (uint1 with zero points is the 1-bit
    type)."""
    return tuple(d.name for d in all_dtypes() if 1 <= d.nbits <= 8 and d.name != "int1")


@dataclass(frozen=True)
class Scenario:
    """One row of :data:`SCENARIOS`. Fields a kind does not use stay empty."""

    name: str
    kind: str
    summary: str
    shapes: tuple[Shape, ...] = ()
    ms: tuple[int, ...] = ()
    dtypes: tuple[str, ...] = ()
    groups: tuple[int, ...] = DEFAULT_GROUPS
    baselines: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    command: tuple[str, ...] = ()   # subprocess kinds; "{out}" is a scratch folder
    neighbours: int = 0             # "schedules": how many neighbours per choice

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise BenchError(f"scenario {self.name!r}: kind {self.kind!r} is not one of "
                             f"{', '.join(KINDS)}")
        for method in self.methods:
            if method not in METHODS:
                raise BenchError(f"scenario {self.name!r}: method {method!r} is not one of "
                                 f"{', '.join(METHODS)}")

    @property
    def is_gemm(self) -> bool:
        """Whether it times GEMMs in this process (and takes the GEMM options)."""
        return self.kind in ("gemm", "schedules")

    def with_options(self, **changes: object) -> Scenario:
        """This scenario with the options given on the command line (None: keep)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


_ALL_BASELINES = ("cublas_fp16", "tinygemm", "gemlite", "marlin")
_DECODE_M = (1, 2, 4, 8, 16)

SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("gemm-decode", "gemm",
             "int4 g128 decode GEMMs on the Llama-3 shapes against every baseline",
             shapes=LLAMA_SHAPES, ms=_DECODE_M, dtypes=("int4",),
             baselines=_ALL_BASELINES, methods=("graph", "write-flushed")),
    Scenario("gemm-prefill", "gemm",
             "int4 g128 prefill GEMMs on the Llama-3 shapes against every baseline",
             shapes=LLAMA_SHAPES, ms=(64, 128, 256, 512, 1024, 2048, 4096),
             dtypes=("int4",), baselines=_ALL_BASELINES,
             methods=("write-flushed", "graph")),
    Scenario("types", "gemm", "every 1-8-bit weight type at 4096x4096, M = 1 and 16",
             shapes=(Shape(4096, 4096),), ms=(1, 16), dtypes=weight_type_names(),
             baselines=("cublas_fp16",), methods=("graph", "write-flushed")),
    Scenario("schedules", "schedules",
             "the library's chosen decode schedule against its neighbours in "
             "lowvm.tune's library space, per Llama-3 shape and decode M",
             shapes=LLAMA_SHAPES, ms=(1, 4, 16), dtypes=("int4", "int3"),
             methods=("graph",), neighbours=10),
    Scenario("serving-loop", "serving",
             "a decode loop (one CUDA graph per step) of a random Llama-3-8B, fp16 and "
             "int4/int3/int2, batch 1 and 16, 128 new tokens",
             command=("{python}", "-m", "lowvm.serving", "--config", "llama3-8b",
                      "--dtype", "int4,int3,int2", "--batch-sizes", "1,16",
                      "--modes", "loop", "--new-tokens", "128",
                      "--json", "{out}/serving.json")),
    Scenario("quality", "json",
             "held-out perplexity of a small Llama trained on the Python standard library's "
             "sources: float16 against RTN, GPTQ and bit budgets at int8..int2",
             command=("{python}", "-m", "lowvm.evaluation", "--json", "{out}/result.json")),
    Scenario("fuzz", "json",
             "random valid VM programs run in the interpreter and compiled on the GPU, "
             "compared bit-exactly",
             command=("{python}", "-m", "lowvm.fuzz", "--device", "cuda", "--programs", "3000",
                      "--json", "{out}/result.json")),
    Scenario("load-memory", "json",
             "peak CPU and GPU memory of loading a 1.2 GB float16 checkpoint, plain and "
             "quantized to int4 while loading",
             command=("{python}", "-m", "lowvm.bench.load_memory", "--device", "cpu,cuda",
                      "--json", "{out}/result.json")),
    Scenario("tensor-parallel", "json",
             "decode tok/s of a random Llama-3-70B-shaped model split over 1, 2 and 4 GPUs "
             "(torchrun, NCCL, one CUDA graph per rank and step): int4 and float16, batch 1 "
             "and 16",
             command=("{python}", "-m", "lowvm.serving.tp_scaling", "--tp", "4,2,1",
                      "--config", "llama3-70b", "--dtype", "int4,float16", "--batch-sizes",
                      "1,16", "--json", "{out}/result.json")),
    Scenario("host-overhead", "json",
             "host time of eager QuantLinear calls (int4 g128, 4096 x 4096, M = 1, 16, 256) "
             "beside the kernel's time in a CUDA graph; passes when every call's host time "
             "is <= 20 us",
             command=("{python}", "-m", "lowvm.bench.host_overhead", "--json",
                      "{out}/result.json")),
    Scenario("profile", "json",
             "Nsight Compute counters of lowvm int4 g128, cuBLAS float16 and Marlin (where "
             "MARLIN_SRC is set) at M = 1, 16, 256, 4096: DRAM and SM throughput, busiest "
             "pipe, occupancy and the largest warp stalls, i.e. what bounds each cell",
             command=("{python}", "-m", "lowvm.bench.ncu_profile", "--json",
                      "{out}/result.json")),
    Scenario("gpu-suite", "pytest", "the tests marked gpu, summarised from their JUnit XML",
             command=("{python}", "-m", "pytest", "-m", "gpu", "-q", "-n", "8", "-p",
                      "no:cacheprovider", "--junitxml", "{out}/junit.xml", "tests")),
    Scenario("sanitizers", "sanitizers",
             "compute-sanitizer memcheck and racecheck over the library's kernel forms and every "
             "weight type x group x M = 1, 16, 256 through QuantLinear",
             command=("{python}", "-m", "lowvm.bench.sanitize_target", "--sweep")),
    Scenario("sanitizers-fuzz", "sanitizers",
             "compute-sanitizer memcheck and racecheck over 150 fuzzer programs on the GPU",
             command=("{python}", "-m", "lowvm.fuzz", "--device", "cuda", "--programs", "150",
                      "--seed", "11")),
)}

#: The scenario of a flag-style call (``python -m lowvm.bench --shape ... --m ...``):
#: today's defaults, one L2-flushed timing per row.
ADHOC = Scenario("adhoc", "gemm", "the shapes, M, types and baselines given as options",
                 shapes=LLAMA_SHAPES, ms=DEFAULT_M, dtypes=("int4",),
                 baselines=("cublas_fp16", "cublas_bf16", "tinygemm", "marlin_vllm",
                            "marlin_sgl", "gemlite", "marlin"),
                 methods=("write-flushed",))


def scenario(name: str) -> Scenario:
    """The scenario called ``name``; :class:`BenchError` lists the known ones."""
    if name == ADHOC.name:
        return ADHOC
    try:
        return SCENARIOS[name]
    except KeyError:
        raise BenchError(f"scenario {name!r} is not known; choose from "
                         f"{', '.join(SCENARIOS)}") from None
