"""Launching a compiled cubin's kernel on torch tensors, checked and cheap on the host.

A decode step of an LLM launches hundreds of small kernels, so the host time of one
launch is a cost paid on every token; :class:`Kernel` keeps it to the argument checks and
one ``cuLaunchKernel``. Everything that can be worked out once is: the ctypes types
tuple cuda-python packs the arguments with, one converter per parameter (see
:mod:`lowvm.runtime.params`), the ``CUfunction`` per device (loaded on first use, then a
dict lookup). A launch neither synchronises nor allocates, so it can be recorded inside
``torch.cuda.graph`` and replayed; load the kernel (``Kernel.load()`` or one launch)
before capturing, since loading a module is not a stream operation.

The CUDA context is PyTorch's (the device's primary context), so kernels run on torch's
current stream and read torch tensors directly.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Sequence
from typing import Any

import lowvm.runtime.driver as _drv
from lowvm.extras import stand_in
from lowvm.runtime.errors import CudaDriverError, LaunchError
from lowvm.runtime.params import (
    ParamSpec,
    ctypes_type_for,
    make_converter,
    normalize_params,
)

try:
    from cuda.bindings import driver as cu
except ModuleNotFoundError as _exc:  # a CPU-only install: nothing here can run
    cu = stand_in("cuda.bindings.driver", "running kernels on a GPU", _exc)

__all__ = ["Kernel", "BoundLaunch", "eager_stream", "DEFAULT_SHARED_LIMIT",
           "MAX_BLOCK_THREADS"]

DEFAULT_SHARED_LIMIT = 48 * 1024
"""Dynamic shared memory a kernel may use without raising its limit by attribute."""
MAX_BLOCK_THREADS = 1024
_MAX_GRID_X, _MAX_GRID_YZ = 2**31 - 1, 65535
_GRID_LIMITS = (_MAX_GRID_X, _MAX_GRID_YZ, _MAX_GRID_YZ)
_SUCCESS = cu.CUresult.CUDA_SUCCESS
_INVALID_CONTEXT = cu.CUresult.CUDA_ERROR_INVALID_CONTEXT
_INVALID_VALUE = cu.CUresult.CUDA_ERROR_INVALID_VALUE
_PARAM_SIZE = {"pointer": 8, "scalar": 4, "tensor_map": 128}
# torch's current-device and current-stream getters, fetched on the first launch (torch's
# CUDA state must be initialised first); a list so the hot path reads a local, not a dict.
_host_fns: list[Any] = [None, None]
# torch's "is the current stream capturing a graph" query (a C call), fetched on first use
_capturing_fn: list[Any] = [None]


def _new_param_block(types: Sequence[Any]) -> tuple[list[Any], Any, int]:
    """``(slots, the void* array pointing at them, its address)``: one ctypes slot per
    parameter (pointers as 64-bit integers), for ``cuLaunchKernel``'s ``kernelParams``."""
    slots = [t() if t is not ctypes.c_void_p else ctypes.c_uint64() for t in types]
    pointers = (ctypes.c_void_p * max(1, len(slots)))(*[ctypes.addressof(s) for s in slots])
    return slots, pointers, ctypes.addressof(pointers)


def eager_stream(device: int) -> int | None:
    """torch's current stream handle on ``device``, or None where a launch prepared once
    per stream (:class:`BoundLaunch`) must not run: while the stream is capturing a CUDA
    graph (work recorded there needs the capture's own buffers), or when ``device`` is
    not torch's current device (:meth:`Kernel.launch` refuses such tensors, naming them)."""
    capturing = _capturing_fn[0]
    if capturing is None:
        import torch

        capturing = _capturing_fn[0] = getattr(torch._C, "_cuda_isCurrentStreamCapturing",
                                               torch.cuda.is_current_stream_capturing)
    get_device = _host_fns[0]
    if get_device is None:
        _host_fns[:] = [_drv.device_getter(), _drv.raw_stream_getter()]
        get_device = _host_fns[0]
    if get_device() != device or capturing():
        return None
    return _host_fns[1](device)


@functools.cache
def _overlaps(device: int) -> bool:
    """Whether ``device`` runs programmatic dependent launches (compute capability 9+)."""
    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    handle = _drv.check(cu.cuDeviceGet(device), f"cuDeviceGet({device})")
    major = _drv.check(cu.cuDeviceGetAttribute(attr, handle), "cuDeviceGetAttribute")
    return int(major) >= 9


