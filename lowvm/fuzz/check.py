"""One fuzz program checked three ways: interpreter against the numpy reference, the
generated CUDA through ptxas, the GPU against the interpreter.

Each check returns a :class:`Verdict` (``ok``, ``mismatch`` or ``error``, the stage that
failed and a message) instead of raising, so a run counts and shrinks failures.

Exactness: the interpreter and the reference must agree bit for bit (the values of
float outputs are compared with ``-0 == +0``; the padding around the output must keep
its poison). The GPU must agree with the interpreter bit for bit as well, except where
the spec's analysis marks the stored value approximate (``exp``: CUDA's ``expf`` is
within 2 ulp; a float ``fma`` whose result float32 cannot hold exactly: the GPU rounds
``fmaf`` to float32 first): there 2 ulp of the coarsest type the value passed through
since (``Val.tol``) are allowed. Float ``sum`` reductions and ``dot``s are exact on
both because the generator only makes them where every partial sum fits float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

import lowvm.fuzz.numerics as nm
from lowvm.errors import LowvmError
from lowvm.fuzz.analysis import Invalid, analyze
from lowvm.fuzz.build import build_program, is_packed, program_name
from lowvm.fuzz.generate import POISON, POISON_BYTE, make_arrays, output_geometry
from lowvm.fuzz.reference import ReferenceError, reference
from lowvm.fuzz.spec import Spec

__all__ = ["Verdict", "check_cpu", "check_ptxas", "check_gpu", "read_output", "to_numpy",
           "cuda_launcher", "gpu_tolerance", "LAUNCHER",
           "mismatches", "ARCHS"]

ARCHS = ("sm_80", "sm_90")


@dataclass
class Verdict:
    """The result of one check: ``status`` ok / mismatch / error, the failing ``stage``."""

    status: str = "ok"
    stage: str = ""
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def signature(self) -> tuple[str, str]:
        """What a shrunk spec must still show: the same status at the same stage."""
        return self.status, self.stage


def _first_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())[:600]


def to_numpy(tensor: Any) -> np.ndarray:
    """A CPU tensor as numpy (bfloat16 as float32: every value is exact)."""
    import torch

    if tensor.dtype == torch.bfloat16:
        tensor = tensor.float()
    return tensor.numpy().copy()


def read_output(spec: Spec, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(values [rows, cols], padding)``: the output buffer's values (float64) and its
    padding columns as stored (raw bytes of packed types, else values)."""
    dt = nm.type_by_name(spec.out_dtype)
    rows, cols = output_geometry(spec)
    data = np.asarray(data)
    if is_packed(dt):
        nbytes = cols * dt.nbits // 8
        body = data[:, :nbytes]
        codes = nm.unpack_rows(body, dt.nbits, cols) if dt.nbits < 8 else body.astype(np.int64)
        return nm.code_values(dt)[codes], data[:, nbytes:].astype(np.float64)
    values = data.astype(np.float64)
    return values[:, :cols], values[:, cols:]


def _poison(spec: Spec) -> float:
    dt = nm.type_by_name(spec.out_dtype)
    if is_packed(dt):
        return float(POISON_BYTE)
    return 177.0 if dt.name == "uint8" else POISON


def mismatches(expected: np.ndarray, got: np.ndarray, tol: Any = None) -> np.ndarray:
    """Where ``got`` differs from ``expected`` (``-0 == +0``, NaN == NaN); with ``tol``
    (a DType) within 2 ulp of it."""
    same = (expected == got) | (np.isnan(expected) & np.isnan(got))
    if tol is not None:
        with np.errstate(invalid="ignore"):
            close = np.abs(expected - got) <= 2 * nm.ulp(expected, tol)
        same |= close
    return ~same


def _describe(bad: np.ndarray, expected: np.ndarray, got: np.ndarray, what: str) -> str:
    r, c = (int(i) for i in np.argwhere(bad)[0])
    return (f"{what}: {int(bad.sum())} of {bad.size} elements differ; first at "
            f"[{r}, {c}]: expected {expected[r, c]!r}, got {got[r, c]!r}")


def _compare(spec: Spec, expected: np.ndarray, data: np.ndarray, what: str,
             tol: Any = None) -> str:
    values, padding = read_output(spec, data)
    if values.shape != expected.shape:
        return f"{what}: output of shape {values.shape}, expected {expected.shape}"
    bad = mismatches(expected, values, tol)
    if bad.any():
        return _describe(bad, expected, values, what)
    poison = _poison(spec)
    if padding.size and (padding != poison).any():
        r, c = (int(i) for i in np.argwhere(padding != poison)[0])
        return (f"{what}: the padding after the output's rows was written: [{r}, "
                f"{c + values.shape[1]}] holds {padding[r, c]!r}")
    return ""


