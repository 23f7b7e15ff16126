"""CUDA C++ source to cubin, through NVRTC or nvcc, with errors a person can act on.

lowvm emits CUDA C++ for one GPU architecture at a time and loads the result with the
driver API, so what it needs is a *cubin* (machine code for exactly that chip): no PTX, no
JIT at load time, no fat binary. Two compilers can make one:

* **NVRTC** (``cuda.bindings.nvrtc``) compiles in-process and is what a serving machine
  usually has (the ``nvidia-cuda-nvrtc`` wheel), no toolkit install needed.
* **nvcc** needs the CUDA toolkit, but its ``-Xptxas -v`` report gives registers, spills,
  stack and shared memory per kernel, which :func:`resource_usage` turns into numbers CI
  can check (a spilling kernel is a performance bug that no correctness test catches).

``compiler="auto"`` prefers NVRTC and falls back to nvcc only when the NVRTC library
cannot be loaded; a source that NVRTC rejects is an error, never retried with nvcc.

A compile has a time limit (``timeout_s``, default ``$LOWVM_COMPILE_TIMEOUT`` or
:data:`DEFAULT_COMPILE_TIMEOUT_S` seconds): nvcc runs in its own process group, which is
ended whole (``cicc`` and ``ptxas`` with it) when the limit passes or the caller is
interrupted. NVRTC compiles inside this process and cannot be stopped: past the limit
the caller gets the error and the compile finishes unseen in a background thread.

A failed compile raises :class:`~lowvm.runtime.errors.RuntimeCompileError` carrying the
compiler's log, the generated source numbered around the first error (generated code has
no file a person could open) and the toolchain versions (NVRTC, nvcc, driver), since most
"it compiled yesterday" reports come down to a version.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lowvm.extras import CUDA_HINT
from lowvm.runtime.errors import CompileOptionError, RuntimeCompileError

__all__ = [
    "COMPILERS",
    "DEFAULT_COMPILE_TIMEOUT_S",
    "compile_timeout",
    "compile_cubin",
    "resource_usage",
    "parse_ptxas_report",
    "compiler_identity",
    "nvrtc_version",
    "driver_version",
    "find_nvcc",
    "nvcc_version",
    "cuda_include_dirs",
    "toolchain_summary",
]

COMPILERS = ("auto", "nvrtc", "nvcc")
"""Accepted values of ``compiler=``."""

DEFAULT_COMPILE_TIMEOUT_S = 600.0
"""Seconds a compile may take unless ``LOWVM_COMPILE_TIMEOUT`` or ``timeout_s`` says
otherwise (lowvm's largest kernels take seconds)."""

_SOURCE_NAME = "lowvm_kernel.cu"  # the file name compiler logs cite
_ARCH_RE = re.compile(r"sm_(\d{2,3})([af]?)")
_ELF_MAGIC = b"\x7fELF"
_CONTEXT_LINES = 3  # source lines shown either side of the first error


def _check_arch(arch: object) -> tuple[str, str]:
    """Return (compute_XX[a], sm_XX[a]) for a real architecture name, or raise."""
    if not isinstance(arch, str) or not _ARCH_RE.fullmatch(arch):
        raise CompileOptionError(
            f"compile_cubin: arch must name a real GPU architecture such as 'sm_80', "
            f"'sm_90' or 'sm_90a' (a cubin is machine code for one chip; virtual "
            f"'compute_XX' targets give PTX, not a cubin); got {arch!r}"
        )
    return "compute_" + arch[3:], arch


def _check_compiler(compiler: object) -> str:
    if compiler not in COMPILERS:
        raise CompileOptionError(
            f"compile_cubin: compiler must be one of {COMPILERS}, got {compiler!r}"
        )
    return str(compiler)


def _check_options(extra_options: object) -> tuple[str, ...]:
    if isinstance(extra_options, str) or not isinstance(extra_options, Sequence):
        raise CompileOptionError(
            f"compile_cubin: extra_options must be a sequence of option strings such as "
            f"('-lineinfo',), got {extra_options!r}"
        )
    bad = [o for o in extra_options if not isinstance(o, str)]
    if bad:
        raise CompileOptionError(
            f"compile_cubin: extra_options must hold strings only, got {bad[0]!r} "
            f"in {tuple(extra_options)!r}"
        )
    return tuple(extra_options)


def compile_timeout(timeout_s: object = None) -> float:
    """``timeout_s``, else ``$LOWVM_COMPILE_TIMEOUT``, else the default: seconds > 0."""
    what = "timeout_s"
    if timeout_s is None:
        text = os.environ.get("LOWVM_COMPILE_TIMEOUT", "").strip()
        if not text:
            return DEFAULT_COMPILE_TIMEOUT_S
        what = "the environment variable LOWVM_COMPILE_TIMEOUT"
        try:
            timeout_s = float(text)
        except ValueError:
            timeout_s = text
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) \
            or not 0 < timeout_s < float("inf"):
        raise CompileOptionError(f"compile_cubin: {what} must be a number of seconds > 0, "
                                 f"got {timeout_s!r}")
    return float(timeout_s)


