"""Wall-clock timing of device work: synchronized before and after on CUDA."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["timed"]


def timed(fn: Callable[[], Any], device: str) -> tuple[float, Any]:
    """``(seconds, fn())``, with the device's queued work done at both ends."""
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out