def check_cpu(spec: Spec) -> tuple[Verdict, np.ndarray | None]:
    """Interpret ``spec`` and compare with the reference; also returns the interpreter's
    output buffer (for the GPU comparison) when the interpreter ran."""
    from lowvm.interpreter import interpret

    try:
        analyze(spec)
    except Invalid as exc:
        return Verdict("error", "generate", f"the spec is invalid: {exc}"), None
    try:
        program = build_program(spec)
    except Exception as exc:  # noqa: BLE001 - a crash while building is a finding too
        return Verdict("error", "build", _first_line(exc)), None
    arrays = make_arrays(spec)
    try:
        interpret(program, *arrays.scalars, *arrays.tensors)
    except Exception as exc:  # noqa: BLE001
        return Verdict("error", "interpret", _first_line(exc)), None
    out = to_numpy(arrays.tensors[-1])
    try:
        expected = reference(spec, arrays)
    except ReferenceError as exc:
        return Verdict("error", "reference", f"ReferenceError: {exc}"), out
    message = _compare(spec, expected, out, "interpreter vs reference")
    if message:
        return Verdict("mismatch", "interpreter", message), out
    if spec.wrap:
        return _check_checked_mode(spec, program), out
    return Verdict(), out


def _check_checked_mode(spec: Spec, program) -> Verdict:
    """The checked interpreter reports the row shift's int32 overflow, and only that."""
    from lowvm.interpreter import interpret

    arrays = make_arrays(spec)
    try:
        interpret(program, *arrays.scalars, *arrays.tensors, checked=True)
    except LowvmError as exc:
        if spec.shift_overflows and "int32 overflow" in str(exc):
            return Verdict()
        return Verdict("error", "interpret-checked", _first_line(exc))
    if spec.shift_overflows:
        return Verdict("mismatch", "interpret-checked", "the checked interpreter did not "
                       f"report the int32 overflow of u * v + t with {spec.ints[:3]}")
    return Verdict()


def check_ptxas(spec: Spec, archs: tuple[str, ...] = ARCHS) -> Verdict:
    """Generate the CUDA of ``spec`` and compile it with nvcc/ptxas for each arch."""
    from lowvm.driver import generate_cuda
    from lowvm.runtime import resource_usage

    try:
        cuda = generate_cuda(build_program(spec))
    except Exception as exc:  # noqa: BLE001
        return Verdict("error", "codegen", _first_line(exc))
    for arch in archs:
        try:
            resource_usage(cuda.source, arch)
        except LowvmError as exc:
            return Verdict("error", f"ptxas:{arch}", _first_line(exc))
    return Verdict()


#: compiled kernels by (structure, arch): programs of one structure share one kernel
_COMPILED: dict[tuple[str, str | None], Any] = {}


def gpu_tolerance(spec: Spec):
    """The type whose 2 ulp the GPU may differ by, or None (bit-exact)."""
    final = analyze(spec)[-1]
    return nm.type_by_name(final.tol) if final.taint and final.tol else None


def cuda_launcher(spec: Spec, arch: str | None):
    """Compile ``spec`` (once per structure and arch) and return a function that runs it
    on copies of an :class:`~lowvm.fuzz.generate.Arrays` on the GPU and returns the
    output buffer as numpy."""
    import torch

    from lowvm.driver import compile as compile_program

    key = (program_name(spec), arch)
    compiled = _COMPILED.get(key)
    if compiled is None:
        compiled = compile_program(build_program(spec), arch=arch)
        _COMPILED[key] = compiled

    def launch(arrays) -> np.ndarray:
        tensors = [t.cuda() for t in arrays.tensors]
        compiled(*arrays.scalars, *tensors)
        torch.cuda.synchronize()
        return to_numpy(tensors[-1].cpu())
    return launch


#: how :func:`check_gpu` gets a runnable kernel (tests put a CPU stand-in here)
LAUNCHER = cuda_launcher


def check_gpu(spec: Spec, interpreted: np.ndarray, arch: str | None = None) -> Verdict:
    """Compile ``spec`` for the GPU, launch it on fresh copies of its inputs and compare
    with the interpreter's output buffer ``interpreted``."""
    try:
        launch = LAUNCHER(spec, arch)
    except Exception as exc:  # noqa: BLE001 - a crash while compiling is a finding
        return Verdict("error", "gpu-compile", _first_line(exc))
    try:
        got = launch(make_arrays(spec))
    except Exception as exc:  # noqa: BLE001 - a failed launch is a finding
        return Verdict("error", "gpu-launch", _first_line(exc))
    expected, _ = read_output(spec, interpreted)
    message = _compare(spec, expected, got, "GPU vs interpreter", gpu_tolerance(spec))
    if message:
        return Verdict("mismatch", "gpu", message)
    return Verdict()