# ---------------------------------------------------------------------------------------
# Toolchain discovery and versions
# ---------------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


@functools.cache
def _nvrtc_probe() -> tuple[tuple[int, int] | None, str]:
    """(version, reason): version is None when the NVRTC library cannot be loaded."""
    try:
        from cuda.bindings import nvrtc
    except Exception as exc:  # cuda-python missing or broken
        return None, f"cuda.bindings.nvrtc cannot be imported ({_one_line(exc)})"
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # cuda.pathfinder's DynamicLibNotFoundError, OSError, ...
        return None, f"the NVRTC library cannot be loaded ({_one_line(exc)})"
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return None, f"nvrtcVersion() failed with {err!r}"
    return (int(major), int(minor)), ""


def nvrtc_version() -> tuple[int, int] | None:
    """NVRTC's (major, minor) version, or ``None`` where the library cannot be loaded."""
    return _nvrtc_probe()[0]


@functools.cache
def driver_version() -> str | None:
    """The CUDA driver's version as ``"13.0"``, or ``None`` where no driver is installed."""
    try:
        from cuda.bindings import driver

        err, version = driver.cuDriverGetVersion()
    except Exception:
        return None
    if err != driver.CUresult.CUDA_SUCCESS:
        return None
    return f"{version // 1000}.{version % 1000 // 10}"


def _cuda_homes() -> list[Path]:
    homes = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    return [Path(h) for h in homes if h] + [Path("/usr/local/cuda")]


def find_nvcc() -> str | None:
    """Path of ``nvcc``: on ``PATH`` first, then ``$CUDA_HOME/bin``, ``/usr/local/cuda/bin``."""
    found = shutil.which("nvcc")
    if found:
        return found
    for home in _cuda_homes():
        candidate = home / "bin" / "nvcc"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


@functools.cache
def nvcc_version(nvcc: str) -> str:
    """The version ``nvcc --version`` reports, e.g. ``"13.0.88"`` (``"unknown"`` if unparsable)."""
    try:
        out = subprocess.run(
            [nvcc, "--version"], capture_output=True, text=True, errors="replace", check=False
        ).stdout
    except OSError:
        return "unknown"
    match = re.search(r"V(\d+\.\d+\.\d+)", out) or re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else "unknown"


def cuda_include_dirs() -> list[str]:
    """Directories holding ``cuda_fp16.h`` and friends, for NVRTC's ``-I`` options.

    NVRTC has no built-in copy of these headers. First the directory ``cuda.pathfinder``
    finds (NVIDIA wheels, then conda, then ``$CUDA_HOME``/``$CUDA_PATH``, then system
    paths: the order it finds ``libnvrtc`` in, so headers and library tend to match), then
    ``$CUDA_HOME/include``, ``$CUDA_PATH/include`` and ``/usr/local/cuda/include``; only
    those that hold ``cuda_fp16.h``, without duplicates.
    """
    dirs: list[str] = []
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
        if found:
            dirs.append(found)
    except Exception:
        pass
    dirs += [str(home / "include") for home in _cuda_homes()]
    kept: list[str] = []
    seen: set[str] = set()
    for d in dirs:
        real = os.path.realpath(d)
        if real not in seen and os.path.isfile(os.path.join(d, "cuda_fp16.h")):
            seen.add(real)
            kept.append(d)
    return kept


def toolchain_summary() -> str:
    """One line naming NVRTC, nvcc and driver versions (or why each is missing)."""
    version, reason = _nvrtc_probe()
    nvrtc = f"NVRTC {version[0]}.{version[1]}" if version else f"NVRTC unavailable: {reason}"
    nvcc = find_nvcc()
    nvcc_part = f"nvcc {nvcc_version(nvcc)} at {nvcc}" if nvcc else "nvcc not found"
    drv = driver_version()
    return f"{nvrtc}; {nvcc_part}; driver {drv if drv else 'not found'}"


