"""Run a quantized GEMM on the GPU: plan (kernel, schedule, compiled program) once per call
shape, then launch on torch's current stream.

``quant_linear`` picks the kernel for the batch size: on sm_90 the wgmma kernel where
:func:`~lowvm.kernels.schedules.runs_wgmma` says so, ``quant_gemm_prefill`` where
:func:`~lowvm.kernels.schedules.prefill_split` does, else ``quant_gemm``; a schedule from
the registered source (:mod:`lowvm.kernels.schedule_source`: the tuning cache) comes
before the built-in choice. Each plan is cached under its kernel kind and call shape, so a
repeated call (every decode step) costs one dict lookup; each program specialisation is
compiled once (memory and disk cached).

:class:`GemmLaunch` (:func:`prepare_quant_linear`) goes one step further for a call
repeated with new activations, as a layer's every decode step: the plan, the scales in
the activation type, the split-K buffers and the packed launch arguments, found once per
(call shape, stream), so that a call costs an allocation and one ``cuLaunchKernel``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lowvm.driver import compile as compile_program
from lowvm.dtypes import DType
from lowvm.dtypes import dtype as as_dtype
from lowvm.errors import LowvmError
from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.kernels.quant_gemm import finish_split, quant_gemm
from lowvm.kernels.schedule_source import schedule_source
from lowvm.kernels.schedules import (
    THRESHOLDS,
    choose_prefill_schedule,
    choose_schedule,
    choose_wgmma_schedule,
    plan_refusal,
    prefill_split,
    runs_wgmma,
    wgmma_refusal,
)
from lowvm.kernels.weights import WEIGHT_BN, QuantWeight, check_activation
from lowvm.runtime.launch import eager_stream
from lowvm.runtime.workspaces import overlap_enabled, split_buffers

__all__ = ["quant_linear", "prefill_quant_linear", "wgmma_quant_linear", "plan", "is_sm90",
           "Plan", "QUANT_GEMM", "PREFILL", "WGMMA", "GemmLaunch", "prepare_quant_linear"]

#: (compiled GEMM, compiled unfused split-K epilogue or None, rows per output tile when
#: split > 1, else 0)
Plan = tuple[Any, Any, int]
#: the kernel kinds a plan is made for
QUANT_GEMM, PREFILL, WGMMA = "quant_gemm", "quant_gemm_prefill", "quant_gemm_wgmma"

#: bumped whenever the plans are dropped: a GemmLaunch made before is stale
_GENERATION = [0]


class _PlanCache(dict):
    """The plans; clearing them (a changed tuning cache) also retires every
    :class:`GemmLaunch` made from them."""

    def clear(self) -> None:
        super().clear()
        _GENERATION[0] += 1


#: plans by (kernel kind, call shape)
_PLANS: dict[tuple, Plan] = _PlanCache()
#: compiled programs by (program name, constants)
_COMPILED: dict[tuple, Any] = {}


def quant_linear(x: Any, weight: QuantWeight, schedule: GemmSchedule | None = None) -> Any:
    """``x [M, K] @ dequant(weight)^T`` -> ``[M, N]`` on the GPU, float16 or bfloat16
    (``schedule``: that one, a wgmma one when ``schedule.wgmma``; see the module
    docstring for the kernel chosen without one)."""
    x = check_activation(x, weight)
    return _run(x, weight, schedule, _planner(x, weight, schedule))


def _planner(x: Any, weight: QuantWeight, schedule: GemmSchedule | None) -> Any:
    """The plan maker of the kernel :func:`quant_linear` runs for this call."""
    m, n = x.shape[0], weight.n
    if schedule is not None and schedule.wgmma:
        return _wgmma_plan
    if schedule is None and is_sm90(x.device) and runs_wgmma(m, weight):
        return _wgmma_plan
    if (schedule is None and THRESHOLDS.prefill_kernel == "quant_gemm_prefill"
            and prefill_split(m, n, weight.k, weight.bk)):
        return _prefill_plan
    return _plan


def wgmma_quant_linear(x: Any, weight: QuantWeight, schedule: GemmSchedule | None = None
                       ) -> Any:
    """:func:`quant_linear` through :func:`~lowvm.kernels.quant_gemm_wgmma.quant_gemm_wgmma`
    (Hopper, sm_90a: weights dequantised into wgmma's register operand, x read by the
    tensor cores from shared memory), same weights."""
    return _run(check_activation(x, weight), weight, schedule, _wgmma_plan)


def prefill_quant_linear(x: Any, weight: QuantWeight, schedule: GemmSchedule | None = None
                         ) -> Any:
    """:func:`quant_linear` through :func:`~lowvm.kernels.quant_gemm_prefill.quant_gemm_prefill`
    (each weight tile dequantised once per block; meant for M > 128), same weights."""
    return _run(check_activation(x, weight), weight, schedule, _prefill_plan)


def is_sm90(device: Any) -> bool:
    """Whether ``device`` runs sm_90a code (H100/H200), asked of torch once per device."""
    if device not in _SM90:
        _SM90[device] = _device_arch(device) == "sm_90"
    return _SM90[device]


_SM90: dict[Any, bool] = {}


def _device_arch(device: Any) -> str:
    """``sm_XY`` of a CUDA device (what ``lowvm.compile`` builds for)."""
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def _tuned(m: int, weight: QuantWeight) -> GemmSchedule | None:
    """The registered source's pick (the tuning cache), or None."""
    source = schedule_source()
    return None if source is None else source(m, weight)


