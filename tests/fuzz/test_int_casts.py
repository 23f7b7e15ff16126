"""Integers beyond 2^24 on the GPU round once, as the interpreter does: casts to bf16
and the small floats (``(float)v`` first rounded to float32, then the conversion rounded
again), and int32 arithmetic with a float scalar (computed in float32, which rounds the
int before the op). Differences the fuzzer's rounding-edge inputs expose."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import lowvm
import lowvm.lang as vm
from lowvm.fuzz import numerics as nm

#: next to a bf16 midpoint: direct RNE 16908288, through float32 16777216
EDGE = 2**24 + 2**16 + 1
TYPES = ("bfloat16", "float16", "float8_e6m1", "float4_e2m1")


def _program(dtype: str):
    @vm.program(warps=1)
    def int_cast(x: vm.ptr[vm.int32], y: vm.ptr[vm.float32]):
        vm.set_grid(1)
        v = vm.load_global(vm.global_view(x, [64]), [0], [64], vm.spatial(32).local(2))
        narrow = vm.cast(v, lowvm.dtype(dtype))
        vm.store_global(vm.global_view(y, [64]), vm.cast(narrow, vm.float32), [0])
    return int_cast.build()


def _inputs() -> np.ndarray:
    e = np.arange(25, 31)
    edges = np.concatenate([2**e + 2 ** (e - 9) + 1, 2**e + 2 ** (e - 2) - 1,
                            -(2**e + 2 ** (e - 3) + 1), [EDGE, -EDGE, 7, -3]])
    return np.resize(edges, 64).astype(np.int32)


@pytest.mark.parametrize("dtype", TYPES)
def test_the_interpreter_rounds_ints_once(dtype):
    x, y = _inputs(), np.zeros(64, np.float32)
    lowvm.interpret(_program(dtype), x, y)
    expected = nm.round_to_type(x.astype(np.float64), lowvm.dtype(dtype))
    assert np.array_equal(y, expected)


def test_the_generated_cuda_converts_ints_directly():
    bf16 = lowvm.generate_cuda(_program("bfloat16")).source
    assert "__int2bfloat16_rn(" in bf16 and "__float2bfloat16_rn((float)" not in bf16
    assert "__int2half_rn(" in lowvm.generate_cuda(_program("float16")).source
    assert "__int2float_rz(" in lowvm.generate_cuda(_program("float8_e6m1")).source


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_the_int_casts_compile_for_sm80_and_sm90():
    from lowvm.runtime import resource_usage

    programs = [_program(dtype) for dtype in TYPES] + [_scaled_program()]
    for program in programs:
        source = lowvm.generate_cuda(program).source
        for arch in ("sm_80", "sm_90"):
            assert resource_usage(source, arch)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", TYPES)
def test_gpu_rounds_ints_once(dtype):
    import torch

    program = _program(dtype)
    x = _inputs()
    expected = np.zeros(64, np.float32)
    lowvm.interpret(program, x, expected)
    y = torch.full((64,), -1.0, device="cuda")
    lowvm.compile(program)(torch.from_numpy(x).cuda(), y)
    assert np.array_equal(y.cpu().numpy(), expected)


def _scaled_program():
    @vm.program(warps=1)
    def scaled(x: vm.ptr[vm.int32], y: vm.ptr[vm.int32]):
        vm.set_grid(1)
        v = vm.load_global(vm.global_view(x, [64]), [0], [64], vm.spatial(32).local(2))
        vm.store_global(vm.global_view(y, [64]), vm.maximum(v * 1.5, -2.5), [0])
    return scaled.build()


def test_int32_with_a_float_scalar_is_computed_exactly():
    """``v * 1.5`` of an int32 tile: exact, rounded once to an integer (half to even);
    the GPU computes it in double (float32 would round 2^25 + 1 first)."""
    x = np.array([2**25 + 1, -(2**25 + 3), 7, -9] * 16, np.int32)
    y = np.zeros(64, np.int32)
    lowvm.interpret(_scaled_program(), x, y)
    assert np.array_equal(y, np.maximum(np.rint(x.astype(np.float64) * 1.5), -2))
    source = lowvm.generate_cuda(_scaled_program()).source
    assert "__double2int_rn(" in source and "(double)(" in source


@pytest.mark.gpu
def test_gpu_int32_with_a_float_scalar():
    import torch

    x = np.array([2**25 + 1, -(2**25 + 3), 7, -9] * 16, np.int32)
    expected = np.zeros(64, np.int32)
    lowvm.interpret(_scaled_program(), x, expected)
    y = torch.zeros(64, dtype=torch.int32, device="cuda")
    lowvm.compile(_scaled_program())(torch.from_numpy(x).cuda(), y)
    assert np.array_equal(y.cpu().numpy(), expected)
