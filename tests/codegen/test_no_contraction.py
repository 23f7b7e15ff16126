"""Separately rounded float arithmetic stays separate in the generated CUDA.

The interpreter rounds every result to its type, so ``acc + x * x`` rounds the product
first. Compilers fuse a multiply and an add they may contract (plain ``*``/``+`` on
float32, ``__hmul2``/``__hadd2``: ``mul.bf16x2`` on sm_90, ``mul.f16x2`` everywhere) into
one ``fma`` rounded once; the fuzzer found that on an H100 (case
tests/fuzz/regressions/gpu-loop_b14e6a671005.json). The emitters therefore write the
``_rn`` intrinsics, which the compiler never fuses."""

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import lowvm.lang as vm
from lowvm.driver import generate_cuda
from lowvm.dtypes import bfloat16, float16, float32, round_to

REGRESSION = Path(__file__).parents[1] / "fuzz" / "regressions" / "gpu-loop_b14e6a671005.json"
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def _mul_add_sub(dt):
    """``out = x * y + z - x`` over 512 elements of ``dt``: one mul, add and sub each."""
    @vm.program(warps=4)
    def mul_add_sub(x: vm.ptr[dt], y: vm.ptr[dt], z: vm.ptr[dt], out: vm.ptr[dt]):
        vm.set_grid(1)
        lay = vm.spatial(128).local(4)
        gx, gy, gz, go = (vm.global_view(p, [512]) for p in (x, y, z, out))
        a, b, c = (vm.load_global(g, [0], [512], lay) for g in (gx, gy, gz))
        vm.store_global(go, a * b + c - a, [0])

    return mul_add_sub.build()


def _arithmetic_lines(source: str) -> str:
    """The body's lines, without the prelude's helper functions."""
    return source.split('extern "C"', 1)[1]


@pytest.mark.parametrize("dt", [float16, bfloat16], ids=lambda t: t.name)
def test_two_lane_math_uses_the_rounded_intrinsics(dt):
    body = _arithmetic_lines(generate_cuda(_mul_add_sub(dt)).source)
    for name in ("__hmul2_rn(", "__hadd2_rn(", "__hsub2_rn("):
        assert name in body, name
    assert not re.search(r"__h(mul|add|sub)2\(", body)


def test_float32_math_uses_the_rounded_intrinsics():
    body = _arithmetic_lines(generate_cuda(_mul_add_sub(float32)).source)
    for name in ("__fmul_rn(", "__fadd_rn(", "__fsub_rn("):
        assert name in body, name
    elementwise = [line for line in body.splitlines()
                   if re.match(r"\s*r\d+\[l\] = ", line) and "__f" in line]
    assert len(elementwise) == 3
    assert not any(re.search(r"\)\s*[-+*]\s*\(", line) for line in elementwise)


def _regression_case():
    from lowvm.fuzz.shrink import load_regression

    spec, _ = load_regression(REGRESSION)
    return spec


def test_the_fuzzer_case_computes_the_interpreters_values():
    """The shrunk H100 case: the kernel now rounds each product and each sum to bfloat16
    (``__hmul2_rn``, ``__hadd2_rn``); that, emulated in numpy on the fuzzer's own data,
    equals the interpreter bit for bit, where a fused multiply-add (what ``__hmul2`` then
    ``__hadd2`` became on sm_90) does not."""
    from lowvm.fuzz.build import build_program
    from lowvm.fuzz.check import read_output, to_numpy
    from lowvm.fuzz.generate import make_arrays
    from lowvm.interpreter import interpret

    spec = _regression_case()
    program = build_program(spec)
    body = _arithmetic_lines(generate_cuda(program).source)
    assert "__hmul2_rn(" in body and "__hadd2_rn(" in body
    assert not re.search(r"__h(mul|add)2\(", body)

    arrays = make_arrays(spec)
    x = to_numpy(arrays.tensors[0]).astype(np.float64)
    interpret(program, *arrays.scalars, *arrays.tensors)
    expected, _ = read_output(spec, to_numpy(arrays.tensors[-1]))

    m, _, k = arrays.scalars
    bn = spec.tile[1]

    def bf16(v):
        return round_to(v, bfloat16).astype(np.float64)

    def kernel(fused: bool) -> np.ndarray:
        acc = np.zeros((m, bn))
        for step in range(-(-k // bn)):
            t = np.zeros((m, bn))  # the copy fills columns past k with zeros
            width = min(bn, k - step * bn)
            t[:, :width] = x[:, step * bn:step * bn + width]
            acc = bf16(acc + t * t) if fused else bf16(acc + bf16(t * t))
        return acc

    assert np.array_equal(kernel(fused=False), expected)
    assert not np.array_equal(kernel(fused=True), expected)  # the data tells them apart


@pytest.mark.slow
@needs_nvcc
def test_sm90_machine_code_keeps_the_bfloat16_product_apart(tmp_path):
    """ptxas for sm_90: every two-lane bfloat16 fma is a product (addend -0) or a sum
    (factor 1), none multiplies two registers into a third (the fused ``acc + x * x``)."""
    from tests.codegen.test_fast_cast import _wheel_tool

    nvdisasm = shutil.which("nvdisasm") or _wheel_tool("nvdisasm")
    if nvdisasm is None:
        pytest.skip("no nvdisasm (pip install nvidia-cuda-nvdisasm)")
    from lowvm.fuzz.build import build_program

    (tmp_path / "k.cu").write_text(generate_cuda(build_program(_regression_case())).source)
    proc = subprocess.run(["nvcc", "-cubin", "-gencode=arch=compute_90,code=sm_90", "-O3",
                           "-std=c++17", "-o", "k.cubin", "k.cu"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    sass = subprocess.run([nvdisasm, "k.cubin"], cwd=tmp_path, check=True,
                          capture_output=True, text=True).stdout
    two_lane = re.findall(r"\bH(?:FMA2|MUL2|ADD2)[.\w]*BF16[^;]*", sass)
    assert len(two_lane) == 8, two_lane  # 4 register pairs: a product and a sum each
    fused = [i for i in two_lane if re.search(r"R\d+, R\d+, R\d+, R\d+\s*$", i.strip())]
    assert not fused, fused
