"""What produced a result: commit, GPU, driver and library versions, the command.

A figure without the code and machine behind it cannot be compared or reproduced, so
every results document carries :func:`collect`'s fields. Each probe that can fail (no
git, no GPU, no NVRTC) records ``None`` instead of failing the run.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ENVIRONMENT_KEYS", "COMMIT_VARIABLE", "git_state", "commit_state", "command_line",
           "collect"]

#: The keys of a document's ``environment`` object.
ENVIRONMENT_KEYS = ("commit", "commit_source", "dirty", "gpu", "driver", "cuda_driver",
                    "torch", "cuda", "nvrtc", "transformers", "python", "date", "command")

#: Set to the commit a copied tree was made from, where the copy's git metadata is not
#: that commit's (a working tree shipped to a GPU machine beside an older ``.git``)
COMMIT_VARIABLE = "LOWVM_COMMIT"


def _git(*args: str, cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                             timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def git_state(cwd: str | Path | None = None) -> tuple[str | None, bool | None]:
    """``(HEAD commit, whether tracked files differ from it)``; ``(None, None)`` outside
    a git checkout."""
    where = Path(cwd) if cwd is not None else Path(__file__).resolve().parents[2]
    commit = _git("rev-parse", "HEAD", cwd=where)
    if not commit:
        return None, None
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=where)
    return commit, None if status is None else bool(status)


def commit_state(cwd: str | Path | None = None) -> tuple[str | None, bool | None, str]:
    """``(commit, dirty, source)``: ``$LOWVM_COMMIT`` when set (source ``"LOWVM_COMMIT"``,
    dirty unknown), else git's HEAD and status (source ``"git"``)."""
    given = os.environ.get(COMMIT_VARIABLE, "").strip()
    if given:
        return given, None, COMMIT_VARIABLE
    commit, dirty = git_state(cwd)
    return commit, dirty, "git"


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed: ``python -m lowvm.bench <args>``."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python -m lowvm.bench", *map(shlex.quote, args)])


def _probe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # an informative field only
        return None


def _version(module: str) -> str | None:
    def get() -> str | None:
        import importlib

        return getattr(importlib.import_module(module), "__version__", None)

    return _probe(get)


def _gpu() -> tuple[str | None, int | None]:
    import torch

    if not torch.cuda.is_available():
        return None, None
    props = torch.cuda.get_device_properties(0)
    return torch.cuda.get_device_name(), props.multi_processor_count


def _cuda_driver() -> Any:
    from lowvm.runtime import driver_version

    return driver_version()


def _driver_release() -> str | None:
    """The NVIDIA driver's release (e.g. ``580.159.04``), from NVML or nvidia-smi."""
    try:
        import pynvml

        pynvml.nvmlInit()
        release = pynvml.nvmlSystemGetDriverVersion()
        return release.decode() if isinstance(release, bytes) else str(release)
    except Exception:  # no NVML binding: ask nvidia-smi
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    return lines[0] if lines else None


def _nvrtc() -> Any:
    from lowvm.runtime import nvrtc_version

    return nvrtc_version()


def _cuda() -> str | None:
    import torch

    return torch.version.cuda


def collect(argv: list[str] | None = None, cwd: str | Path | None = None) -> dict[str, Any]:
    """The top-level fields of a document (``gpu``, ``date``, ``torch_version``,
    ``cuda_version``, ``sm_count``, ``driver``) and its ``environment`` object."""
    commit, dirty, source = commit_state(cwd)
    gpu, sms = _probe(_gpu) or (None, None)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    env = {
        "commit": commit,
        "commit_source": source,
        "dirty": dirty,
        "gpu": gpu,
        "driver": _probe(_driver_release),
        "cuda_driver": _probe(_cuda_driver),
        "torch": _version("torch"),
        "cuda": _probe(_cuda),
        "nvrtc": _probe(_nvrtc),
        "transformers": _version("transformers"),
        "python": platform.python_version(),
        "date": date,
        "command": command_line(argv),
    }
    return {"gpu": gpu or "no GPU", "date": date, "torch_version": env["torch"] or "",
            "cuda_version": env["cuda"], "sm_count": sms, "driver": env["driver"],
            "environment": env}
