"""The eager host path of QuantLinear: prepared launches (EagerLaunches, GemmLaunch,
BoundLaunch) against the general path, run on the CPU with the CUDA driver replaced by a
recorder (``fake_gpu``), plus GPU tests against the custom op and a float64 reference.

``python -m tests.nn.layer.test_host_path`` prints the host time of each stage of a 4096 x 4096
int4 g128 call in the same CPU stand-in (the driver's own time not included).
"""

from __future__ import annotations

import copy
import ctypes
import pickle
import time
import types
import warnings

import pytest
import torch

import lowvm
from lowvm.driver import CompiledProgram, generate_cuda
from lowvm.errors import LowvmError
from lowvm.kernels import dispatch
from lowvm.kernels.schedule_source import schedule_source, set_schedule_source
from lowvm.nn.errors import ActivationError
from lowvm.nn.layer import backend
from lowvm.nn.layer import quant_linear as quant_linear_module
from lowvm.nn.layer.quant_linear import QuantLinear
from lowvm.runtime import driver as runtime_driver
from lowvm.runtime import launch
from lowvm.runtime.errors import CudaDriverError, LaunchError
from tests.helpers.activation_errors import assert_activation_errors

# the bindings lowvm's runtime loaded (a stand-in object where the cuda extra is missing,
# which the test extra does not bring)
real_cu = runtime_driver.cu if isinstance(runtime_driver.cu, types.ModuleType) else None

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.layer.backend.LowvmFallbackWarning")
needs_bindings = pytest.mark.skipif(real_cu is None, reason="needs cuda-bindings")

STREAM = 0x5000  # the stand-in's current stream handle
_SUCCESS = None if real_cu is None else (real_cu.CUresult.CUDA_SUCCESS,)
_FAKE_PROGRAMS: dict = {}  # compiled stand-ins, shared by these tests only


class Recorder:
    """Stands in for cuda.bindings.driver: every launch is decoded from its parameter
    block (what the kernel would read) and recorded; the rest is the real module."""

    def __init__(self) -> None:
        self.launches: list[dict] = []
        self.fail_with = None  # a CUresult the next launches return
        self.decode = True  # False: a launch does nothing (for timing the host path)

    def __getattr__(self, name: str):
        return getattr(real_cu, name)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):  # noqa: N802
        return self._record(fn, (gx, gy, gz), stream, params, False)

    def cuLaunchKernelEx(self, config, fn, params, extra):  # noqa: N802
        grid = (config.gridDimX, config.gridDimY, config.gridDimZ)
        return self._record(fn, grid, int(config.hStream), params, True)

    def cuStreamGetCaptureInfo(self, stream):  # noqa: N802
        none = real_cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
        return (real_cu.CUresult.CUDA_SUCCESS, none, 0)

    def _record(self, fn, grid, stream, params, overlap):
        if not self.decode:
            return _SUCCESS
        kernel = fn.kernel
        args = {}
        for i, spec in enumerate(kernel.params):
            slot = ctypes.c_void_p.from_address(params + 8 * i).value
            if spec.kind == "pointer":
                args[spec.name] = ctypes.c_uint64.from_address(slot).value
            elif spec.dtype == lowvm.int32:
                args[spec.name] = ctypes.c_int.from_address(slot).value
            else:
                args[spec.name] = ctypes.c_float.from_address(slot).value
        self.launches.append({"kernel": kernel.name, "grid": tuple(grid), "stream": int(stream),
                              "args": args, "overlap": overlap})
        return (self.fail_with or real_cu.CUresult.CUDA_SUCCESS,)


class FakeFunction:
    """A loaded CUfunction's stand-in: knows its kernel, so launches can be decoded."""

    def __init__(self, kernel) -> None:
        self.kernel = kernel


def _fake_compile(program, **constants):
    """lowvm.compile without a compiler: the generated source and a placeholder image,
    "loaded" on device -1 (what a CPU tensor's get_device() says)."""
    program = program.build(**constants)
    compiled = CompiledProgram(program, generate_cuda(program), "sm_90", b"\0")
    compiled.kernel._functions[-1] = FakeFunction(compiled.kernel)
    return compiled


