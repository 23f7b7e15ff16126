"""The example programs in lowvm/kernels/, run by the CPU interpreter against numpy float64."""

from __future__ import annotations

import time

import numpy as np
import pytest

import lowvm
from lowvm.dtypes import all_dtypes, decode, encode, pack, round_to, unpack
from lowvm.kernels.cast import cast_roundtrip, pack_lowbit, unpack_lowbit
from lowvm.kernels.matmul_f16 import matmul_f16
from lowvm.kernels.quant_matmul import dequantize_weights, quant_matmul, quantize_weights
from lowvm.kernels.vector_add import vector_add

LOW_BIT = [d for d in all_dtypes() if d.nbits <= 8]


def _rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))


@pytest.mark.parametrize("n", [1, 511, 512, 1500])
def test_vector_add(n):
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((2, n)).astype(np.float32)
    c = np.full(n + 3, 7.0, np.float32)  # the 3 extra elements must stay untouched
    lowvm.interpret(vector_add, n, a, b, c[:n])
    assert np.array_equal(c[:n], a + b)
    assert np.all(c[n:] == 7.0)


@pytest.mark.parametrize("wtype", LOW_BIT, ids=lambda d: d.name)
def test_pack_and_unpack_kernels_are_bit_exact(wtype):
    n = 2048
    rng = np.random.default_rng(wtype.nbits)
    x = (rng.standard_normal(n) * wtype.max_value / 2).astype(np.float32)
    packed = np.zeros(n * wtype.nbits // 8, np.uint8)
    lowvm.interpret(pack_lowbit, n, x, packed, wtype=wtype)
    assert np.array_equal(packed, pack(encode(x, wtype), wtype))
    y = np.zeros(n, np.float32)
    lowvm.interpret(unpack_lowbit, n, packed, y, wtype=wtype)
    assert np.array_equal(y, decode(unpack(packed, wtype, n), wtype))


@pytest.mark.parametrize("wtype", [lowvm.int3, lowvm.uint5, lowvm.float6_e3m2,
                                   lowvm.float8_e4m3, lowvm.float4_e2m1], ids=str)
def test_cast_roundtrip_odd_length(wtype):
    n = 1031
    x = (np.random.default_rng(1).standard_normal(n) * 4).astype(np.float32)
    y = np.zeros(n, np.float32)
    lowvm.interpret(cast_roundtrip, n, x, y, wtype=wtype)
    assert np.array_equal(y, round_to(x, wtype).astype(np.float32))


@pytest.mark.parametrize("m, n, k", [(64, 64, 64), (50, 70, 40), (1, 8, 16), (130, 33, 97)])
def test_matmul_f16_odd_sizes(m, n, k):
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    c = np.full((m, n), np.nan, np.float16)  # poisoned: every element must be written
    lowvm.interpret(matmul_f16, m, n, k, a, b, c)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    # f32 accumulation is exact enough; the error is the final float16 rounding
    assert not np.isnan(c).any()
    assert _rel_err(c, ref) < 1e-3
    assert np.array_equal(c, ref.astype(np.float32).astype(np.float16)) or _rel_err(c, ref) < 5e-4


@pytest.mark.parametrize("wtype", ["int4", "uint4", "int3", "float6_e3m2"])
@pytest.mark.parametrize("group", [64, 128])
def test_quant_matmul(wtype, group):
    m, n, k = 37, 128, 256
    rng = np.random.default_rng(hash((wtype, group)) % 2**32)
    weight = rng.standard_normal((n, k)).astype(np.float32)
    packed, scales = quantize_weights(weight, wtype, group)
    x = rng.standard_normal((m, k)).astype(np.float16)
    y = np.full((m, n), np.nan, np.float16)
    lowvm.interpret(quant_matmul, m, n, k, x, packed, scales, y, wtype=lowvm.dtype(wtype),
                    group=group)
    ref = x.astype(np.float64) @ dequantize_weights(packed, scales, wtype, group, k).T
    # the kernel rounds w*scale to float16 and the output to float16: ~2^-11 each
    assert _rel_err(y, ref) < 2e-3


def test_quant_matmul_64x256x256_runs_in_seconds():
    m, n, k, group = 64, 256, 256, 64
    rng = np.random.default_rng(0)
    packed, scales = quantize_weights(rng.standard_normal((n, k)), "int4", group)
    x = rng.standard_normal((m, k)).astype(np.float16)
    y = np.zeros((m, n), np.float16)
    start = time.perf_counter()
    lowvm.interpret(quant_matmul, m, n, k, x, packed, scales, y, wtype=lowvm.int4, group=group)
    assert time.perf_counter() - start < 5.0
    ref = x.astype(np.float64) @ dequantize_weights(packed, scales, "int4", group, k).T
    assert _rel_err(y, ref) < 2e-3


def test_quantize_weights_reference_round_trips():
    w = np.random.default_rng(3).standard_normal((8, 128))
    packed, scales = quantize_weights(w, "int4", 32)
    assert packed.shape == (8, 64) and scales.shape == (4, 8) and scales.dtype == np.float16
    deq = dequantize_weights(packed, scales, "int4", 32, 128)
    # int4 round-to-nearest: error at most half a step per element
    step = np.repeat(scales.T.astype(np.float64), 32, axis=1)
    assert np.all(np.abs(deq - w) <= step / 2 + 1e-3 * step)