def plan(kind: str, m: int, weight: QuantWeight, adtype: DType, zero_point: bool,
         schedule: GemmSchedule | None) -> Plan:
    """The cached :data:`Plan` of kernel ``kind`` for one call shape, activations of
    ``adtype`` (made on first use)."""
    key = (kind, m, weight.n, weight.k, weight.bk, weight.wtype, weight.group, adtype,
           zero_point, schedule)
    made = _PLANS.get(key)
    if made is None:
        made = _PLANS[key] = _MAKERS[kind](m, weight, adtype, zero_point, schedule)
    return made


def _plan(m: int, weight: QuantWeight, adtype: DType, zero_point: bool,
          schedule: GemmSchedule | None) -> Plan:
    """The ``quant_gemm`` plan (see :func:`plan`)."""
    return plan(QUANT_GEMM, m, weight, adtype, zero_point, schedule)


def _prefill_plan(m: int, weight: QuantWeight, adtype: DType, zero_point: bool,
                  schedule: GemmSchedule | None) -> Plan:
    """The ``quant_gemm_prefill`` plan (see :func:`plan`)."""
    return plan(PREFILL, m, weight, adtype, zero_point, schedule)


def _wgmma_plan(m: int, weight: QuantWeight, adtype: DType, zero_point: bool,
                schedule: GemmSchedule | None) -> Plan:
    """The ``quant_gemm_wgmma`` plan (see :func:`plan`)."""
    return plan(WGMMA, m, weight, adtype, zero_point, schedule)


def _make_quant_gemm(m: int, weight: QuantWeight, adtype: DType, zero_point: bool,
                     schedule: GemmSchedule | None) -> Plan:
    n, k = weight.n, weight.k
    tuned = None if schedule else _tuned(m, weight)
    s = schedule or (tuned if tuned and not tuned.wgmma else None) or choose_schedule(
        m, n, k, weight.bk)
    refusal = plan_refusal(s, k, weight.bk)
    if refusal:
        raise LowvmError(f"schedule {s}: {refusal}")
    gemm = _compiled(quant_gemm, adtype=adtype, wtype=weight.wtype, group=weight.group,
                     zero_point=zero_point, schedule=s)
    return gemm, _finisher(s, adtype), s.rows if s.split > 1 else 0