def install_fake_gpu(monkeypatch, sm90: bool = True) -> Recorder:
    """CPU tensors take the CUDA paths of QuantLinear and the library, the driver's
    launches recorded instead of run; every cache the stand-ins fill is a fresh one."""
    recorder = Recorder()
    monkeypatch.setattr(launch, "cu", recorder)
    monkeypatch.setattr(runtime_driver, "cu", recorder)
    monkeypatch.setattr(launch, "_host_fns", [lambda: -1, lambda device: STREAM])
    monkeypatch.setattr(launch, "_capturing_fn", [lambda: False])
    monkeypatch.setattr(runtime_driver, "raw_stream_getter", lambda: (lambda device: STREAM))
    monkeypatch.setattr(dispatch, "_SM90", {torch.device("cpu"): sm90})
    monkeypatch.setattr(dispatch, "_device_arch", lambda device: "sm_90" if sm90 else "sm_80")
    monkeypatch.setattr(dispatch, "compile_program", _fake_compile)
    monkeypatch.setattr(dispatch, "_COMPILED", _FAKE_PROGRAMS)
    monkeypatch.setattr(dispatch, "_PLANS", dispatch._PlanCache())
    monkeypatch.setattr(dispatch, "_DUMMIES", {})
    monkeypatch.setattr(quant_linear_module, "_on_kernel_device", lambda x: not x.is_meta)
    from lowvm.runtime import workspaces

    monkeypatch.setattr(workspaces, "_SPLIT", {})
    monkeypatch.setattr(quant_linear_module, "backend_quant_linear",
                        lambda x2d, layer: backend.cuda_quant_linear(x2d, layer))
    monkeypatch.setattr(launch, "_overlaps", lambda device: True)
    set_schedule_source(None)  # the tuning cache asks torch.cuda for the GPU's name
    return recorder


@pytest.fixture
def fake_gpu(monkeypatch):
    if real_cu is None:
        pytest.skip("needs cuda-bindings (the launch code's types)")
    before = schedule_source()
    recorder = install_fake_gpu(monkeypatch)
    yield recorder
    set_schedule_source(before)


def _layer(wtype="int4", bias=True, k=256, n=128, group=64, dtype=torch.float16, seed=0):
    torch.manual_seed(seed)
    dense = torch.nn.Linear(k, n, bias=bias, dtype=torch.float16)
    return QuantLinear.from_linear(dense, wtype, group_size=group).to(dtype)


def _general(layer, x):
    """The general CUDA path (what the custom op runs on a CUDA device)."""
    return backend.cuda_quant_linear(x, layer.packed())


# -- the routing decision ---------------------------------------------------------------


@pytest.mark.parametrize("wtype,runs", [("float7_e5m1", torch.bfloat16),
                                        ("float8_e6m1", torch.bfloat16),
                                        ("int4", torch.float16), ("uint8", torch.float16),
                                        ("float8_e4m3", torch.float16),
                                        ("float8_e5m2", torch.float16)])
def test_kernel_dtype_runs_float16_of_wide_types_in_bfloat16(wtype, runs):
    wt = lowvm.dtype(wtype)
    # independently: the type's largest value exceeds float16's, or its smallest
    # positive one is below float16's smallest subnormal
    import numpy as np

    values = np.abs(lowvm.dtypes.decode(np.arange(1 << wt.nbits, dtype=np.uint64), wt))
    values = values[np.isfinite(values) & (values > 0)]
    beyond = values.max() > 65504 or values.min() < 2.0 ** -24
    assert beyond == (runs is torch.bfloat16)
    assert backend.kernel_dtype(torch.float16, wt) is runs
    assert backend.kernel_dtype(torch.bfloat16, wt) is torch.bfloat16


