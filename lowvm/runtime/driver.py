"""Thin, checked wrappers over the CUDA driver API calls the launcher needs.

cuda-python returns every driver call's status as the first element of a tuple instead of
raising, so an unchecked call fails silently and the next one reports a confusing error.
:func:`check` turns a non-success status into :class:`~lowvm.runtime.errors.CudaDriverError`
naming the call and the error (``CUDA_ERROR_INVALID_PTX: a PTX JIT compilation failed``).

lowvm shares PyTorch's CUDA context rather than making its own: tensors, streams and
CUDA graphs all belong to the device's *primary* context, and a module loaded into any
other context could not touch them. :func:`ensure_context` lets torch initialise CUDA,
and only when no context is current on this thread retains and binds the primary one
(the one torch uses too).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

from lowvm.extras import stand_in
from lowvm.runtime.errors import CudaDriverError, LaunchError

try:
    from cuda.bindings import driver as cu
except ModuleNotFoundError as _exc:  # a CPU-only install: nothing here can run
    cu = stand_in("cuda.bindings.driver", "running kernels on a GPU", _exc)

__all__ = [
    "check",
    "error_name",
    "ensure_context",
    "current_device",
    "device_getter",
    "raw_stream_getter",
    "stream_handle",
]

_SUCCESS = cu.CUresult.CUDA_SUCCESS
_NOT_INITIALIZED = cu.CUresult.CUDA_ERROR_NOT_INITIALIZED
# Per device, the primary context this module retained (retained once, bound per thread).
_retained: dict[int, Any] = {}


def error_name(err: Any) -> str:
    """``"CUDA_ERROR_X: description"`` for a CUresult (falls back to its repr)."""
    try:
        e1, name = cu.cuGetErrorName(err)
        e2, text = cu.cuGetErrorString(err)
    except Exception:
        return repr(err)
    name_s = name.decode() if e1 == _SUCCESS and isinstance(name, bytes) else repr(err)
    text_s = text.decode() if e2 == _SUCCESS and isinstance(text, bytes) else ""
    return f"{name_s}: {text_s}" if text_s else name_s


def check(result: tuple, what: str) -> Any:
    """Raise CudaDriverError if ``result[0]`` is not CUDA_SUCCESS; else the payload.

    Returns None for a call with no outputs, the value for one output, else a tuple.
    """
    err = result[0]
    if err != _SUCCESS:
        raise CudaDriverError(f"{what} failed with {error_name(err)}")
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


def current_device() -> int:
    """torch's current CUDA device index (initialising torch's CUDA state if needed)."""
    import torch

    if not torch.cuda.is_available():
        raise CudaDriverError(
            "lowvm.runtime: launching a kernel needs a CUDA device, and torch sees none "
            "(torch.cuda.is_available() is False; a CPU-only torch build or no driver)"
        )
    return int(torch.cuda.current_device())


def device_getter() -> Callable[[], int]:
    """A function giving torch's current device index, as cheaply as possible.

    Call once torch's CUDA state is initialised (after :func:`current_device`): then
    torch's internal ``_cuda_getDevice`` (a plain cudaGetDevice, about 0.15 µs) is exact,
    where ``torch.cuda.current_device()`` re-checks initialisation each time (0.5 µs).
    """
    import torch

    current_device()
    getter = getattr(torch._C, "_cuda_getDevice", None)
    return getter if getter is not None else current_device


def ensure_context(device: int) -> None:
    """Make the primary context of ``device`` current on this thread if none of it is.

    Usually torch has already done so (cudaSetDevice binds the primary context), and this
    only reads ``cuCtxGetCurrent``; otherwise it calls ``cuInit(0)``,
    ``cuDevicePrimaryCtxRetain`` (once per device and process) and ``cuCtxSetCurrent``.
    """
    import torch

    torch.cuda.init()
    result = cu.cuCtxGetCurrent()
    if result[0] == _NOT_INITIALIZED:
        check(cu.cuInit(0), "cuInit(0)")
        result = cu.cuCtxGetCurrent()
    ctx = check(result, "cuCtxGetCurrent()")
    if int(ctx) != 0:
        ctx_device = int(check(cu.cuCtxGetDevice(), "cuCtxGetDevice()"))
        if ctx_device == device:
            return
    primary = _retained.get(device)
    if primary is None:
        dev = check(cu.cuDeviceGet(device), f"cuDeviceGet({device})")
        primary = check(cu.cuDevicePrimaryCtxRetain(dev), f"cuDevicePrimaryCtxRetain({device})")
        _retained[device] = primary
    check(cu.cuCtxSetCurrent(primary), f"cuCtxSetCurrent(primary context of cuda:{device})")


@functools.cache
def raw_stream_getter() -> Callable[[int], int]:
    """A function ``device -> int`` giving torch's current stream handle on ``device``.

    Prefers torch's internal ``_cuda_getCurrentRawStream`` (no Stream object is built,
    which matters at a few microseconds per launch), else the public
    ``torch.cuda.current_stream(device).cuda_stream``. Inside ``torch.cuda.graph`` both
    give the capture stream.
    """
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw

    def public(device: int) -> int:
        return int(torch.cuda.current_stream(device).cuda_stream)

    return public


def capture_id(stream: int) -> int:
    """The id of the CUDA graph capture ``stream`` is recording (unique in the process),
    or 0 when it is not capturing: work that must be set up once per captured graph
    (e.g. zeroed scratch memory) keys on it."""
    result = cu.cuStreamGetCaptureInfo(cu.CUstream(stream))
    check(result[:2], f"cuStreamGetCaptureInfo(stream {stream:#x})")
    status, ident = result[1], result[2]
    active = cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
    return int(ident) if status == active else 0


@contextlib.contextmanager
def relaxed_capture_mode() -> Iterator[None]:
    """This thread in relaxed stream-capture mode for the block: an allocation it makes
    (``cudaMalloc``) cannot invalidate a capture another thread has underway. The
    previous mode is restored after."""
    relaxed = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    previous = check(cu.cuThreadExchangeStreamCaptureMode(relaxed),
                     "cuThreadExchangeStreamCaptureMode")
    try:
        yield
    finally:
        check(cu.cuThreadExchangeStreamCaptureMode(previous),
              "cuThreadExchangeStreamCaptureMode")


def stream_handle(stream: Any) -> int:
    """The ``CUstream`` handle (as an int) of a torch stream, a CUstream or an int."""
    handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream / ExternalStream
    if handle is not None:
        return int(handle)
    if isinstance(stream, cu.CUstream):
        return int(stream)
    if isinstance(stream, int) and not isinstance(stream, bool) and stream >= 0:
        return stream
    raise LaunchError(
        f"Kernel.launch: stream must be None (torch's current stream), a "
        f"torch.cuda.Stream, a cuda.bindings.driver.CUstream or an int handle, got {stream!r}"
    )
