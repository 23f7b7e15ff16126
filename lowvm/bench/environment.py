"""What produced a result: commit, GPU, driver and library versions, the command.

A figure without the code and machine behind it cannot be compared or reproduced, so
every results document carries :func:`collect`'s fields. Each probe that can fail (no
git, no GPU, no NVRTC) records ``None`` instead of failing the run.
"""

from __future__ import annotations

import datetime
import platform
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["ENVIRONMENT_KEYS", "git_state", "command_line", "collect"]

#: The keys of a document's ``environment`` object.
ENVIRONMENT_KEYS = ("commit", "dirty", "gpu", "driver", "torch", "cuda", "nvrtc",
                    "transformers", "python", "date", "command")


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


def _driver() -> Any:
    from lowvm.runtime import driver_version

    return driver_version()


def _nvrtc() -> Any:
    from lowvm.runtime import nvrtc_version

    return nvrtc_version()


def _cuda() -> str | None:
    import torch

    return torch.version.cuda


def collect(argv: list[str] | None = None, cwd: str | Path | None = None) -> dict[str, Any]:
    """The top-level fields of a document (``gpu``, ``date``, ``torch_version``,
    ``cuda_version``, ``sm_count``, ``driver``) and its ``environment`` object."""
    commit, dirty = git_state(cwd)
    gpu, sms = _probe(_gpu) or (None, None)
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    env = {
        "commit": commit,
        "dirty": dirty,
        "gpu": gpu,
        "driver": _probe(_driver),
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
