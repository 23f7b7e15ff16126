"""The kernels a run times: lowvm (through ``lowvm_entry``) and the baselines.

Each :class:`Candidate` carries what the runner needs and nothing kernel-specific: the
callable to time, the activation dtype it takes, its weight format (for the byte count
and the floor), the weight its result must match (for the float64 check) and the
tolerance that fits its output type. Kernel names are stable strings used in the JSON,
the plot and the anchor file: ``lowvm_<type>_g<group>``, ``cublas_fp16``,
``cublas_bf16``, ``tinygemm_int4_g<group>``, ``gemlite_int<bits>_g<group>``.

Of the optional baselines, GemLite has an adapter (:mod:`lowvm.bench.gemlite_baseline`)
and is timed where ``import gemlite`` works; the original Marlin
(:mod:`lowvm.bench.marlin_baseline`) where it imports or ``MARLIN_SRC`` names its source;
vLLM's and SGLang's Marlin kernels are only probed. ``replicate`` makes the same kernel on
a fresh copy of its weight, for the graph and eager timings (copies that overflow L2).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lowvm.bench import counting, gemlite_baseline, lowvm_entry, marlin_baseline, tinygemm
from lowvm.bench.errors import BenchError
from lowvm.dtypes import DType
from lowvm.kernels.weights import fits_float16

__all__ = [
    "BASELINES",
    "OPTIONAL_BASELINES",
    "ADAPTED_OPTIONAL",
    "Candidate",
    "Unavailable",
    "lowvm_name",
    "tinygemm_name",
    "gemlite_name",
    "gemlite_widths",
    "MARLIN_NAME",
    "planned_kernels",
    "build_candidates",
    "probe_optional",
]

#: Baselines measured in every run unless deselected with ``--baselines``.
BASELINES = ("cublas_fp16", "cublas_bf16", "tinygemm")
#: Kernels timed only where their package imports (the H100 image has none of them).
OPTIONAL_BASELINES: dict[str, tuple[str, str]] = {
    "marlin_vllm": ("vllm._custom_ops", "gptq_marlin_gemm"),
    "marlin_sgl": ("sgl_kernel", "gptq_marlin_gemm"),
    "gemlite": ("gemlite", ""),
    "marlin": ("marlin", ""),
}
#: Optional baselines the harness can time (the others are probed and noted only).
ADAPTED_OPTIONAL = ("gemlite", "marlin")
#: Relative-error tolerances by output type: fp16 keeps 11 significant bits, bf16 8.
TOL_FP16 = 3e-3
TOL_BF16 = 1.6e-2


@dataclass
class Candidate:
    """One kernel ready to run on one weight."""

    kernel: str
    family: str                      # "lowvm" or "baseline"
    wtype: str
    fmt: counting.WeightFormat
    act_dtype: Any                   # torch dtype of x
    fn: Callable[[Any], Any]         # x [M, K] -> y [M, N]
    ref_weight: Callable[[], Any]    # the [N, K] weight the result must match
    tol: float
    #: a new ``fn`` on a fresh copy of the weight (None: the kernel cannot be copied)
    replicate: Callable[[], Callable[[Any], Any]] | None = None


@dataclass(frozen=True)
class Unavailable:
    """A kernel planned for a shape that cannot run there, and why."""

    kernel: str
    family: str
    wtype: str
    fmt: counting.WeightFormat
    status: str                      # "skipped" (unsupported) or "failed" (it broke)
    note: str


#: The original Marlin's kernel name (int4, groups of 128 only).
MARLIN_NAME = "marlin_int4_g128"


def lowvm_name(wtype: DType, group: int) -> str:
    return f"lowvm_{wtype.name}_g{group}"


def tinygemm_name(group: int) -> str:
    return f"tinygemm_int4_g{group}"


def gemlite_name(nbits: int, group: int) -> str:
    return f"gemlite_int{nbits}_g{group}"


def gemlite_widths(dtypes: tuple[DType, ...]) -> tuple[int, ...]:
    """GemLite code widths a run times: 4 always (the reference int4 baseline, as with
    tinygemm), plus each other integer width of ``--dtype`` that GemLite packs."""
    asked = {dt.nbits for dt in dtypes if dt.kind != "float"}
    return tuple(sorted({4} | (asked & set(gemlite_baseline.GEMLITE_BITS))))


def planned_kernels(dtypes: tuple[DType, ...], groups: tuple[int, ...],
                    baselines: tuple[str, ...], with_lowvm: bool = True) -> list[str]:
    """The kernel names a run with these options times (optional ones if importable)."""
    names = []
    if with_lowvm:
        names += [lowvm_name(dt, g) for dt in dtypes for g in groups]
    for b in baselines:
        if b == "tinygemm":
            names += [tinygemm_name(g) for g in groups]
        else:
            names.append(b)
    return names


def _error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:200]


def _lowvm_copy(prep: lowvm_entry.Prepared) -> Callable[[Any], Any]:
    qw = dataclasses.replace(prep.weight, packed=prep.weight.packed.clone(),
                             scales=prep.weight.scales.clone())
    return lambda x: lowvm_entry.run(lowvm_entry.Prepared(qw, prep.dequant), x)


def _lowvm_candidates(weight: Any, dtypes: tuple[DType, ...], groups: tuple[int, ...],
                      ready: list[Candidate], missing: list[Unavailable]) -> None:
    import torch

    for dt in dtypes:
        for g in groups:
            name, fmt = lowvm_name(dt, g), counting.quant_format(dt.nbits, g)
            try:
                prep = lowvm_entry.prepare(weight, dt.name, g)
            except Exception as exc:  # unsupported shape/type, or a compile error
                status = "skipped" if isinstance(exc, BenchError) else "failed"
                missing.append(Unavailable(name, "lowvm", dt.name, fmt, status, _error(exc)))
                continue
            # types whose values float16 cannot hold run on bfloat16 activations, the
            # kernel QuantLinear runs for them when given float16
            half = fits_float16(dt)
            ready.append(Candidate(
                name, "lowvm", dt.name, fmt, torch.float16 if half else torch.bfloat16,
                lambda x, p=prep: lowvm_entry.run(p, x),
                lambda p=prep: lowvm_entry.dequantized(p), TOL_FP16 if half else TOL_BF16,
                lambda p=prep: _lowvm_copy(p)))


def _cublas_candidate(weight: Any, name: str) -> Candidate:
    import torch

    dtype = torch.float16 if name == "cublas_fp16" else torch.bfloat16
    w = weight.to(dtype)

    def fn_of(w: Any) -> Callable[[Any], Any]:
        w_t = w.t()  # a transposed view: cuBLAS runs it as the "TN" GEMM of Linear
        return lambda x: torch.matmul(x, w_t)

    return Candidate(name, "baseline", name.split("_")[1], counting.fp_format(16), dtype,
                     fn_of(w), lambda: w, TOL_FP16 if dtype == torch.float16 else TOL_BF16,
                     lambda: fn_of(w.clone()))


def _tinygemm_candidates(weight: Any, groups: tuple[int, ...], ready: list[Candidate],
                         missing: list[Unavailable]) -> None:
    import torch

    for g in groups:
        name, fmt = tinygemm_name(g), counting.quant_format(4, g, 4)
        try:
            tg = tinygemm.prepare(weight, g)
        except Exception as exc:
            status = "skipped" if isinstance(exc, BenchError) else "failed"
            missing.append(Unavailable(name, "baseline", "int4", fmt, status, _error(exc)))
            continue

        def copy(tg: tinygemm.TinygemmWeight = tg) -> Callable[[Any], Any]:
            twin = dataclasses.replace(tg, packed=tg.packed.clone(),
                                       scales_and_zeros=tg.scales_and_zeros.clone())
            return lambda x: tinygemm.run(twin, x)

        ready.append(Candidate(
            name, "baseline", "int4", fmt, torch.bfloat16,
            lambda x, tg=tg: tinygemm.run(tg, x),
            lambda tg=tg: tinygemm.dequantize(tg.codes, tg.scales_and_zeros, tg.group),
            TOL_BF16, copy))


def _gemlite_candidates(weight: Any, dtypes: tuple[DType, ...], groups: tuple[int, ...],
                        ready: list[Candidate], missing: list[Unavailable]) -> None:
    import torch

    for nbits in gemlite_widths(dtypes):
        for g in groups:
            name, fmt = gemlite_name(nbits, g), counting.quant_format(nbits, g, 4)
            try:
                gl = gemlite_baseline.prepare(weight, nbits, g)
            except Exception as exc:
                status = "skipped" if isinstance(exc, BenchError) else "failed"
                missing.append(Unavailable(name, "baseline", f"int{nbits}", fmt, status,
                                           _error(exc)))
                continue
            ready.append(Candidate(
                name, "baseline", f"int{nbits}", fmt, torch.float16,
                lambda x, gl=gl: gemlite_baseline.run(gl, x),
                lambda gl=gl: gemlite_baseline.dequantized(gl), TOL_FP16))


def _marlin_candidate(weight: Any, ready: list[Candidate],
                      missing: list[Unavailable]) -> None:
    import torch

    fmt = counting.quant_format(4, marlin_baseline.GROUP)
    try:
        module = marlin_baseline.load()
    except marlin_baseline.MarlinUnavailable as exc:
        missing.append(Unavailable(MARLIN_NAME, "baseline", "int4", fmt, "skipped",
                                   f"not available: {exc}"))
        return
    try:
        mw = marlin_baseline.prepare(module, weight)
    except Exception as exc:
        status = "skipped" if isinstance(exc, BenchError) else "failed"
        missing.append(Unavailable(MARLIN_NAME, "baseline", "int4", fmt, status, _error(exc)))
        return

    def copy() -> Callable[[Any], Any]:
        twin = marlin_baseline.replicate(mw)
        return lambda x: marlin_baseline.run(twin, x)

    ready.append(Candidate(MARLIN_NAME, "baseline", "int4", fmt, torch.float16,
                           lambda x: marlin_baseline.run(mw, x),
                           lambda: marlin_baseline.dequantized(mw), TOL_FP16, copy))


def build_candidates(weight: Any, dtypes: tuple[DType, ...], groups: tuple[int, ...],
                     baselines: tuple[str, ...], with_lowvm: bool = True,
                     optional: tuple[str, ...] = ()
                     ) -> tuple[list[Candidate], list[Unavailable]]:
    """Prepare every planned kernel for ``weight [N, K]`` fp16 on the GPU.

    lowvm candidates come first: the runner checks them before any baseline has left an
    output of the same size in the allocator's free memory. ``optional`` names the
    optional baselines asked for: those with an adapter are added where they import
    (:func:`probe_optional` notes the rest, and those that do not import); Marlin, when
    it cannot be loaded, becomes a skipped row saying why.
    """
    ready: list[Candidate] = []
    missing: list[Unavailable] = []
    if with_lowvm:
        _lowvm_candidates(weight, dtypes, groups, ready, missing)
    for b in baselines:
        if b in ("cublas_fp16", "cublas_bf16"):
            ready.append(_cublas_candidate(weight, b))
        elif b == "tinygemm":
            _tinygemm_candidates(weight, groups, ready, missing)
    if "gemlite" in optional and _imports("gemlite"):
        _gemlite_candidates(weight, dtypes, groups, ready, missing)
    if "marlin" in optional:
        _marlin_candidate(weight, ready, missing)
    return ready, missing


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
    except Exception:  # ImportError, or a broken install (gemlite needs CUDA to import)
        return False
    return True


def probe_optional(names: tuple[str, ...]) -> list[str]:
    """Notes on the optional baselines asked for: each is imported, and skipped with a
    note when absent. An importable one is timed if it has an adapter
    (:data:`ADAPTED_OPTIONAL`) and noted as untimed otherwise."""
    notes = []
    for name in names:
        if name == "marlin":
            notes.append(_marlin_note())
            continue
        module, attr = OPTIONAL_BASELINES[name]
        try:
            mod = importlib.import_module(module)
        except Exception as exc:  # ImportError, or a broken install raising anything
            notes.append(f"{name}: skipped, {module} does not import ({_error(exc)})")
            continue
        if attr and not hasattr(mod, attr):
            notes.append(f"{name}: skipped, {module} has no {attr}")
        else:
            version = getattr(importlib.import_module(module.split(".")[0]),
                              "__version__", "?")
            if name == "gemlite":
                notes.append(f"gemlite: {module} {version} imports; timed as "
                             "gemlite_int<bits>_g<group> (fp16 activations, GemLite's "
                             "'fast' autotune mode on its shipped configs, see "
                             "lowvm/bench/gemlite_baseline.py)")
            else:
                notes.append(f"{name}: {module} {version} imports, but the harness has "
                             "no adapter for its API yet; not timed")
    return notes


def _marlin_note() -> str:
    try:
        marlin_baseline.load()
    except marlin_baseline.MarlinUnavailable as exc:
        return f"marlin: not available: {exc}"
    return f"marlin: timed as {MARLIN_NAME} (the original Marlin, fp16 activations)"
