"""Compile generated CUDA C++ to cubins and launch them on torch tensors.

* :func:`compile_cubin` (NVRTC or nvcc) and :func:`cached_cubin` (the same, memoised on
  disk) turn source into a cubin for one architecture; :func:`resource_usage` reports
  registers and spills per kernel for CI checks.
* :class:`Kernel` loads a cubin's kernel lazily into torch's CUDA context and launches it
  on torch's current stream after checking every argument (:meth:`Kernel.check_args`,
  which needs no GPU). Launches are graph-capturable.

Errors are :class:`RuntimeCompileError` (compiling), :class:`LaunchError` (bad grid or
arguments) and :class:`CudaDriverError` (a driver call failed), all ``LowvmError``\\ s.
"""

from lowvm.runtime.cache import cache_dir, cached_cubin
from lowvm.runtime.compiler import (
    COMPILERS,
    compile_cubin,
    compiler_identity,
    driver_version,
    find_nvcc,
    nvrtc_version,
    parse_ptxas_report,
    resource_usage,
)
from lowvm.runtime.errors import (
    CompileOptionError,
    CudaDriverError,
    LaunchError,
    RuntimeCompileError,
)
from lowvm.runtime.launch import Kernel
from lowvm.runtime.params import ParamSpec, pointer, scalar

__all__ = [
    "COMPILERS",
    "compile_cubin",
    "cached_cubin",
    "cache_dir",
    "resource_usage",
    "parse_ptxas_report",
    "compiler_identity",
    "nvrtc_version",
    "driver_version",
    "find_nvcc",
    "Kernel",
    "ParamSpec",
    "pointer",
    "scalar",
    "RuntimeCompileError",
    "CompileOptionError",
    "LaunchError",
    "CudaDriverError",
]