@pytest.mark.parametrize("wtype", ["float7_e5m1", "float8_e6m1"])
def test_general_path_runs_float16_wide_types_through_the_bfloat16_kernel(monkeypatch, wtype):
    """No reference-path fallback (and no warning): x goes to the kernel in bfloat16,
    y comes back in float16 with the float16 bias added after."""
    seen = []

    def kernel(x, weight, schedule=None):  # the library GEMM, in float64 then rounded
        seen.append((x.dtype, weight.scales.dtype))
        from lowvm.nn.layer.packed import PackedLinear, dequantize

        dense = dequantize(PackedLinear(weight.packed, weight.scales.float(), None, None,
                                        weight.wtype, weight.group, weight.k), torch.float64)
        return (x.double() @ dense.t()).to(x.dtype)

    monkeypatch.setattr(backend, "library_quant_linear", kernel)
    layer = _layer(wtype)
    x = torch.randn(3, 256, dtype=torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = _general(layer, x)
    assert seen == [(torch.bfloat16, torch.bfloat16)]
    ref = x.double() @ layer.dequantize(torch.float64).t() + layer.bias.double()
    assert y.dtype == torch.float16 and y.shape == (3, 128)
    assert float((y.double() - ref).norm() / ref.norm()) < 2e-2


# -- the eager path against the general one --------------------------------------------


def _strip(launches, drop=("y",)):
    return [{**r, "args": {k: v for k, v in r["args"].items() if k not in drop}}
            for r in launches]


@pytest.mark.parametrize("sm90", [True, False])
@pytest.mark.parametrize("m", [1, 16, 256])
@pytest.mark.parametrize("wtype,dtype", [("int4", torch.float16), ("uint4", torch.bfloat16)])
def test_eager_call_launches_what_the_general_path_launches(monkeypatch, fake_gpu, sm90, m,
                                                            wtype, dtype):
    monkeypatch.setattr(dispatch, "_SM90", {torch.device("cpu"): sm90})
    layer = _layer(wtype, dtype=dtype)
    x = torch.randn(m, 256, dtype=dtype)
    _general(layer, x)
    general = fake_gpu.launches[:]
    fake_gpu.launches.clear()
    for _ in range(2):  # the call that prepares, and one that reuses
        y = layer(x)
        assert y.shape == (m, 128) and y.dtype == dtype
        assert _strip(fake_gpu.launches) == _strip(general)
        assert fake_gpu.launches[0]["args"]["x"] == x.data_ptr()
        assert fake_gpu.launches[0]["args"]["y"] == y.data_ptr()  # bias added in place
        if len(general) == 2:  # the unfused split-K epilogue writes the same y
            assert fake_gpu.launches[1]["args"]["y"] == y.data_ptr()
        fake_gpu.launches.clear()


def test_repeated_calls_skip_the_custom_op_and_the_planner(monkeypatch, fake_gpu):
    layer = _layer()
    x = torch.randn(2, 3, 256, dtype=torch.float16)  # leading dims are flattened
    layer(x)
    fake_gpu.launches.clear()

    def refuse(*args, **kwargs):
        raise AssertionError("the eager path went the long way")

    monkeypatch.setattr(dispatch, "_run", refuse)
    monkeypatch.setattr(dispatch, "check_activation", refuse)
    monkeypatch.setattr(quant_linear_module, "backend_quant_linear", refuse)
    monkeypatch.setattr(QuantLinear, "_op_forward", refuse)
    y = layer(x)
    assert y.shape == (2, 3, 128) and len(fake_gpu.launches) == 1


def test_launches_follow_the_layers_tensors(fake_gpu):
    """In-place changes of cast scales, replaced buffers and cleared plans all reach the
    next launch; in-place changes of what the kernel reads directly need nothing."""
    layer = _layer(dtype=torch.bfloat16)
    x = torch.randn(1, 256, dtype=torch.bfloat16)

    kept = []  # every cast stays alive, so a new one cannot reuse an old one's address

    def scales_launched():
        fake_gpu.launches.clear()
        layer(x)
        ptr = fake_gpu.launches[0]["args"]["scales"]
        cast = backend._scales_as(layer.packed(), torch.bfloat16)[0]
        kept.append(cast)
        assert cast.data_ptr() == ptr and torch.equal(cast, layer.scales.bfloat16())
        return fake_gpu.launches[0]

    first = scales_launched()
    layer.scales.mul_(2)  # as load_state_dict copies: the bfloat16 copy must follow
    assert scales_launched()["args"]["scales"] != first["args"]["scales"]
    layer.qweight = layer.qweight.clone()  # a replaced buffer
    assert scales_launched()["args"]["w"] == layer.qweight.data_ptr()
    with torch.no_grad():
        layer.qweight.zero_()  # read through its address: same launch
    assert scales_launched()["args"]["w"] == layer.qweight.data_ptr()
    made = []
    original = dispatch.GemmLaunch.__init__

    def counting(self, *args, **kwargs):
        made.append(1)
        original(self, *args, **kwargs)

    import unittest.mock

    with unittest.mock.patch.object(dispatch.GemmLaunch, "__init__", counting):
        scales_launched()
        assert made == []
        dispatch._PLANS.clear()  # e.g. a new tuning cache
        scales_launched()
        assert made == [1]


def test_bias_cast_follows_in_place_changes(fake_gpu):
    """A float16 bias under bfloat16 activations is cast once, and again after an
    in-place change."""
    layer = _layer()
    x = torch.randn(1, 256, dtype=torch.bfloat16)
    layer(x)
    launches = layer.__dict__["_eager_launches"]
    first = launches._biases[torch.bfloat16]
    assert torch.equal(first, layer.bias.bfloat16())
    layer(x)
    assert launches._biases[torch.bfloat16] is first
    with torch.no_grad():
        layer.bias.add_(1)
    layer(x)
    assert torch.equal(launches._biases[torch.bfloat16], layer.bias.bfloat16())


def test_float16_wide_type_launches_the_bfloat16_kernel(fake_gpu):
    layer = _layer("float8_e6m1")
    x = torch.randn(4, 256, dtype=torch.float16)
    y = layer(x)
    assert y.dtype == torch.float16
    (rec,) = fake_gpu.launches
    assert rec["kernel"].startswith("lowvm_quant_gemm_bf16_")
    assert rec["args"]["x"] != x.data_ptr()  # a bfloat16 copy


def test_capture_another_device_and_misaligned_x_take_the_general_path(monkeypatch, fake_gpu):
    layer = _layer(bias=False)
    x = torch.randn(1, 256, dtype=torch.float16)
    bound = []
    original = launch.BoundLaunch.__call__

    def counting(self, *args, **kwargs):
        bound.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(launch.BoundLaunch, "__call__", counting)
    layer(x)
    assert len(bound) == 1 and len(fake_gpu.launches) == 1
    monkeypatch.setattr(launch, "_capturing_fn", [lambda: True])
    layer(x)
    assert len(bound) == 1 and len(fake_gpu.launches) == 2  # launched, not prepared
    monkeypatch.setattr(launch, "_capturing_fn", [lambda: False])
    monkeypatch.setattr(launch, "_host_fns", [lambda: 3, lambda device: STREAM])
    with pytest.raises(LaunchError, match="argument 'x'"):
        layer(x)  # the general path's own error (x is not on the current device)
    monkeypatch.setattr(launch, "_host_fns", [lambda: -1, lambda device: STREAM])
    odd = torch.randn(257, dtype=torch.float16)[1:].view(1, 256)
    with pytest.raises(LaunchError, match="aligned to 16"):
        layer(odd)
    assert len(bound) == 1


def test_bad_activations_raise_the_same_errors_on_the_eager_path(fake_gpu):
    layer = _layer()
    assert_activation_errors(layer)
    with pytest.raises(ActivationError, match="in_features=256"):
        layer(torch.tensor(1.0, dtype=torch.float16))
    assert fake_gpu.launches == []


def test_traced_and_differentiated_calls_go_through_the_custom_op(monkeypatch, fake_gpu):
    from torch.utils._python_dispatch import TorchDispatchMode

    layer = _layer()
    ops = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.randn(2, 256, dtype=torch.float16)
    with Seen():
        layer(x)
    assert "lowvm.quant_linear.default" in ops
    taken = []
    monkeypatch.setattr(QuantLinear, "_op_forward",
                        lambda self, x, checked=False: taken.append(1) or x)
    layer(x.clone().requires_grad_())
    with torch.no_grad():
        layer(x.clone().requires_grad_())  # no graph to record: eager
    torch.vmap(layer)(x.unsqueeze(1))
    assert taken == [1, 1]


def test_prepared_launches_hold_no_activation_or_output(fake_gpu):
    """A prefill's x and y are large: the launches kept per call shape must not keep the
    tensors they were prepared with."""
    import gc
    import weakref

    layer = _layer()
    x = torch.randn(300, 256, dtype=torch.float16)
    y = layer(x)
    refs = [weakref.ref(x), weakref.ref(y)]
    del x, y
    gc.collect()
    assert [r() for r in refs] == [None, None]
    assert layer.__dict__["_eager_launches"]._launches  # still prepared


def test_gemm_launch_refuses_capture_and_other_calls(monkeypatch, fake_gpu):
    from lowvm.kernels.library import QuantWeight, weight_bk

    layer = _layer(bias=False)
    weight = QuantWeight(layer.qweight, layer.scales, layer.wtype, 64, 128, 256,
                         weight_bk(64, 256))
    x = torch.randn(4, 256, dtype=torch.float16)
    gemm = dispatch.prepare_quant_linear(x, weight)
    assert gemm(x, STREAM).shape == (4, 128)
    for other, stream in ((x[:2], STREAM), (x.bfloat16(), STREAM), (x, STREAM + 1)):
        with pytest.raises(LowvmError, match="GemmLaunch: made for contiguous"):
            gemm(other, stream)
    monkeypatch.setattr(launch, "_capturing_fn", [lambda: True])
    with pytest.raises(LowvmError, match="capturing a CUDA graph"):
        dispatch.prepare_quant_linear(x, weight)


def test_copies_of_a_layer_start_without_launches(fake_gpu):
    layer = _layer(bias=False)
    x = torch.randn(1, 256, dtype=torch.float16)
    layer(x)
    assert layer.__dict__["_eager_launches"]._launches
    for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert not other.__dict__["_eager_launches"]._launches
        fake_gpu.launches.clear()
        other(x)
        assert fake_gpu.launches[0]["args"]["w"] == other.qweight.data_ptr()


# -- BoundLaunch -------------------------------------------------------------------------


def _vector_kernel():
    return launch.Kernel(b"\0", "k", 128, 0, [("n", "scalar", "int32"),
                                             ("x", "pointer", "float16"),
                                             ("y", "pointer", "float16")])


def _bound(recorder, grid=(2, 1, 1)):
    kernel = _vector_kernel()
    kernel._functions[-1] = FakeFunction(kernel)
    x, y = torch.zeros(8, dtype=torch.float16), torch.zeros(8, dtype=torch.float16)
    return kernel.bind(grid, (8, x, y), (1, 2), -1, STREAM)


@needs_bindings
def test_bound_launch_fills_its_free_pointers(fake_gpu):
    bound = _bound(fake_gpu)
    bound(64, 128)
    bound(256, 512, overlap=True)
    assert [(r["args"], r["overlap"], r["stream"]) for r in fake_gpu.launches] == [
        ({"n": 8, "x": 64, "y": 128}, False, STREAM),
        ({"n": 8, "x": 256, "y": 512}, True, STREAM)]
    _bound(fake_gpu, (0, 1, 1))(64, 128)  # a zero grid launches nothing
    assert len(fake_gpu.launches) == 2


@needs_bindings
def test_bound_launch_refuses_bad_pointers_and_indices(fake_gpu):
    bound = _bound(fake_gpu)
    with pytest.raises(LaunchError, match=r"argument 'y'.*multiple of 16; got 72"):
        bound(64, 72)
    with pytest.raises(LaunchError, match="takes 2 pointers, got 1"):
        bound(64)
    with pytest.raises(LaunchError, match=r"argument 'x'.*got 1.5"):
        bound(1.5, 64)
    kernel = _vector_kernel()
    x = torch.zeros(8, dtype=torch.float16)
    with pytest.raises(LaunchError, match="free must index pointer parameters"):
        kernel.bind((1, 1, 1), (8, x, x), (0,), -1, STREAM)
    with pytest.raises(LaunchError, match="argument 'x'"):
        kernel.bind((1, 1, 1), (8, torch.zeros(8), x), (1,), -1, STREAM)
    with pytest.raises(LaunchError, match="grid"):
        kernel.bind((1, 1), (8, x, x), (1,), -1, STREAM)
    assert fake_gpu.launches == []


@needs_bindings
def test_bound_launch_raises_the_drivers_error(fake_gpu):
    bound = _bound(fake_gpu)
    fake_gpu.fail_with = real_cu.CUresult.CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    with pytest.raises(CudaDriverError, match=r"cuLaunchKernel\('k'.*OUT_OF_RESOURCES"):
        bound(64, 128)
    assert isinstance(CudaDriverError("x"), LowvmError)


# -- on a GPU ----------------------------------------------------------------------------


def _poison_allocator(shape, dtype):
    """Leave NaNs in the block the next allocation of this size gets."""
    torch.empty(shape, dtype=dtype, device="cuda").fill_(float("nan"))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 16, 256])