class Kernel:
    """One ``__global__`` function of a cubin, with its launch shape and parameters.

    ``cubin`` is the compiled image (see :func:`~lowvm.runtime.compiler.compile_cubin`),
    ``name`` the kernel's symbol (declare it ``extern "C"`` to avoid mangling),
    ``block_threads`` the 1-D block size, ``dynamic_shared_bytes`` the dynamic shared
    memory per block (above 48 KiB the function's limit is raised when it loads) and
    ``params`` one :class:`~lowvm.runtime.params.ParamSpec` (or ``(name, kind, dtype)``
    tuple) per kernel parameter, in order.

    Nothing touches the GPU until the first :meth:`launch` or :meth:`load`, so a Kernel
    can be built and its arguments checked (:meth:`check_args`) on a machine without one.
    """

    def __init__(
        self,
        cubin: bytes,
        name: str,
        block_threads: int,
        dynamic_shared_bytes: int = 0,
        params: Sequence[ParamSpec | tuple[str, str, Any]] = (),
    ) -> None:
        if not isinstance(cubin, (bytes, bytearray)) or not cubin:
            raise LaunchError(
                f"Kernel: cubin must be the non-empty bytes of a compiled image "
                f"(compile_cubin's result), got {type(cubin).__name__} of "
                f"{len(cubin) if hasattr(cubin, '__len__') else '?'} bytes"
            )
        if not isinstance(name, str) or not name:
            raise LaunchError(f"Kernel: name must be the kernel's symbol name, got {name!r}")
        if (
            type(block_threads) is not int
            or not 1 <= block_threads <= MAX_BLOCK_THREADS
        ):
            raise LaunchError(
                f"Kernel {name!r}: block_threads must be an int in [1, {MAX_BLOCK_THREADS}], "
                f"got {block_threads!r}"
            )
        if type(dynamic_shared_bytes) is not int or dynamic_shared_bytes < 0:
            raise LaunchError(
                f"Kernel {name!r}: dynamic_shared_bytes must be an int >= 0, "
                f"got {dynamic_shared_bytes!r}"
            )
        self._cubin = bytes(cubin)
        self._name = name
        self._block = block_threads
        self._smem = dynamic_shared_bytes
        self._params = normalize_params(params)
        self._nparams = len(self._params)
        self._converters = tuple(make_converter(name, p) for p in self._params)
        self._types = tuple(ctypes_type_for(p) for p in self._params)
        self._blocks = threading.local()  # per-thread prebuilt kernel-parameter blocks
        self._modules: dict[int, Any] = {}  # device index -> CUmodule
        self._functions: dict[int, Any] = {}  # device index -> CUfunction

    # -- description -------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def block_threads(self) -> int:
        return self._block

    @property
    def dynamic_shared_bytes(self) -> int:
        return self._smem

    @property
    def params(self) -> tuple[ParamSpec, ...]:
        return self._params

    @property
    def cubin(self) -> bytes:
        return self._cubin

    def __repr__(self) -> str:
        params = ", ".join(str(p) for p in self._params)
        return (
            f"Kernel({self._name!r}, block_threads={self._block}, "
            f"dynamic_shared_bytes={self._smem}, params=[{params}])"
        )

    # -- argument checks (no GPU needed) -----------------------------------------------

    def check_args(self, args: Sequence[Any], device: int | None = None) -> tuple[Any, ...]:
        """Check ``args`` against the parameters; return the values the launch passes.

        Pointer arguments become int addresses, scalars Python ints/floats. ``device`` is
        the CUDA device index tensors must live on (None: any CUDA device). Raises
        :class:`~lowvm.runtime.errors.LaunchError` naming the first bad argument.
        """
        if len(args) != self._nparams:
            raise LaunchError(
                f"Kernel {self._name!r}: expected {self._nparams} arguments "
                f"({', '.join(p.name for p in self._params) or 'none'}), got {len(args)}"
            )
        return tuple([conv(a, device) for conv, a in zip(self._converters, args)])

    @staticmethod
    def _check_grid(grid: Any) -> tuple[int, int, int]:
        if type(grid) is tuple and len(grid) == 3:  # the fast path: a tuple of 3 ints
            gx, gy, gz = grid
            if (
                type(gx) is int
                and type(gy) is int
                and type(gz) is int
                and 0 <= gx <= _MAX_GRID_X
                and 0 <= gy <= _MAX_GRID_YZ
                and 0 <= gz <= _MAX_GRID_YZ
            ):
                return grid
        if isinstance(grid, Sequence) and not isinstance(grid, (str, bytes)) and len(grid) == 3:
            dims = tuple(grid)
            if all(type(g) is int and 0 <= g <= lim for g, lim in zip(dims, _GRID_LIMITS)):
                return dims  # type: ignore[return-value]
        raise LaunchError(
            f"Kernel.launch: grid must be a tuple of 3 ints (x, y, z) with 0 <= x <= "
            f"{_GRID_LIMITS[0]} and 0 <= y, z <= {_GRID_LIMITS[1]} (a 0 launches nothing), "
            f"got {grid!r}"
        )

    # -- loading ---------------------------------------------------------------------------

    def load(self, device: int | None = None) -> None:
        """Load the module on ``device`` (default: torch's current device) if not yet loaded."""
        dev = _drv.current_device() if device is None else device
        if dev not in self._functions:
            self._load(dev)

    def _load(self, device: int) -> Any:
        _drv.ensure_context(device)
        module = _drv.check(cu.cuModuleLoadData(self._cubin), f"cuModuleLoadData({self._name!r})")
        try:
            fn = _drv.check(
                cu.cuModuleGetFunction(module, self._name.encode()),
                f"cuModuleGetFunction(module, {self._name!r}) (is the kernel extern \"C\"?)",
            )
            self._configure(fn, device)
        except BaseException:
            cu.cuModuleUnload(module)
            raise
        self._modules[device] = module
        self._functions[device] = fn
        return fn

    def _configure(self, fn: Any, device: int) -> None:
        attr = cu.CUfunction_attribute
        max_threads = _drv.check(
            cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn),
            "cuFuncGetAttribute(MAX_THREADS_PER_BLOCK)",
        )
        if self._block > max_threads:
            raise LaunchError(
                f"Kernel {self._name!r}: block_threads={self._block} exceeds the "
                f"{max_threads} threads per block the compiled kernel allows on cuda:{device} "
                f"(__launch_bounds__ or registers); accepted: at most {max_threads}"
            )
        # the opt-in counts static shared memory too (e.g. vm.arrive's ticket word)
        static = _drv.check(cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn),
                            "cuFuncGetAttribute(SHARED_SIZE_BYTES)")
        if self._smem + static > DEFAULT_SHARED_LIMIT:
            _drv.check(
                cu.cuFuncSetAttribute(
                    fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self._smem
                ),
                f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, {self._smem}) for "
                f"{self._name!r} on cuda:{device} (more than the device's opt-in limit?)",
            )
        self._check_param_layout(fn)

    def _check_param_layout(self, fn: Any) -> None:
        """Compare the declared parameters with the kernel image's, where the driver says.

        ``cuFuncGetParamInfo`` (CUDA 12.4+) gives each parameter's size and fails with
        CUDA_ERROR_INVALID_VALUE one past the last; any other failure means the query is
        unsupported and the check is skipped.
        """
        get_info = getattr(cu, "cuFuncGetParamInfo", None)
        if get_info is None:
            return
        sizes: list[int] = []
        for index in range(self._nparams + 1):
            result = get_info(fn, index)
            if result[0] == _INVALID_VALUE:
                break
            if result[0] != _SUCCESS:
                return
            sizes.append(int(result[2]))
        want = [_PARAM_SIZE[p.kind] for p in self._params]
        if sizes != want:
            more = "more than " if len(sizes) > self._nparams else ""
            raise LaunchError(
                f"Kernel {self._name!r}: params declare {len(want)} parameters of sizes "
                f"{want} bytes ({', '.join(str(p) for p in self._params) or 'none'}), but "
                f"the compiled kernel takes {more}{len(sizes[: self._nparams])} of sizes "
                f"{sizes[: self._nparams]}{'...' if more else ''}"
            )

    # -- launching -------------------------------------------------------------------------

    def launch(self, grid: tuple[int, int, int], args: Sequence[Any], stream: Any = None,
               overlap: bool = False) -> None:
        """Launch on ``grid`` blocks with ``args``, on ``stream`` or torch's current stream.

        Checks the grid and every argument first (LaunchError names the bad one); a grid
        with a 0 launches nothing. Asynchronous, allocation-free and graph-capturable.
        ``overlap`` (sm_90 and newer; ignored before): a programmatic dependent launch,
        which may start while the previous kernel on the stream is still running. Only
        for kernels that wait for it themselves (``vm.wait_prior_grid``) before reading
        its results or writing anything it reads.
        """
        if type(grid) is tuple and len(grid) == 3:  # inlined fast path of _check_grid
            gx, gy, gz = grid
            if not (
                type(gx) is int
                and type(gy) is int
                and type(gz) is int
                and 0 <= gx <= _MAX_GRID_X
                and 0 <= gy <= _MAX_GRID_YZ
                and 0 <= gz <= _MAX_GRID_YZ
            ):
                gx, gy, gz = self._check_grid(grid)
        else:
            gx, gy, gz = self._check_grid(grid)
        get_device = _host_fns[0]
        if get_device is None:
            _host_fns[:] = [_drv.device_getter(), _drv.raw_stream_getter()]
            get_device = _host_fns[0]
        device = get_device()
        if len(args) != self._nparams:
            self.check_args(args, device)  # raises, naming the parameters
        values = tuple([conv(a, device) for conv, a in zip(self._converters, args)])
        if not (gx and gy and gz):
            return
        fn = self._functions.get(device)
        if fn is None:
            fn = self._load(device)
        if stream is None:
            handle = _host_fns[1](device)
        else:
            handle = _drv.stream_handle(stream)
        params = self._param_block(values)
        self._start_checked(fn, (gx, gy, gz), handle, params, overlap and _overlaps(device),
                            device)

    __call__ = launch

    def _start_checked(self, fn: Any, grid: tuple[int, int, int], stream: Any, params: int,
                       overlap: bool, device: int, config: Any = None) -> None:
        """:meth:`_start`, again after binding the context on a thread torch never bound
        it on; any other failure raises CudaDriverError naming the launch."""
        err = self._start(fn, grid, stream, params, overlap, config)
        if err:
            if err == _INVALID_CONTEXT:
                _drv.ensure_context(device)
                err = self._start(fn, grid, stream, params, overlap, config)
            if err:
                raise CudaDriverError(
                    f"cuLaunchKernel{'Ex' if overlap else ''}({self._name!r}, "
                    f"grid=({grid[0]}, {grid[1]}, {grid[2]}), "
                    f"block={self._block}, dynamic_shared_bytes={self._smem}) failed with "
                    f"{_drv.error_name(err)}"
                )

    def _start(self, fn: Any, grid: tuple[int, int, int], stream: Any, params: int,
               overlap: bool, config: Any = None) -> Any:
        """One launch attempt: ``cuLaunchKernel``, or ``cuLaunchKernelEx`` with
        programmatic stream serialization allowed when ``overlap`` (``config``: its
        :meth:`_ex_config`, made now if None); the driver's code."""
        if not overlap:
            (err,) = cu.cuLaunchKernel(fn, *grid, self._block, 1, 1, self._smem, stream,
                                       params, 0)
            return err
        if config is None:
            config = self._ex_config(grid, stream)
        (err,) = cu.cuLaunchKernelEx(config, fn, params, 0)
        return err

    def _ex_config(self, grid: tuple[int, int, int], stream: Any) -> Any:
        """``cuLaunchKernelEx``'s configuration of a launch on ``grid`` and ``stream`` that
        may overlap the previous kernel (programmatic stream serialization)."""
        attr = cu.CUlaunchAttribute()
        attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value.programmaticStreamSerializationAllowed = 1
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = self._block, 1, 1
        config.sharedMemBytes = self._smem
        config.hStream = stream if isinstance(stream, cu.CUstream) else cu.CUstream(stream)
        config.attrs = [attr]
        config.numAttrs = 1
        return config

    def _param_block(self, values: tuple[Any, ...]) -> int:
        """The address of a ``void**`` holding ``values``, in this thread's own block.

        Letting cuda-python pack a (values, types) tuple allocates and converts on every
        launch; a block built once per thread only has its slots overwritten. The driver
        copies the parameters during ``cuLaunchKernel``, so reuse (and graph capture) is
        safe; one block per thread keeps concurrent launches apart.
        """
        block = getattr(self._blocks, "block", None)
        if block is None:
            block = self._blocks.block = _new_param_block(self._types)
        slots = block[0]
        for slot, value in zip(slots, values):
            slot.value = value
        return block[2]

    def bind(self, grid: tuple[int, int, int], args: Sequence[Any], free: Sequence[int],
             device: int, stream: int) -> BoundLaunch:
        """This kernel's launch on ``grid`` with ``args`` on ``device`` and ``stream``,
        checked and packed now; each call then only fills the pointer parameters at the
        indices ``free`` (see :class:`BoundLaunch`). Loads the module if needed."""
        return BoundLaunch(self, grid, args, free, device, stream)

    def unload(self) -> None:
        """Unload the module from every device it was loaded on (the next launch reloads)."""
        modules, self._modules, self._functions = self._modules, {}, {}
        for module in modules.values():
            cu.cuModuleUnload(module)


