"""``vm.range`` is Python's ``range`` for every step sign, in the interpreter and in the
kernel; a step of 0 is refused at build time, at run time, before a launch, and stops
a kernel that computes it on the GPU instead of hanging it."""

import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import lowvm
import lowvm.lang as vm
from lowvm.runtime import LaunchError


def _line(mark: str) -> int:
    with open(__file__) as f:
        found = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# <- {mark}")]
    assert len(found) == 1
    return found[0]


@vm.program(warps=1)
def visits(start: vm.int32, stop: vm.int32, step: vm.int32, out: vm.ptr[vm.int32]):
    """out[i] counts the visits of i + 8 (the loop values lie in [-8, 24))."""
    vm.set_grid(1)
    g = vm.global_view(out, [32])
    one = vm.register_tensor(vm.int32, [1], None, init=1)
    for i in vm.range(start, stop, step):  # <- loop
        vm.store_global(g, vm.load_global(g, [i + 8], [1]) + one, [i + 8])


RANGES = [(0, 16, 1), (0, 16, -1), (15, -1, -1), (15, -1, -3), (-8, 24, 5), (23, -8, -7),
          (4, 4, 1), (4, 4, -1), (0, 16, 16), (20, 0, -32)]


def _expected(start: int, stop: int, step: int) -> np.ndarray:
    out = np.zeros(32, np.int32)
    for i in range(start, stop, step):
        out[i + 8] += 1
    return out


@pytest.mark.parametrize("bounds", RANGES)
def test_a_runtime_step_runs_pythons_range(bounds):
    out = np.zeros(32, np.int32)
    lowvm.interpret(visits, *bounds, out)
    assert np.array_equal(out, _expected(*bounds))


def test_a_runtime_step_of_zero_is_refused_at_the_loop():
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(visits, 0, 16, 0, np.zeros(32, np.int32))
    assert f"test_range_steps.py:{_line('loop')}" in str(e.value)
    assert "the step step is 0 at run time" in str(e.value)


def test_a_compile_time_step_of_zero_is_refused_when_built():
    @vm.program(warps=1)
    def zero(n: vm.int32, out: vm.ptr[vm.int32]):
        vm.set_grid(1)
        for _ in vm.range(0, n, 0):  # <- zero
            pass

    with pytest.raises(lowvm.ProgramError) as e:
        zero.build()
    assert f"test_range_steps.py:{_line('zero')}" in str(e.value)
    assert "the step is 0" in str(e.value)


@pytest.mark.parametrize("bound, shown", [(0.5, "0.5"), (True, "True"), ("4", "'4'")])
def test_bounds_that_are_not_integers_are_refused(bound, shown):
    @vm.program(warps=1)
    def prog(out: vm.ptr[vm.int32]):
        vm.set_grid(1)
        for _ in vm.range(0, 8, bound):
            pass

    with pytest.raises(lowvm.ProgramError, match=f"step must be an integer .* got {shown}"):
        prog.build()


def test_a_float_runtime_bound_is_refused():
    @vm.program(warps=1)
    def prog(x: vm.float32, out: vm.ptr[vm.int32]):
        vm.set_grid(1)
        for _ in vm.range(x):
            pass

    with pytest.raises(lowvm.ProgramError, match=r"stop must be an integer .* got x \(float32\)"):
        prog.build()


def test_the_kernel_counts_by_the_steps_sign_and_stops_at_zero():
    source = lowvm.generate_cuda(visits).source
    assert "if (lowvm_step_1 == 0) __trap();" in source
    assert "(lowvm_step_1 > 0 ? i" in source and "i3 += lowvm_step_1" in source
    # a compile-time step keeps the plain loop
    from lowvm.kernels.vector_add import vector_add

    assert "lowvm_step" not in lowvm.generate_cuda(vector_add).source


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to compile the kernel")
def test_a_launch_whose_arguments_make_the_step_zero_is_refused():
    kernel = lowvm.compile(visits, arch="sm_80")
    with pytest.raises(LaunchError) as e:
        kernel(0, 16, 0, None)
    assert f"test_range_steps.py:{_line('loop')}" in str(e.value)
    assert "step step is 0 for the arguments" in str(e.value)
    with pytest.raises(lowvm.LowvmError) as e:  # a good step goes on to the launch
        kernel(0, 16, 1, None)
    assert "step" not in str(e.value)


# -- on a GPU ---------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("bounds", RANGES)
def test_gpu_runs_the_same_range(bounds):
    import torch

    out = torch.zeros(32, dtype=torch.int32, device="cuda")
    lowvm.compile(visits)(*bounds, out)
    torch.cuda.synchronize()
    assert np.array_equal(out.cpu().numpy(), _expected(*bounds))


_DEVICE_ZERO_STEP = textwrap.dedent("""
    import torch, lowvm, lowvm.lang as vm

    @vm.program(warps=1)
    def prog(n: vm.int32, out: vm.ptr[vm.int32]):
        vm.set_grid(1)
        g = vm.global_view(out, [1])
        one = vm.register_tensor(vm.int32, [1], None, init=1)
        for i in vm.range(0, n, vm.block_index(0)):  # 0 in block 0: only the GPU knows
            vm.store_global(g, one, [0])

    out = torch.zeros(1, dtype=torch.int32, device="cuda")
    lowvm.compile(prog)(4, out)
    torch.cuda.synchronize()
    print("FINISHED")
""")


@pytest.mark.gpu
def test_gpu_a_step_of_zero_computed_on_the_device_stops_the_kernel():
    """The kernel traps (the launch fails) instead of looping forever; in a process of
    its own, since a trap leaves the CUDA context unusable."""
    done = subprocess.run([sys.executable, "-c", _DEVICE_ZERO_STEP], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0 and "FINISHED" not in done.stdout
    assert "CUDA" in done.stderr or "cuda" in done.stderr, done.stderr[-2000:]