@pytest.mark.parametrize("act_order", [False, True])
def test_gpu_eager_path_equals_the_custom_op(dtype, m, act_order):
    torch.manual_seed(m)
    dense = torch.nn.Linear(512, 256, bias=True, dtype=torch.float16)
    layer = QuantLinear.from_linear(dense, "uint4", group_size=128).to("cuda", dtype)
    if act_order:
        perm = torch.randperm(512, device="cuda")
        codes = layer.codes()
        layer_p = QuantLinear(512, 256, "uint4", 128, bias=True, act_order=True,
                              device="cuda", bias_dtype=dtype)
        layer_p.set_codes(codes, layer.scales, layer.zeros, perm)
        layer_p.bias.copy_(layer.bias)
        layer = layer_p
    x = torch.randn(2, m, 512, dtype=dtype, device="cuda")
    for _ in range(3):
        _poison_allocator((2 * m, 256), dtype)
        y = layer(x)
        assert torch.isfinite(y).all()
        assert torch.equal(y, layer._op_forward(x))
    ref = (x.double() @ layer.dequantize(torch.float64).t() + layer.bias.double())
    assert float((y.double() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("wtype", ["float7_e5m1", "float8_e6m1"])
@pytest.mark.parametrize("m", [1, 33])
def test_gpu_float16_activations_of_wide_types_match_float64(wtype, m):
    torch.manual_seed(1)
    dense = torch.nn.Linear(512, 256, bias=True, dtype=torch.float16)
    layer = QuantLinear.from_linear(dense, wtype, group_size=64).cuda()
    x = torch.randn(m, 512, dtype=torch.float16, device="cuda")
    ref = x.double() @ layer.dequantize(torch.float64).t() + layer.bias.double()
    with warnings.catch_warnings():
        warnings.simplefilter("error", backend.LowvmFallbackWarning)
        for y in (layer(x), layer._op_forward(x)):
            assert y.dtype == torch.float16
            # x, scales and y pass through bfloat16 (8-bit significand)
            assert float((y.double() - ref).norm() / ref.norm()) < 1e-2


@pytest.mark.gpu
def test_gpu_graph_capture_after_eager_calls():
    torch.manual_seed(2)
    layer = QuantLinear.from_linear(torch.nn.Linear(4096, 4096, dtype=torch.float16),
                                    "int4", group_size=128).cuda()
    x = torch.randn(1, 4096, dtype=torch.float16, device="cuda")
    eager = layer(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(x)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    # split-K parts are added in whatever order the blocks finish: equal up to the
    # rounding of that order (an ulp of float16), not bit for bit
    again = layer(x)
    torch.testing.assert_close(out, again, rtol=2e-3, atol=2e-3)
    assert not torch.allclose(out, eager, rtol=2e-3, atol=2e-3)


# -- host time of each stage, in the CPU stand-in ------------------------------------


def _stages() -> list[tuple[str, float]]:
    """Host microseconds per call of each stage of a 4096 x 4096 int4 g128 call at
    M = 1 (the fastest of 5 runs of 2000 calls: the least disturbed by other work), in
    the CPU stand-in."""
    layer = _layer("int4", bias=False, k=4096, n=4096, group=128)
    x = torch.randn(1, 4096, dtype=torch.float16)
    packed = layer.packed()
    launches = backend.EagerLaunches()

    def timed(fn) -> float:
        for _ in range(50):
            fn()
        runs = []
        for _ in range(5):
            start = time.perf_counter_ns()
            for _ in range(2000):
                fn()
            runs.append((time.perf_counter_ns() - start) / 2000 / 1e3)
        return min(runs)

    with torch.no_grad():
        launches(x, *packed[:6])
        gemm = next(iter(launches._launches.values()))
        x256 = torch.randn(256, 4096, dtype=torch.float16)
        return [
            ("QuantLinear.__call__ (eager path)", timed(lambda: layer(x))),
            ("QuantLinear.__call__ (eager path), M = 256", timed(lambda: layer(x256))),
            ("QuantLinear._op_forward (the custom op's forward)",
             timed(lambda: layer._op_forward(x))),
            ("EagerLaunches.__call__", timed(lambda: launches(x, *packed[:6]))),
            ("GemmLaunch.__call__", timed(lambda: gemm(x, STREAM))),
            ("torch.ops.lowvm.quant_linear (general path)",
             timed(lambda: torch.ops.lowvm.quant_linear(x, layer.qweight, layer.scales,
                                                        None, None, "int4", 128))),
            ("backend.cuda_quant_linear", timed(lambda: _general(layer, x))),
        ]


if __name__ == "__main__":
    class _Patch:
        def setattr(self, target, name, value):
            setattr(target, name, value)

    install_fake_gpu(_Patch()).decode = False
    # the custom op's is_cuda test: let CPU tensors through
    backend.quant_linear = lambda x2d, layer: backend.cuda_quant_linear(x2d, layer)
    for stage, us in _stages():
        print(f"{stage:48s} {us:7.2f} us")