def _make_prefill(m: int, weight: QuantWeight, adtype: DType, zero_point: bool,
                  schedule: GemmSchedule | None) -> Plan:
    from lowvm.kernels.quant_gemm_prefill import quant_gemm_prefill, threads_fit

    n, k = weight.n, weight.k
    s = schedule or choose_prefill_schedule(m, n, k, weight.bk, weight.wtype,
                                            _device_arch(weight.packed.device))
    extra = {f: getattr(s, f) for f in ("x_steps", "l2_ahead", "k_slice", "x_whole",
                                        "x_rows", "swap_ab", "wgmma") if getattr(s, f)}
    if extra:
        raise LowvmError(f"prefill schedule {s}: {extra} are options of quant_gemm's "
                         "decode body or the wgmma kernel; quant_gemm_prefill takes none "
                         "of them")
    if s.bk != weight.bk or s.bn % WEIGHT_BN or n % s.bn:
        raise LowvmError(f"prefill schedule {s} does not fit the weight (bk={weight.bk}, "
                         f"N = {n}; bn must be a multiple of {WEIGHT_BN} dividing N)")
    if (k // s.bk) % (s.split * s.prefetch):
        raise LowvmError(f"prefill schedule {s}: K / bk = {k // s.bk} steps must be a "
                         f"multiple of split x prefetch = {s.split * s.prefetch}")
    if not threads_fit(weight.wtype, s):
        raise LowvmError(f"prefill schedule {s}: its {s.warps_m * s.warps_n * 32} threads "
                         f"cannot split the {weight.wtype.name} weight tile evenly; use "
                         f"one thread per 64 x 4 weight columns ({s.bn // WEIGHT_BN * 128})")
    gemm = _compiled(quant_gemm_prefill, adtype=adtype, wtype=weight.wtype,
                     group=weight.group, zero_point=zero_point, schedule=s)
    return gemm, _finisher(s, adtype), s.bm if s.split > 1 else 0


def _make_wgmma(m: int, weight: QuantWeight, adtype: DType, zero_point: bool,
                schedule: GemmSchedule | None) -> Plan:
    from lowvm.kernels.quant_gemm_wgmma import quant_gemm_wgmma

    n, k = weight.n, weight.k
    s = (schedule or _tuned_wgmma(m, weight)
         or choose_wgmma_schedule(m, n, k, weight.bk, weight.wtype))
    if s is None:
        raise LowvmError(f"the wgmma GEMM needs K tiles of 64 or 128 (group >= 64); this "
                         f"weight has bk={weight.bk}")
    reason = wgmma_refusal(s, n, k, weight.bk, weight.wtype)
    if reason:
        raise LowvmError(f"wgmma schedule {s}: {reason}")
    gemm = _compiled(quant_gemm_wgmma, adtype=adtype, wtype=weight.wtype,
                     group=weight.group, zero_point=zero_point, schedule=s)
    return gemm, _finisher(s, adtype), s.bm if s.split > 1 else 0


def _tuned_wgmma(m: int, weight: QuantWeight) -> GemmSchedule | None:
    """The registered source's pick where it is a wgmma schedule (else None)."""
    s = _tuned(m, weight)
    return s if s is not None and s.wgmma else None


_MAKERS: dict[str, Callable[..., Plan]] = {
    QUANT_GEMM: _make_quant_gemm, PREFILL: _make_prefill, WGMMA: _make_wgmma}


def _compiled(program: Any, **constants: Any) -> Any:
    """``lowvm.compile(program, **constants)``, once per process and specialisation."""
    key = (program.name, tuple(sorted((k, str(v)) for k, v in constants.items())))
    if key not in _COMPILED:
        _COMPILED[key] = compile_program(program, **constants)
    return _COMPILED[key]


def _finisher(s: GemmSchedule, adtype: DType) -> Any:
    """The compiled unfused split-K epilogue of schedule ``s``, or None."""
    if s.split == 1 or s.fused_split:
        return None
    return _compiled(finish_split, adtype=adtype)


def _run(x: Any, weight: QuantWeight, schedule: GemmSchedule | None, planner: Any) -> Any:
    """Launch the plan ``planner`` makes for this call (the GEMM, whose split-K sums are
    finished in-kernel, or for ``fused_split=False`` schedules the GEMM and
    :func:`finish_split`; both leave the per-stream workspace zeroed)."""
    # a first bfloat16 call casts the scales (and zeros) right before the GEMM, which
    # reads them before its wait: that launch must not overlap the cast
    overlap = overlap_enabled() and weight.holds(x.dtype)
    gemm, finish, args = _gemm_call(x, weight, schedule, planner)
    gemm(*args, overlap=overlap and gemm.cuda.waits_prior_grid)
    m, n, _, _, _, _, _, y, ws, _ = args
    if finish is not None:
        finish(m * n, ws, y)
    return y


def _gemm_call(x: Any, weight: QuantWeight, schedule: GemmSchedule | None, planner: Any
               ) -> tuple[Any, Any, tuple]:
    """``(gemm, finish or None, the GEMM's arguments)`` of this call: the plan
    ``planner`` makes, the scales in x's type and a new ``y``; split-K buffers where the
    plan splits K, else placeholders."""
    import torch

    m, n, k = x.shape[0], weight.n, weight.k
    scales, zeros = weight.for_dtype(x.dtype)
    gemm, finish, tile_rows = planner(m, weight, as_dtype(x.dtype), zeros is not None,
                                      schedule)
    zeros = scales if zeros is None else zeros  # not read without zero_point
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if tile_rows:  # split-K: one counter per output tile (tiles are at least 16 wide)
        ws, counters = split_buffers(x.device, m * n, -(-m // tile_rows) * (n // 16))
    else:
        ws, counters = _dummy(x.device), _dummy(x.device, torch.int32)
    return gemm, finish, (m, n, k, x, weight.packed, scales, zeros, y, ws, counters)


_DUMMIES: dict[Any, Any] = {}


def _dummy(device: Any, dtype: Any = None) -> Any:
    """A tiny buffer for pointer arguments a specialisation never reads."""
    import torch

    dtype = dtype or torch.float32
    if (device, dtype) not in _DUMMIES:
        _DUMMIES[device, dtype] = torch.zeros(4, dtype=dtype, device=device)
    return _DUMMIES[device, dtype]


def prepare_quant_linear(x: Any, weight: QuantWeight, schedule: GemmSchedule | None = None
                         ) -> GemmLaunch:
    """:func:`quant_linear` for calls shaped like ``x`` on the current stream, made ready
    to launch (see :class:`GemmLaunch`). Not while that stream captures a CUDA graph."""
    return GemmLaunch(x, weight, schedule)


class GemmLaunch:
    """:func:`quant_linear` for one call shape (M, activation dtype, device) on one
    stream, with everything but x and y found once.

    A call then checks that x is such a call's (one row count, dtype, device; contiguous
    and 16-byte aligned), allocates y and launches the GEMM (and, for unfused split-K
    schedules, the epilogue) through bound launches
    (:class:`~lowvm.runtime.launch.BoundLaunch`). The weight's tensors are read through
    their addresses at preparation: a weight whose tensors are replaced needs a new
    GemmLaunch (in-place changes of the packed codes are seen; a cast copy of the scales
    for bfloat16 is not). A launch made before the plans were cleared
    (``_PLANS.clear()``) returns None instead of running: prepare a new one.
    """

    def __init__(self, x: Any, weight: QuantWeight, schedule: GemmSchedule | None = None
                 ) -> None:
        x = check_activation(x, weight)
        device = x.get_device()
        stream = eager_stream(device)
        if stream is None:
            raise LowvmError(f"prepare_quant_linear: x is on {x.device}, which is not "
                             "torch's current device, or the current stream is capturing a "
                             "CUDA graph (launches recorded there need the capture's own "
                             "split-K buffers); call quant_linear there instead")
        generation = _GENERATION[0]
        gemm, finish, args = _gemm_call(x, weight, schedule, _planner(x, weight, schedule))
        m, n, _, _, _, _, _, y, ws, _ = args
        names = [p.name for p in gemm.kernel.params]
        #: the GEMM's :class:`~lowvm.runtime.launch.BoundLaunch` (free pointers x, y)
        self.gemm = gemm.kernel.bind(gemm.grid(args), args,
                                     (names.index("x"), names.index("y")), device, stream)
        self._finish = None
        if finish is not None:
            fargs = (m * n, ws, y)
            self._finish = finish.kernel.bind(finish.grid(fargs), fargs, (2,), device, stream)
        self.m, self.n, self.dtype, self.device, self.stream = m, n, x.dtype, device, stream
        self.kernel = gemm.program.name  # which GEMM program runs (for reports)
        self._waits = bool(gemm.cuda.waits_prior_grid)
        # the first call may follow the cast that made the scales: it must not overlap it
        self._fresh = True
        self._generation = generation

    def __call__(self, x: Any, stream: int) -> Any:
        """``x [M, K] @ dequant(W)^T`` -> a new ``y [M, N]``, launched on ``stream`` (the
        one this launch was made for), or None where the plans were cleared since."""
        if self._generation != _GENERATION[0]:
            return None
        ptr = x.data_ptr()
        if (ptr & 15 or stream != self.stream or x.dtype is not self.dtype
                or x.size(0) != self.m or x.get_device() != self.device
                or not x.is_contiguous()):
            raise LowvmError(
                f"GemmLaunch: made for contiguous 16-byte aligned {self.dtype} x with "
                f"{self.m} rows on device {self.device}, stream {self.stream:#x}; got "
                f"{x.dtype} x of shape {list(x.shape)} on {x.device} (contiguous: "
                f"{x.is_contiguous()}, data_ptr {ptr:#x}), stream {stream:#x}")
        y = x.new_empty((self.m, self.n))
        out = y.data_ptr()
        if self._fresh:
            self._fresh = overlap = False
        else:
            overlap = self._waits and overlap_enabled()  # only kernels that wait may overlap
        self.gemm(ptr, out, overlap=overlap)
        if self._finish is not None:
            self._finish(out)
        return y
