"""The original Marlin (IST-DASLab, Apache-2.0) as a baseline, built where its source is.

Marlin is the reference fp16 x int4 kernel at decode, so lowvm's int4 g128 rows are
worth most beside it, timed in the same run by the same method. It is not a package on
every machine: ``import marlin`` is used where it works (an installed build), else
``MARLIN_SRC=<dir>`` names a folder holding ``marlin/__init__.py``,
``marlin/marlin_cuda.cpp`` and ``marlin/marlin_cuda_kernel.cu``, which
:func:`load` compiles with ``torch.utils.cpp_extension.load`` into a build folder keyed by
the sources' hash (under ``~/.cache/lowvm/marlin``), so a second run reuses the build.
Anything missing makes :func:`load` raise :class:`MarlinUnavailable`, whose message the
run records as the rows' note ("not available: <reason>"); the run never fails for it.

What is timed: ``marlin.Layer(K, N, groupsize=128)`` holding the Marlin repack
(``Layer.pack``) of a random weight quantised symmetrically to int4 with one fp16 scale
per 128 inputs, ``dequant = (q - 8) * scale``: the weight :func:`dequantized` returns
for the float64 check.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowvm.bench.errors import BenchError

__all__ = ["SOURCE_ENV", "GROUP", "MarlinUnavailable", "MarlinWeight", "source_files",
           "build_dir", "load", "check_shape", "prepare", "run", "dequantized",
           "replicate"]

SOURCE_ENV = "MARLIN_SRC"
GROUP = 128
_SOURCES = ("marlin/marlin_cuda.cpp", "marlin/marlin_cuda_kernel.cu")


class MarlinUnavailable(BenchError):
    """Marlin cannot be timed here; the message says why."""


def source_files(src: str | os.PathLike[str]) -> tuple[Path, Path]:
    """The two sources under ``src``; :class:`MarlinUnavailable` if either is missing."""
    root = Path(src)
    paths = tuple(root / rel for rel in _SOURCES)
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise MarlinUnavailable(f"{SOURCE_ENV}={str(root)!r} lacks {', '.join(missing)}")
    if not (root / "marlin" / "__init__.py").is_file():
        raise MarlinUnavailable(f"{SOURCE_ENV}={str(root)!r} lacks marlin/__init__.py")
    return paths[0], paths[1]


def build_dir(sources: tuple[Path, ...], cache: str | os.PathLike[str] | None = None) -> Path:
    """A build folder named by the hash of the sources' bytes: rebuilt when they change."""
    digest = hashlib.sha256()
    for path in sources:
        digest.update(path.read_bytes())
    base = Path(cache) if cache is not None else Path.home() / ".cache" / "lowvm" / "marlin"
    return base / digest.hexdigest()[:16]


def _error(exc: BaseException) -> str:
    return (f"{type(exc).__name__}: {exc}".strip().splitlines() or ["?"])[0][:200]


def load(src: str | None = None) -> Any:
    """The ``marlin`` module: imported if installed, else built from ``src`` (default
    ``$MARLIN_SRC``). Raises :class:`MarlinUnavailable` saying why not."""
    try:
        return importlib.import_module("marlin")
    except Exception:  # not installed (or a broken install): try the source
        sys.modules.pop("marlin", None)
    src = src if src is not None else os.environ.get(SOURCE_ENV)
    if not src:
        raise MarlinUnavailable(f"marlin does not import and {SOURCE_ENV} is not set (a "
                                "folder with marlin/marlin_cuda.cpp and "
                                "marlin/marlin_cuda_kernel.cu)")
    sources = source_files(src)
    try:
        import torch
        from torch.utils.cpp_extension import load as load_extension

        if not torch.cuda.is_available():
            raise MarlinUnavailable("no CUDA device to build and run Marlin on")
        major, minor = torch.cuda.get_device_capability()
        folder = build_dir(sources)
        folder.mkdir(parents=True, exist_ok=True)
        sys.modules["marlin_cuda"] = load_extension(
            name="marlin_cuda", sources=[str(p) for p in sources],
            extra_cuda_cflags=["-O3", f"-gencode=arch=compute_{major}{minor},"
                               f"code=sm_{major}{minor}"],
            build_directory=str(folder), verbose=False)
        sys.path.insert(0, str(Path(src)))
        return importlib.import_module("marlin")
    except MarlinUnavailable:
        raise
    except Exception as exc:  # no nvcc, a compile error, an import error
        raise MarlinUnavailable(f"building Marlin from {src} failed: {_error(exc)}") from exc


def check_shape(k: int, n: int) -> None:
    """Marlin's own limits: K a multiple of 128, N of 256."""
    if k % 128 or n % 256:
        raise BenchError(f"marlin: K={k} must be a multiple of 128 and N={n} of 256")


@dataclass
class MarlinWeight:
    """A Marlin layer and the exact weight it multiplies by."""

    layer: Any
    dequant: Any     # float32 [N, K]


def prepare(marlin: Any, weight: Any) -> MarlinWeight:
    """Quantise ``weight [N, K]`` (fp16, on the GPU) to symmetric int4 g128 and pack it."""
    import torch

    n, k = weight.shape
    check_shape(k, n)
    w = weight.to(torch.float32).reshape(n, k // GROUP, GROUP)
    scales = (w.abs().amax(dim=2) / 7).clamp(min=1e-6).to(torch.float16)  # [N, K/128]
    s = scales.to(torch.float32).unsqueeze(2)
    q = torch.clamp(torch.round(w / s), -8, 7)
    dequant = (q * s).reshape(n, k)
    linear = torch.nn.Linear(k, n, bias=False, dtype=torch.float16, device=weight.device)
    linear.weight.data.copy_(dequant.to(torch.float16))
    layer = marlin.Layer(k, n, groupsize=GROUP).to(weight.device)
    layer.pack(linear, scales)
    return MarlinWeight(layer, dequant)


def run(w: MarlinWeight, x: Any) -> Any:
    """``x [M, K] fp16 @ dequant(W)^T`` -> ``[M, N]`` fp16."""
    return w.layer(x)


def dequantized(w: MarlinWeight) -> Any:
    """The exact dequantised weight ``[N, K]`` the layer multiplies by."""
    return w.dequant


def replicate(w: MarlinWeight) -> MarlinWeight:
    """A copy on fresh memory (weights, scales, workspace), for graph timings."""
    import copy

    return MarlinWeight(copy.deepcopy(w.layer), w.dequant)
