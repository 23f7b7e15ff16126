"""Kernel launches: argument checks (no GPU needed) and real launches (``gpu`` tests)."""

from __future__ import annotations

import pytest
import torch

import lowvm
from lowvm.runtime import (
    CudaDriverError,
    Kernel,
    LaunchError,
    ParamSpec,
    compile_cubin,
    pointer,
    scalar,
)

FAKE_CUBIN = b"\x7fELF not loaded in these tests"
ADD_N = r"""
extern "C" __global__ void add_n(float* out, const float* a, int n, int count) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < count) out[i] = a[i] + (float)n;
}
"""
ADD_N_PARAMS = [
    ("out", "pointer", lowvm.float32),
    ("a", "pointer", lowvm.float32),
    ("n", "scalar", lowvm.int32),
    ("count", "scalar", lowvm.int32),
]


def _kernel() -> Kernel:
    return Kernel(
        FAKE_CUBIN,
        "mixed",
        128,
        0,
        [
            pointer("out", lowvm.float16),
            pointer("w", lowvm.int4),  # packed low-bit weights: a uint8 buffer
            pointer("bias", "bf16"),
            scalar("n", lowvm.int32),
            scalar("scale", lowvm.float32),
        ],
    )


def _good_args() -> list[object]:
    # Without a GPU no tensor can pass, so the pointers are raw (aligned) device addresses
    # and each test puts the CPU tensor it checks in one place.
    return [0x7F0000000000, 0x7F0000010000, 0x7F0000020000, 7, 0.5]


def _expect(args: list[object], *fragments: str) -> str:
    with pytest.raises(LaunchError) as info:
        _kernel().check_args(args)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


# -- construction ---------------------------------------------------------------------


def test_kernel_builds_without_a_gpu() -> None:
    k = _kernel()
    assert k.name == "mixed" and k.block_threads == 128 and k.dynamic_shared_bytes == 0
    assert [p.name for p in k.params] == ["out", "w", "bias", "n", "scale"]
    assert k.params[1] == ParamSpec("w", "pointer", lowvm.int4)
    assert "w: pointer int4" in repr(k)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"block_threads": 0}, "block_threads"),
        ({"block_threads": 2048}, "block_threads"),
        ({"dynamic_shared_bytes": -1}, "dynamic_shared_bytes"),
        ({"params": [("x", "scalar", lowvm.float16)]}, "int32 or float32"),
        ({"params": [("x", "array", lowvm.float16)]}, "kind must be one of"),
        ({"params": [("x", "pointer", lowvm.float32), ("x", "scalar", lowvm.int32)]}, "unique"),
        ({"params": [("x", "pointer", "float9")]}, "'x'"),
        ({"params": [("not a name", "pointer", lowvm.float32)]}, "C identifier"),
        ({"cubin": b""}, "cubin"),
    ],
)
def test_bad_kernel_declarations(kwargs: dict[str, object], fragment: str) -> None:
    args: dict[str, object] = {
        "cubin": FAKE_CUBIN,
        "name": "k",
        "block_threads": 128,
        "dynamic_shared_bytes": 0,
        "params": [],
    }
    args.update(kwargs)
    with pytest.raises(LaunchError, match=fragment):
        Kernel(**args)  # type: ignore[arg-type]


# -- argument checks --------------------------------------------------------------------


def test_good_arguments_pass() -> None:
    assert _kernel().check_args(_good_args()) == tuple(_good_args())


def test_cpu_tensors_are_rejected_after_all_else_passes() -> None:
    args = _good_args()
    args[2] = torch.zeros(64, dtype=torch.bfloat16)
    _expect(args, "'bias'", "CUDA device", "cpu")


def test_wrong_dtype_is_rejected() -> None:
    args = _good_args()
    args[0] = torch.zeros(64, dtype=torch.float32)
    _expect(args, "'out'", "torch.float16", "torch.float32")


def test_low_bit_weights_need_a_uint8_buffer() -> None:
    args = _good_args()
    args[1] = torch.zeros(32, dtype=torch.int8)
    _expect(args, "'w'", "torch.uint8", "packed int4")
    args[1] = torch.zeros(32, dtype=torch.uint8)
    _expect(args, "'w'", "not the CPU")  # the dtype is right now


def test_non_contiguous_tensor_is_rejected() -> None:
    args = _good_args()
    args[2] = torch.zeros(64, 2, dtype=torch.bfloat16)[:, 0]
    _expect(args, "'bias'", "contiguous")


def test_misaligned_view_is_rejected() -> None:
    args = _good_args()
    args[0] = torch.zeros(64, dtype=torch.float16)[1:]  # 2 bytes past an aligned start
    _expect(args, "'out'", "aligned to 16 bytes")


@pytest.mark.parametrize("value", [2**31, -(2**31) - 1, 10**20])
def test_int32_out_of_range_is_rejected(value: int) -> None:
    args = _good_args()
    args[3] = value
    _expect(args, "'n'", "int32 range", str(value))


@pytest.mark.parametrize("value", [1.5, "3", True, None, torch.tensor(3)])
def test_int32_needs_an_int(value: object) -> None:
    args = _good_args()
    args[3] = value
    _expect(args, "'n'", "accepted: a Python int")


@pytest.mark.parametrize("value", ["0.5", None, False, 1e39, 10**400])
def test_float32_needs_a_float32_number(value: object) -> None:
    args = _good_args()
    args[4] = value
    _expect(args, "'scale'")