class BoundLaunch:
    """One kernel launch whose grid, device, stream and arguments are checked and packed
    once, but for a few pointers that each call fills in.

    A decode step repeats the same launches with new activation and output buffers; the
    checks and conversions :meth:`Kernel.launch` makes on every call (grid, each
    argument, device, stream, function handle) then give the same answer each time. A
    bound launch keeps their result: a call checks only the free pointers (ints, 16-byte
    aligned), writes them into this thread's parameter block and calls ``cuLaunchKernel``,
    whose status is still checked (a failure raises
    :class:`~lowvm.runtime.errors.CudaDriverError`). The caller owns what the pointers
    point to: buffers of the dtype, size and device the kernel was bound for. The fixed
    tensor arguments are kept referenced, so their memory outlives the binding.
    """

    def __init__(self, kernel: Kernel, grid: tuple[int, int, int], args: Sequence[Any],
                 free: Sequence[int], device: int, stream: int) -> None:
        grid = kernel._check_grid(grid)
        values = list(kernel.check_args(args, device))
        free = tuple(free)
        for index in free:
            if (type(index) is not int or not 0 <= index < kernel._nparams
                    or kernel.params[index].kind != "pointer"):
                raise LaunchError(
                    f"Kernel {kernel.name!r}: free must index pointer parameters in "
                    f"[0, {kernel._nparams}), got {index!r} (parameters: "
                    f"{', '.join(str(p) for p in kernel.params)})")
        if type(stream) is not int or stream < 0:
            raise LaunchError(f"BoundLaunch: stream must be an int handle >= 0, got {stream!r}")
        self.kernel, self.grid, self.device, self.stream = kernel, grid, device, stream
        self._cu_stream = cu.CUstream(stream)  # made once: the bindings wrap an int per call
        self._values, self._free, self._types = values, free, kernel._types
        # the fixed tensors stay alive as long as the binding; the free ones (a sample x,
        # y) are the caller's and must not be held (a prefill's activations are large)
        self._keep = tuple(a for i, a in enumerate(args) if i not in free)
        self._empty = not (grid[0] and grid[1] and grid[2])
        self._fn = None if self._empty else (kernel._functions.get(device)
                                             or kernel._load(device))
        self._local = threading.local()  # per-thread parameter blocks
        self._config: Any = None  # cuLaunchKernelEx's config, made on the first overlap

    def __call__(self, *pointers: int, overlap: bool = False) -> None:
        """Launch with ``pointers`` in the free parameters (in ``free``'s order).
        ``overlap``: as :meth:`Kernel.launch`'s (sm_90+; ignored before)."""
        block = getattr(self._local, "block", None)
        if block is None:
            block = self._local.block = self._new_block()
        slots = block[0]
        if len(pointers) != len(self._free):
            raise LaunchError(f"Kernel {self.kernel.name!r}: a bound launch takes "
                              f"{len(self._free)} pointers, got {len(pointers)}")
        for index, value in zip(self._free, pointers):
            if type(value) is not int or value & 15 or not 0 <= value < 1 << 64:
                raise LaunchError(
                    f"Kernel {self.kernel.name!r}: argument "
                    f"{self.kernel.params[index].name!r} of a bound launch must be an int "
                    f"device address that is a multiple of 16; got {value!r}")
            slots[index].value = value
        if self._empty:
            return
        overlap = overlap and _overlaps(self.device)
        if overlap and self._config is None:
            self._config = self.kernel._ex_config(self.grid, self._cu_stream)
        self.kernel._start_checked(self._fn, self.grid, self._cu_stream, block[2], overlap,
                                   self.device, self._config)

    def _new_block(self) -> tuple[list[Any], Any, int]:
        """This thread's ``void**`` parameter block, holding the fixed values."""
        block = _new_param_block(self._types)
        for slot, value in zip(block[0], self._values):
            slot.value = value
        return block