def compiler_identity(compiler: str = "auto") -> tuple[str, str]:
    """The compiler ``compiler`` resolves to and its version, e.g. ``("nvcc", "13.0.88")``.

    ``"auto"`` resolves to NVRTC when its library loads, else to nvcc. Raises
    :class:`RuntimeCompileError` when the requested compiler is missing. Caches key on this.
    """
    compiler = _check_compiler(compiler)
    if compiler in ("auto", "nvrtc"):
        version, reason = _nvrtc_probe()
        if version is not None:
            return "nvrtc", f"{version[0]}.{version[1]}"
        if compiler == "nvrtc":
            raise RuntimeCompileError(
                f"compile_cubin: compiler='nvrtc' was requested but {reason}; install the "
                f"NVRTC library ({CUDA_HINT}; or a CUDA toolkit whose libnvrtc.so is on "
                f"the loader path) or pass compiler='nvcc' "
                f"[{toolchain_summary()}]"
            )
    nvcc = find_nvcc()
    if nvcc is None:
        why = "" if compiler == "nvcc" else f" and NVRTC is unavailable ({_nvrtc_probe()[1]})"
        raise RuntimeCompileError(
            f"compile_cubin: compiler={compiler!r} needs nvcc, which is neither on PATH nor "
            f"in $CUDA_HOME/bin or /usr/local/cuda/bin{why}; install the CUDA toolkit or "
            f"the NVRTC library ({CUDA_HINT}) [{toolchain_summary()}]"
        )
    return "nvcc", nvcc_version(nvcc)


# ---------------------------------------------------------------------------------------
# Error reporting
# ---------------------------------------------------------------------------------------

_ERROR_LINE_RE = re.compile(r"\((\d+)\): (?:catastrophic )?error")


def _source_excerpt(source: str, log: str) -> str:
    """The source numbered around the first ``file(LINE): error`` the log cites."""
    match = _ERROR_LINE_RE.search(log)
    if not match:
        return ""
    line_no = int(match.group(1))
    lines = source.splitlines()
    lo = max(1, line_no - _CONTEXT_LINES)
    hi = min(len(lines), line_no + _CONTEXT_LINES)
    width = len(str(hi))
    shown = [
        f"{'>' if n == line_no else ' '} {n:>{width}} | {lines[n - 1]}" for n in range(lo, hi + 1)
    ]
    return f"\nsource around line {line_no}:\n" + "\n".join(shown)


def _compile_failed(tool: str, arch: str, log: str, source: str) -> RuntimeCompileError:
    return RuntimeCompileError(
        f"compile_cubin: {tool} could not compile the source for arch={arch!r}\n"
        f"compiler log:\n{log.strip()}{_source_excerpt(source, log)}\n"
        f"toolchain: {toolchain_summary()}"
    )


# ---------------------------------------------------------------------------------------
# The two compilers
# ---------------------------------------------------------------------------------------


def _text(name: Any) -> str:
    return name.decode(errors="replace") if isinstance(name, bytes) else str(name)


def _nvrtc_call(result: tuple, what: str, nvrtc: Any) -> tuple:
    err = result[0]
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, name = nvrtc.nvrtcGetErrorString(err)
        raise RuntimeCompileError(
            f"compile_cubin: {what} failed with {_text(name)} [{toolchain_summary()}]"
        )
    return result[1:]


def _timed_out(tool: str, arch: str, timeout_s: float, ended: str) -> RuntimeCompileError:
    return RuntimeCompileError(
        f"compile_cubin: {tool} did not finish compiling for arch={arch!r} within "
        f"{timeout_s:g} s ({ended}); raise the limit with timeout_s= or "
        f"LOWVM_COMPILE_TIMEOUT if the kernel is that large [{toolchain_summary()}]")


def _compile_nvrtc(source: str, arch: str, options: tuple[str, ...], timeout_s: float
                   ) -> bytes:
    """NVRTC's compile in a daemon thread, waited for at most ``timeout_s``."""
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["cubin"] = _nvrtc_cubin(source, arch, options)
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=work, name="lowvm-nvrtc", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise _timed_out("NVRTC", arch, timeout_s, "NVRTC runs in this process and cannot "
                         "be stopped; it finishes in the background, its result unused")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["cubin"]