def test_wrong_argument_count_is_rejected() -> None:
    message = _expect(_good_args()[:4], "expected 5 arguments", "got 4")
    assert "out, w, bias, n, scale" in message


def test_int_pointers_are_accepted_when_aligned() -> None:
    k = _kernel()
    values = k.check_args([0x7F0000000000, 0x7F0000000100, 0, 3, 2], device=0)
    assert values == (0x7F0000000000, 0x7F0000000100, 0, 3, 2.0)
    assert isinstance(values[4], float)
    with pytest.raises(LaunchError, match="'w'.*multiple of 16"):
        k.check_args([0x7F0000000000, 0x7F0000000101, 0, 3, 2.0])
    with pytest.raises(LaunchError, match="'out'.*2\\*\\*64"):
        k.check_args([-16, 0, 0, 3, 2.0])
    with pytest.raises(LaunchError, match="'bias'.*tensor or an int device address"):
        k.check_args([0, 0, 1.0, 3, 2.0])


def test_check_order_reports_structure_before_device() -> None:
    # A CPU tensor that is also misaligned reports the alignment (fixable in code) first.
    args = _good_args()
    args[0] = torch.zeros(64, dtype=torch.float16)[1:]
    message = _expect(args, "'out'")
    assert "aligned" in message and "not the CPU" not in message


@pytest.mark.parametrize("grid", [(1, 1), (1, 1, 1, 1), (-1, 1, 1), (1.0, 1, 1), (1, 70000, 1)])
def test_bad_grid_is_rejected(grid: object) -> None:
    with pytest.raises(LaunchError, match="grid must be a tuple of 3 ints"):
        Kernel._check_grid(grid)


def test_launch_checks_the_grid_before_touching_the_gpu() -> None:
    with pytest.raises(LaunchError, match="grid must be a tuple of 3 ints"):
        _kernel().launch((1, -1, 1), _good_args())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_launch_without_a_gpu_says_so() -> None:
    with pytest.raises(CudaDriverError, match="needs a CUDA device"):
        _kernel().launch((1, 1, 1), _good_args())


# -- on a GPU ---------------------------------------------------------------------------


def _device_arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


@pytest.fixture(scope="module")
def add_n() -> Kernel:
    return Kernel(compile_cubin(ADD_N, _device_arch()), "add_n", 128, 0, ADD_N_PARAMS)


@pytest.mark.gpu
def test_launch_add_n(add_n: Kernel) -> None:
    count = 1000
    a = torch.randn(count, device="cuda")
    out = torch.full((count + 24,), -1.0, device="cuda")
    grid = ((count + 127) // 128, 1, 1)
    add_n.launch(grid, [out, a, 5, count])
    torch.cuda.synchronize()
    torch.testing.assert_close(out[:count], a + 5)
    assert bool((out[count:] == -1.0).all())  # nothing written past count
    add_n.launch(grid, [out.data_ptr(), a.data_ptr(), -2, count])  # raw device pointers
    torch.cuda.synchronize()
    torch.testing.assert_close(out[:count], a - 2)


@pytest.mark.gpu
def test_zero_grid_launches_nothing(add_n: Kernel) -> None:
    a = torch.ones(128, device="cuda")
    out = torch.zeros(128, device="cuda")
    add_n.launch((0, 1, 1), [out, a, 1, 128])
    torch.cuda.synchronize()
    assert bool((out == 0).all())


@pytest.mark.gpu
def test_launch_on_explicit_stream(add_n: Kernel) -> None:
    a = torch.arange(256, dtype=torch.float32, device="cuda")
    out = torch.zeros(256, device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # a and out are ready on it
    add_n.launch((2, 1, 1), [out, a, 3, 256], stream=stream)
    stream.synchronize()
    torch.testing.assert_close(out, a + 3)


@pytest.mark.gpu
def test_launch_checks_device_arguments(add_n: Kernel) -> None:
    a = torch.ones(128, device="cuda")
    with pytest.raises(LaunchError, match="'out'.*CUDA device"):
        add_n.launch((1, 1, 1), [torch.zeros(128), a, 1, 128])
    with pytest.raises(LaunchError, match="'a'.*torch.float32"):
        add_n.launch((1, 1, 1), [a, a.half(), 1, 128])


@pytest.mark.gpu
def test_param_mismatch_is_caught_at_load() -> None:
    wrong = Kernel(compile_cubin(ADD_N, _device_arch()), "add_n", 128, 0, ADD_N_PARAMS[:3])
    with pytest.raises(LaunchError, match="compiled kernel takes"):
        wrong.load()
    missing = Kernel(compile_cubin(ADD_N, _device_arch()), "nope", 128, 0, ADD_N_PARAMS)
    with pytest.raises(CudaDriverError, match="cuModuleGetFunction"):
        missing.load()


@pytest.mark.gpu
def test_cuda_graph_capture_and_replay(add_n: Kernel) -> None:
    count = 4096
    a = torch.randn(count, device="cuda")
    out = torch.zeros(count, device="cuda")
    grid = (count // 128, 1, 1)
    add_n.launch(grid, [out, a, 1, count])  # loads the module before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        add_n.launch(grid, [out, a, 10, count])
    out.zero_()
    torch.cuda.synchronize()
    assert bool((out == 0).all())  # capture did not run the kernel
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, a + 10)
    a.copy_(torch.randn(count, device="cuda"))  # replays read the captured pointers
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, a + 10)
