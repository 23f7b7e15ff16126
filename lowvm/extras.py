"""Optional dependencies: which extra installs each third-party module, and the error a
missing one raises.

``pip install lowvm`` brings numpy only, which is all that types, layouts, the
interpreter and CUDA generation need; the layers, the runtime, transformers and the
benchmarks come with extras (docs/install.md). Where code reaches an optional module it
goes through :func:`require`, :func:`reraise_missing` or :func:`stand_in`, so that a
missing module is a :class:`MissingDependencyError` naming the extra to install instead
of a bare ``ModuleNotFoundError`` deep inside a stack.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, NoReturn

from lowvm.errors import LowvmError

__all__ = ["MissingDependencyError", "EXTRAS", "CUDA_HINT", "install_hint", "require",
           "reraise_missing", "stand_in"]

CUDA_HINT = ("pip install 'lowvm[cuda13]' (NVIDIA driver 580 or newer) or "
             "pip install 'lowvm[cuda12]' (older drivers)")

#: top-level module (or dotted prefix) -> (distribution, the extra that installs it)
EXTRAS: dict[str, tuple[str, str]] = {
    "torch": ("torch", "torch"),
    "tqdm": ("tqdm", "torch"),
    "transformers": ("transformers", "hf"),
    "accelerate": ("accelerate", "hf"),
    "safetensors": ("safetensors", "hf"),
    "cuda.bindings": ("cuda-bindings", "cuda13"),
    "cuda.pathfinder": ("cuda-pathfinder", "cuda13"),
    "cuda": ("cuda-bindings", "cuda13"),
    "matplotlib": ("matplotlib", "bench"),
    "pynvml": ("nvidia-ml-py", "bench"),
}


class MissingDependencyError(LowvmError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


def _entry(module: str) -> tuple[str, str] | None:
    """The EXTRAS entry of the longest prefix of ``module``, or None."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        found = EXTRAS.get(".".join(parts[:n]))
        if found is not None:
            return found
    return None


def install_hint(module: str, extra: str | None = None) -> str:
    """The pip command that installs ``module`` (``pip install 'lowvm[hf]'``); ``extra``
    names a wider extra to suggest instead (one that also brings what comes next)."""
    entry = _entry(module)
    if entry is None:
        raise KeyError(f"install_hint: module {module!r} is not an optional dependency of "
                       f"lowvm; known: {sorted(EXTRAS)}")
    extra = extra or entry[1]
    if extra.startswith("cuda"):
        return CUDA_HINT
    return f"pip install 'lowvm[{extra}]'"


def _error(module: str, needed_for: str, cause: BaseException | None,
           extra: str | None = None) -> MissingDependencyError:
    dist = _entry(module)
    name = dist[0] if dist else module
    why = f" ({cause})" if cause is not None else ""
    return MissingDependencyError(
        f"{needed_for} needs the Python package {name!r} (module {module!r}), which is not "
        f"installed{why}; install it with: {install_hint(module, extra)}")


def require(module: str, needed_for: str, extra: str | None = None) -> ModuleType:
    """Import ``module``; if it (or a module it imports) is missing, raise
    MissingDependencyError naming ``needed_for`` and the extra to install."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        reraise_missing(exc, needed_for, extra)
        raise


def reraise_missing(exc: ModuleNotFoundError, needed_for: str, extra: str | None = None) -> None:
    """Raise MissingDependencyError from ``exc`` when the module it lacks is one an extra
    installs (suggesting ``extra`` where given); return otherwise, so the caller re-raises
    ``exc`` unchanged (a missing module of lowvm itself is a bug, not an install step)."""
    missing = exc.name or ""
    if missing and _entry(missing) is not None:
        raise _error(missing, needed_for, None, extra) from exc


class _StandIn:
    """Takes the place of a module that failed to import: attribute chains resolve (so
    module-level constants such as ``cu.CUresult.CUDA_SUCCESS`` can be defined), and the
    first real use (a call or an isinstance check) raises MissingDependencyError."""

    def __init__(self, path: str, module: str, needed_for: str, cause: BaseException) -> None:
        self._path, self._module, self._needed_for, self._cause = path, module, needed_for, cause

    def __getattr__(self, name: str) -> _StandIn:
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandIn(f"{self._path}.{name}", self._module, self._needed_for, self._cause)

    def _fail(self) -> NoReturn:
        raise _error(self._module, f"{self._needed_for} ({self._path})",
                     self._cause) from self._cause

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        self._fail()

    def __instancecheck__(self, instance: Any) -> bool:
        self._fail()

    def __repr__(self) -> str:
        return f"<{self._path}: {self._module} is not installed>"


def stand_in(module: str, needed_for: str, cause: BaseException) -> Any:
    """An object to bind in place of ``module`` after ``import module`` failed with
    ``cause``: importing the caller still works, using the module raises
    MissingDependencyError (see _StandIn)."""
    return _StandIn(module, module, needed_for, cause)
