"""Every example program on the GPU gives the interpreter's answer (marked ``gpu``)."""

from __future__ import annotations

import numpy as np
import pytest

import lowvm
from lowvm.dtypes import all_dtypes
from lowvm.kernels.cast import cast_roundtrip, pack_lowbit, unpack_lowbit
from lowvm.kernels.matmul_f16 import matmul_f16
from lowvm.kernels.quant_matmul import dequantize_weights, quant_matmul, quantize_weights
from lowvm.kernels.vector_add import vector_add

pytestmark = pytest.mark.gpu
LOW_BIT = [d for d in all_dtypes() if d.nbits <= 8]


def _cuda(array: np.ndarray):
    import torch

    return torch.from_numpy(np.ascontiguousarray(array)).cuda()


def _host(tensor) -> np.ndarray:
    return tensor.cpu().numpy()


@pytest.mark.parametrize("n", [1, 1000, 4097])
def test_vector_add_matches_interpreter_bit_exactly(n):
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((2, n)).astype(np.float32)
    c_ref = np.zeros(n, np.float32)
    lowvm.interpret(vector_add, n, a, b, c_ref)
    c = _cuda(np.full(n, np.nan, np.float32))
    lowvm.compile(vector_add)(n, _cuda(a), _cuda(b), c)
    assert np.array_equal(_host(c), c_ref)


@pytest.mark.parametrize("wtype", LOW_BIT, ids=lambda d: d.name)
def test_pack_unpack_cast_bit_exact(wtype):
    n = 8 * 1024 + 8
    rng = np.random.default_rng(wtype.nbits * 7)
    x = (rng.standard_normal(n) * wtype.max_value / 2).astype(np.float32)
    x[:4] = [0.0, -0.0, wtype.max_value * 3, -wtype.max_value * 3]  # zeros and saturation
    packed_ref = np.zeros(n * wtype.nbits // 8, np.uint8)
    lowvm.interpret(pack_lowbit, n, x, packed_ref, wtype=wtype)
    packed = _cuda(np.full_like(packed_ref, 0xAB))
    lowvm.compile(pack_lowbit, wtype=wtype)(n, _cuda(x), packed)
    assert np.array_equal(_host(packed), packed_ref)

    y_ref = np.zeros(n, np.float32)
    lowvm.interpret(unpack_lowbit, n, packed_ref, y_ref, wtype=wtype)
    y = _cuda(np.full(n, np.nan, np.float32))
    lowvm.compile(unpack_lowbit, wtype=wtype)(n, _cuda(packed_ref), y)
    assert np.array_equal(_host(y), y_ref)

    z_ref = np.zeros(n - 3, np.float32)
    lowvm.interpret(cast_roundtrip, n - 3, x[:-3], z_ref, wtype=wtype)
    z = _cuda(np.full(n - 3, np.nan, np.float32))
    lowvm.compile(cast_roundtrip, wtype=wtype)(n - 3, _cuda(x[:-3]), z)
    assert np.array_equal(_host(z), z_ref)


@pytest.mark.parametrize("m, n, k", [(64, 64, 64), (50, 70, 40), (1, 8, 16), (130, 33, 97)])
def test_matmul_f16(m, n, k):
    rng = np.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    ref_interp = np.zeros((m, n), np.float16)
    lowvm.interpret(matmul_f16, m, n, k, a, b, ref_interp)
    c = _cuda(np.full((m, n), np.nan, np.float16))
    lowvm.compile(matmul_f16)(m, n, k, _cuda(a), _cuda(b), c)
    out = _host(c).astype(np.float64)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-3
    assert np.abs(out - ref_interp).max() <= 2e-3 * np.abs(ref).max()


@pytest.mark.parametrize("wtype", ["int4", "uint4", "int3", "float6_e3m2"])
def test_quant_matmul(wtype):
    m, n, k, group = 37, 256, 512, 64
    rng = np.random.default_rng(5)
    packed, scales = quantize_weights(rng.standard_normal((n, k)), wtype, group)
    x = rng.standard_normal((m, k)).astype(np.float16)
    y_interp = np.zeros((m, n), np.float16)
    dt = lowvm.dtype(wtype)
    lowvm.interpret(quant_matmul, m, n, k, x, packed, scales, y_interp, wtype=dt, group=group)
    y = _cuda(np.full((m, n), np.nan, np.float16))
    lowvm.compile(quant_matmul, wtype=dt, group=group)(m, n, k, _cuda(x), _cuda(packed),
                                                       _cuda(scales), y)
    out = _host(y).astype(np.float64)
    ref = x.astype(np.float64) @ dequantize_weights(packed, scales, wtype, group, k).T
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 2e-3
    assert np.abs(out - y_interp).max() <= 2e-3 * np.abs(ref).max()


def test_cuda_graph_capture_and_replay():
    import torch

    n = 3000
    a, b = (torch.randn(n, device="cuda") for _ in range(2))
    c = torch.zeros(n, device="cuda")
    kernel = lowvm.compile(vector_add)
    kernel(n, a, b, c)  # warm up (module load) outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(n, a, b, c)
    a.copy_(torch.randn(n, device="cuda"))
    c.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(c, a + b)
