"""GPU ``measure`` functions for the autotuner, by the benchmark's method.

``cuda_measure(build)`` turns ``build(schedule) -> run`` (compile the kernel for the
schedule, bind its arguments, return a no-argument launcher) into the
``measure(schedule) -> seconds`` the :class:`~lowvm.tune.Autotuner` takes: CUDA events,
warm-up, the L2 flushed before each run, the median of ``runs``.
``quant_linear_build(weight, m)`` is that ``build`` for the library: ``quant_linear``
on random activations with the candidate schedule, each checked against the built-in
choice's output first, so a schedule that computes something else can never win.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lowvm.tune.errors import TuneError

__all__ = ["cuda_measure", "quant_linear_build"]


def cuda_measure(build: Callable[[Any], Callable[[], Any]], runs: int = 30,
                 warmup: int = 3) -> Callable[[Any], float]:
    """A measure function timing ``build(schedule)()`` on the current GPU."""
    from lowvm.runtime.timing import L2Flusher, time_cuda

    flush: list[L2Flusher] = []  # allocated on first use, shared by every candidate

    def measure(schedule: Any) -> float:
        if not flush:
            flush.append(L2Flusher())
        run = build(schedule)
        return time_cuda(run, runs=runs, warmup=warmup, flush=flush[0]).median_us * 1e-6

    return measure


def quant_linear_build(weight: Any, m: int, act_dtype: Any = None, *, seed: int = 0,
                       tolerance: float = 2e-3) -> Callable[[Any], Callable[[], Any]]:
    """``build(schedule) -> run`` timing ``quant_linear(x, weight, schedule)`` for ``x``
    of ``m`` random rows (``act_dtype``, default float16) on the weight's device.

    Before a schedule is timed its output is compared with the built-in choice's
    (``quant_linear`` without a schedule, computed once): a relative error above
    ``tolerance`` raises, which the tuner records as that candidate's failure.
    """
    import torch

    from lowvm.kernels.dispatch import quant_linear

    if not isinstance(m, int) or m < 1:
        raise TuneError(f"m={m!r}: the token count must be a positive integer")
    dtype = act_dtype if act_dtype is not None else torch.float16
    gen = torch.Generator(device=weight.packed.device).manual_seed(seed)
    x = torch.randn(m, weight.k, generator=gen, device=weight.packed.device).to(dtype)
    reference = quant_linear(x, weight).double()
    scale = float(torch.linalg.vector_norm(reference)) or 1.0

    def build(schedule: Any) -> Callable[[], Any]:
        y = quant_linear(x, weight, schedule)
        err = float(torch.linalg.vector_norm(y.double() - reference)) / scale
        if not err <= tolerance:
            raise TuneError(f"schedule {schedule}: relative error {err:.2e} against the "
                            f"built-in choice exceeds tolerance={tolerance}")
        return lambda: quant_linear(x, weight, schedule)

    return build
