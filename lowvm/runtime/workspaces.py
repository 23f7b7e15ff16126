"""Per-stream state of the GEMM launches: split-K workspaces and overlapped launches.

A split-K GEMM sums partial tiles in a float32 workspace and counts finished blocks in
int32 counters; :func:`split_buffers` keeps one zeroed pair per (device, stream, graph
capture), so graphs replayed in any order never see each other's state.
:func:`overlapped_launches` lets a thread's GEMMs start while the kernel before them is
still finishing (programmatic dependent launch).
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["split_buffers", "stream_and_capture", "overlapped_launches", "overlap_enabled",
           "warn_once"]

#: per (device, stream, capture): a zeroed float32 workspace and int32 tile counters for
#: split-K; every split GEMM leaves both zeroed again (``store_result``/``finish_split``)
_SPLIT: dict[tuple, tuple[Any, Any]] = {}
#: outgrown buffers: kernels recorded in a graph, or still queued, may use them (kept)
_RETIRED: list[tuple[Any, Any]] = []

_WARNED: set[str] = set()


def warn_once(message: str) -> None:
    """Warn of a degraded path (an unreadable tuning entry, an unidentified capture) once
    per process and message."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(f"lowvm: {message}; using the built-in schedules", stacklevel=3)


def split_buffers(device: Any, ws_numel: int, tiles: int) -> tuple[Any, Any]:
    """Workspace and counters of at least these sizes for the current stream.

    Launches on one stream run one after another, so they share one pair. While a CUDA
    graph is being captured the pair is the capture's own, zeroed by a memset recorded
    in the capture: a pair shared with other graphs could be dirtied by one of them
    replayed concurrently, or be zeroed only by the recording of an earlier graph. Each
    replay of a graph then re-zeroes its pair first.

    The memory itself is never taken from a graph's private pool (:func:`_unpooled`):
    the pair outlives the call, and torch.compile's CUDA-graph trees refuse a recording
    that leaves live tensors in their pool which they did not create.
    """
    stream, capture = stream_and_capture(device)
    key = (device, stream, capture)
    have = _SPLIT.get(key)
    if have is None or have[0].numel() < ws_numel or have[1].numel() < tiles:
        before = (0, 0) if have is None else (have[0].numel(), have[1].numel())
        sizes = (max(ws_numel, 2 * before[0], 1 << 16), max(tiles, 2 * before[1], 4096))
        ws, counters = _unpooled(sizes, device)
        ws.zero_()  # on the current stream: run now, or recorded in the capture
        counters.zero_()
        if have is not None:  # kernels queued, or recorded in a graph, may still use it
            _RETIRED.append(have)
        have = _SPLIT[key] = (ws, counters)
    return have


#: per device: the stream the split-K buffers are allocated on, which runs no work
_ALLOCATION_STREAMS: dict[int, Any] = {}


def _unpooled(sizes: tuple[int, int], device: Any) -> tuple[Any, Any]:
    """An uninitialised float32 workspace and int32 counters, allocated by a helper
    thread on a stream of our own: torch routes a capturing stream's allocations, and
    CUDA-graph trees (while they warm a function up and while they record it) the
    allocating *thread's*, into a graph's private pool; a fresh thread's on a stream
    that never captures are in neither. That stream runs no work, so the block cannot
    be one that queued kernels of another stream still use (the caching allocator
    reuses a block on its own stream without waiting). The helper launches nothing and
    runs in relaxed capture mode, so it cannot invalidate a capture underway here."""
    import torch

    def allocate() -> tuple[Any, Any]:
        return (torch.empty(sizes[0], dtype=torch.float32, device=device),
                torch.empty(sizes[1], dtype=torch.int32, device=device))

    device = torch.device(device)
    if device.type != "cuda":
        return allocate()
    index = device.index if device.index is not None else torch.cuda.current_device()
    device = torch.device("cuda", index)
    done: dict[str, Any] = {}

    def helper() -> None:
        from lowvm.runtime.driver import relaxed_capture_mode

        try:
            with torch.cuda.device(index), relaxed_capture_mode():
                if index not in _ALLOCATION_STREAMS:
                    _ALLOCATION_STREAMS[index] = torch.cuda.Stream(index)
                with torch.cuda.stream(_ALLOCATION_STREAMS[index]):
                    done["pair"] = allocate()
        except BaseException as exc:  # noqa: BLE001  (raised again in the caller)
            done["error"] = exc

    thread = threading.Thread(target=helper, name="lowvm-split-buffers")
    thread.start()
    thread.join()
    if "error" in done:
        raise done["error"]
    return done["pair"]


def stream_and_capture(device: Any) -> tuple[int, int]:
    """torch's current stream on ``device`` and the id of the graph it is capturing
    (0: none)."""
    import torch

    from lowvm.runtime.driver import capture_id, raw_stream_getter

    stream = int(raw_stream_getter()(device.index if device.index is not None else 0))
    try:
        return stream, capture_id(stream)
    except Exception as exc:  # a driver binding without the query: torch's yes/no only
        if not torch.cuda.is_current_stream_capturing():
            return stream, 0
        warn_once(f"cannot identify the CUDA graph being captured ({exc}); graphs "
                  "captured on one stream share split-K buffers, so replay them only "
                  "after their first replay in capture order")
        return stream, -1


#: per thread, set by :func:`overlapped_launches`
_OVERLAP = threading.local()


@contextlib.contextmanager
def overlapped_launches(enabled: bool = True) -> Iterator[None]:
    """GEMMs this thread launches inside start while the kernel before them is still
    finishing.

    Programmatic dependent launch (sm_90 and newer; nothing changes before): a GEMM
    loads its first weights, then waits for the previous kernel (``vm.wait_prior_grid``)
    before it reads x or writes anything, so its launch and first DRAM round trip hide
    behind that kernel's tail. The promise this asks for: no kernel launched right before
    a GEMM writes that GEMM's weights, scales or zeros (true of a model's forward; not of
    a repack or ``load_state_dict`` followed at once by a forward, which must run outside).
    A bfloat16 call that first casts the weight's float16 scales launches plainly (the
    cast is the kernel right before it), and ``weights_shared`` schedules wait before any
    load. For capturing decode steps in CUDA graphs, where small kernels' launch gaps add up.
    """
    before = overlap_enabled()
    _OVERLAP.on = bool(enabled)
    try:
        yield
    finally:
        _OVERLAP.on = before


def overlap_enabled() -> bool:
    """Whether this thread is inside :func:`overlapped_launches` (for other kernels that
    wait for the previous one themselves, e.g. :mod:`lowvm.nn.serve.attention`'s)."""
    return bool(getattr(_OVERLAP, "on", False))