def _nvrtc_cubin(source: str, arch: str, options: tuple[str, ...]) -> bytes:
    from cuda.bindings import nvrtc

    opts = [
        f"--gpu-architecture={arch}",  # a real sm_XX arch makes NVRTC emit a cubin
        "-std=c++17",
        "-default-device",
        *(f"-I{d}" for d in cuda_include_dirs()),
        *options,
    ]
    (prog,) = _nvrtc_call(
        nvrtc.nvrtcCreateProgram(source.encode(), _SOURCE_NAME.encode(), 0, [], []),
        "nvrtcCreateProgram",
        nvrtc,
    )
    try:
        encoded = [o.encode() for o in opts]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(encoded), encoded)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            log = _nvrtc_log(prog, nvrtc)
            if err == nvrtc.nvrtcResult.NVRTC_ERROR_COMPILATION:
                raise _compile_failed("NVRTC", arch, log, source)
            _, name = nvrtc.nvrtcGetErrorString(err)
            raise RuntimeCompileError(
                f"compile_cubin: nvrtcCompileProgram failed with {_text(name)} for options "
                f"{opts}\ncompiler log:\n{log.strip()}\ntoolchain: {toolchain_summary()}"
            )
        (size,) = _nvrtc_call(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize", nvrtc)
        if size == 0:
            raise RuntimeCompileError(
                f"compile_cubin: NVRTC produced no cubin for arch={arch!r} (a virtual "
                f"architecture?) [{toolchain_summary()}]"
            )
        cubin = b" " * size  # cuda-python fills this buffer in place
        _nvrtc_call(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN", nvrtc)
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvrtc_log(prog: Any, nvrtc: Any) -> str:
    (size,) = _nvrtc_call(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize", nvrtc)
    log = b" " * size
    _nvrtc_call(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog", nvrtc)
    return log.rstrip(b"\0").decode(errors="replace")


def _run_group(cmd: list[str], cwd: str, timeout_s: float, arch: str
               ) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a new process group, ended whole (nvcc's ``cicc`` and ``ptxas``
    children too) when ``timeout_s`` passes or this process is interrupted."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _end_group(proc)
        raise _timed_out("nvcc", arch, timeout_s, "its processes were ended") from None
    except BaseException:  # KeyboardInterrupt: the group does not get the terminal's ^C
        _end_group(proc)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _end_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def _compile_nvcc(source: str, arch: str, options: tuple[str, ...],
                  timeout_s: float = DEFAULT_COMPILE_TIMEOUT_S) -> tuple[bytes, str]:
    """Compile with nvcc; return the cubin and the compiler's output (ptxas's report)."""
    nvcc = find_nvcc()
    if nvcc is None:
        compiler_identity("nvcc")  # raises the "nvcc not found" error
        raise AssertionError("unreachable")
    compute, sm = _check_arch(arch)
    with tempfile.TemporaryDirectory(prefix="lowvm-nvcc-") as tmp:
        Path(tmp, _SOURCE_NAME).write_text(source)
        cmd = [
            nvcc,
            "-cubin",
            # The explicit -gencode form: one pass for exactly this target (an "a" target
            # must not also be compiled for the plain one).
            f"-gencode=arch={compute},code={sm}",
            "-O3",
            "-std=c++17",
            "-Xptxas",
            "-v",
            *options,
            "-o",
            "kernel.cubin",
            _SOURCE_NAME,
        ]
        proc = _run_group(cmd, tmp, timeout_s, arch)
        log = proc.stdout + proc.stderr
        out = Path(tmp, "kernel.cubin")
        if proc.returncode != 0 or not out.is_file():
            raise _compile_failed(f"nvcc (exit code {proc.returncode})", arch, log, source)
        return out.read_bytes(), log


def _compile(
    source: str, arch: str, compiler: str, options: Sequence[str], timeout_s: object = None
) -> tuple[bytes, str, str]:
    """Validate, compile, and return (cubin, log, compiler name actually used)."""
    if not isinstance(source, str) or not source.strip():
        raise CompileOptionError(
            f"compile_cubin: source must be non-empty CUDA C++ text, got {source!r:.80}"
        )
    _check_arch(arch)
    opts = _check_options(options)
    limit = compile_timeout(timeout_s)
    used, _ = compiler_identity(compiler)
    if used == "nvrtc":
        return _compile_nvrtc(source, arch, opts, limit), "", "nvrtc"
    cubin, log = _compile_nvcc(source, arch, opts, limit)
    return cubin, log, "nvcc"


def compile_cubin(
    source: str, arch: str, *, compiler: str = "auto", extra_options: Sequence[str] = (),
    timeout_s: float | None = None,
) -> bytes:
    """Compile CUDA C++ ``source`` to a cubin for ``arch`` (``"sm_80"``, ``"sm_90a"``, ...).

    ``compiler`` is ``"nvrtc"``, ``"nvcc"`` or ``"auto"`` (NVRTC, else nvcc when the NVRTC
    library cannot be loaded). Both compile as C++17 without fast-math; ``extra_options``
    are passed verbatim to whichever compiler runs. Kernels keep C++ name mangling unless
    declared ``extern "C"``.

    ``timeout_s`` (default ``$LOWVM_COMPILE_TIMEOUT``, else
    :data:`DEFAULT_COMPILE_TIMEOUT_S`) limits the compile (see the module docstring).

    Raises :class:`~lowvm.runtime.errors.RuntimeCompileError` with the compiler log, the
    source around the first error and the toolchain versions when compilation fails, the
    compiler is missing or the time limit passes, and its subclass ``CompileOptionError``
    for a malformed request.
    """
    cubin, _, used = _compile(source, arch, compiler, extra_options, timeout_s)
    if not cubin.startswith(_ELF_MAGIC):
        raise RuntimeCompileError(
            f"compile_cubin: {used} returned {len(cubin)} bytes that are not an ELF cubin "
            f"(first bytes {cubin[:8]!r}) for arch={arch!r} [{toolchain_summary()}]"
        )
    return cubin


# ---------------------------------------------------------------------------------------
# ptxas resource report
# ---------------------------------------------------------------------------------------

_ENTRY_RE = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PROPS_RE = re.compile(r"Function properties for (\S+)")
_FRAME_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_USED_RE = re.compile(r"Used (\d+) registers")
_FIELD_RES = {
    "barriers": re.compile(r"used (\d+) barriers"),
    "shared_bytes": re.compile(r"(\d+) bytes smem"),
    "constant_bytes": re.compile(r"(\d+) bytes cmem\[0\]"),
    "cumulative_stack_bytes": re.compile(r"(\d+) bytes cumulative stack size"),
}


def _empty_usage() -> dict[str, int]:
    return {
        "registers": 0,
        "spill_store_bytes": 0,
        "spill_load_bytes": 0,
        "stack_bytes": 0,
        "shared_bytes": 0,
        "barriers": 0,
        "constant_bytes": 0,
        "cumulative_stack_bytes": 0,
    }


def parse_ptxas_report(text: str) -> dict[str, dict[str, int]]:
    """Per entry function, the numbers in a ``ptxas -v`` report.

    Keys of each kernel's dict: ``registers``, ``spill_store_bytes``, ``spill_load_bytes``,
    ``stack_bytes`` (the stack frame), ``shared_bytes`` (static shared memory),
    ``barriers``, ``constant_bytes`` (``cmem[0]``, the parameter bank) and
    ``cumulative_stack_bytes``; a number ptxas does not print is 0.
    """
    kernels: dict[str, dict[str, int]] = {}
    current: str | None = None
    for line in text.splitlines():
        if m := _ENTRY_RE.search(line):
            current = m.group(1)
            kernels[current] = _empty_usage()
        elif m := _PROPS_RE.search(line):
            current = m.group(1) if m.group(1) in kernels else None
        elif current is not None and (m := _FRAME_RE.search(line)):
            usage = kernels[current]
            usage["stack_bytes"] = int(m.group(1))
            usage["spill_store_bytes"] = int(m.group(2))
            usage["spill_load_bytes"] = int(m.group(3))
        elif current is not None and (m := _USED_RE.search(line)):
            usage = kernels[current]
            usage["registers"] = int(m.group(1))
            for key, pattern in _FIELD_RES.items():
                if f := pattern.search(line):
                    usage[key] = int(f.group(1))
    return kernels


def resource_usage(
    source: str, arch: str, *, extra_options: Sequence[str] = (),
    timeout_s: float | None = None,
) -> dict[str, dict[str, int]]:
    """Registers, spills, stack and shared memory of each kernel in ``source``, per name.

    Compiles with nvcc (``-Xptxas -v``; NVRTC gives no such report) and returns
    :func:`parse_ptxas_report`'s dict keyed by the kernel's (possibly mangled) symbol name,
    e.g. ``{"add": {"registers": 10, "spill_store_bytes": 0, ...}}``. For CI checks such as
    "no kernel spills". Raises :class:`RuntimeCompileError` when nvcc is missing or fails.
    """
    _, log, _ = _compile(source, arch, "nvcc", extra_options, timeout_s)
    return parse_ptxas_report(log)
