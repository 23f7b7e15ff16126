"""Errors of the CUDA runtime layer: compiling, loading and launching kernels.

They are :class:`~lowvm.errors.LowvmError` subclasses like every other lowvm error, so one
``except LowvmError`` catches them, and each also derives from the builtin a generic
handler would expect: a failed compile or driver call is a ``RuntimeError`` (nothing the
caller passed was malformed, the toolchain or the GPU said no), a bad launch argument is a
``ValueError``. Messages name the argument, the value given and what is accepted.
"""

from __future__ import annotations

from lowvm.errors import LowvmError

__all__ = [
    "RuntimeCompileError",
    "CompileOptionError",
    "LaunchError",
    "CudaDriverError",
]


class RuntimeCompileError(LowvmError, RuntimeError):
    """CUDA source did not compile, or no compiler could be found or loaded."""


class CompileOptionError(RuntimeCompileError, ValueError):
    """A compile request that is malformed before any compiler runs (bad arch or compiler).

    A :class:`RuntimeCompileError` (everything :func:`compile_cubin` raises is one) and a
    ``ValueError`` (the caller passed a bad value).
    """


class LaunchError(LowvmError, ValueError):
    """A kernel launch whose grid or arguments do not match the kernel's declaration."""


class CudaDriverError(LowvmError, RuntimeError):
    """A CUDA driver call (module load, attribute, launch) returned an error code."""
