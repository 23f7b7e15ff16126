"""Issue 5's correctness matrix on the GPU: every 1..8-bit weight type (int1 excepted: the
library refuses it, see lowvm.nn.layer.spec) x groups 32 / 64 / 128 / per-channel x float16
(where the type fits it) and bfloat16 activations, at an odd decode M (7) for every group
and an odd M > 16 (37, the bm = 64 path) at group 128, plus zero points for the unsigned
types; each output against a float64 reference of the dequantised weight.

The interpreter runs the same matrix on the CPU
(test_quant_gemm.test_interpreter_every_type_group_and_activation_type); this file is the
GPU half. It compiles ~10 kernels per type (~370 in all, a few minutes on the H100), so
the device check runs it as its own call.
"""

from __future__ import annotations

import numpy as np
import pytest

import lowvm
from lowvm.kernels.library import fits_float16, prepare_weight, quant_linear, quantize_to_codes
from tests.helpers.gemm import float64_reference

TYPES = [t.name for t in lowvm.dtypes.all_dtypes() if t.nbits <= 8 and t.name != "int1"]
N, K = 128, 512


def _check(x, qw, ref, wtype, what):
    import torch

    if not np.linalg.norm(ref):
        return  # e.g. uint1 codes of an all-negative group: nothing to compare
    kinds = [(torch.bfloat16, 2e-2)]
    if fits_float16(lowvm.dtype(wtype)):
        kinds.append((torch.float16, 2e-3))
    for dtype, tol in kinds:
        y = quant_linear(torch.from_numpy(x).cuda().to(dtype), qw)
        torch.cuda.synchronize()
        assert y.dtype == dtype and y.shape == (x.shape[0], N)
        err = np.linalg.norm(y.double().cpu().numpy() - ref) / np.linalg.norm(ref)
        assert err < tol, (wtype, what, dtype, err)


@pytest.mark.gpu
@pytest.mark.parametrize("wtype", TYPES)
def test_gpu_every_type_group_and_activation_type(wtype):
    rng = np.random.default_rng(21)
    for group in (32, 64, 128, K):
        codes, scales = quantize_to_codes(rng.standard_normal((N, K)), wtype, group)
        qw = prepare_weight(codes, scales, wtype, group)
        for m in ((7, 37) if group == 128 else (7,)):
            x = rng.standard_normal((m, K)).astype(np.float16)
            _check(x, qw, float64_reference(x, codes, scales, wtype, group), wtype, (group, m))


@pytest.mark.gpu
@pytest.mark.parametrize("wtype", [t for t in TYPES if t.startswith("uint")])
def test_gpu_zero_points_for_every_unsigned_type(wtype):
    rng = np.random.default_rng(22)
    wt, group = lowvm.dtype(wtype), 128
    codes = rng.integers(0, 1 << wt.nbits, (N, K)).astype(np.int64)
    scales = (rng.random((K // group, N)) * 0.1 + 0.01).astype(np.float16)
    zeros = rng.integers(0, 1 << wt.nbits, (K // group, N)).astype(np.float16)
    qw = prepare_weight(codes, scales, wtype, group, zeros=zeros)
    x = rng.standard_normal((7, K)).astype(np.float16)
    _check(x, qw, float64_reference(x, codes, scales, wtype, group, zeros), wtype, "zero points")
