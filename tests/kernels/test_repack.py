"""The repacking VM programs against the numpy reference, every 1..8-bit type."""

from __future__ import annotations

import numpy as np
import pytest

import lowvm
from lowvm.dtypes import all_dtypes, pack
from lowvm.kernels.quant_gemm import GemmSchedule, repack_weights
from lowvm.kernels.repack import repack_program, unpack_program

_TYPES = [t for t in all_dtypes() if t.nbits <= 8]


def _plain(codes, wt):
    return np.stack([pack(row, wt) for row in codes])


@pytest.mark.parametrize("wt", _TYPES, ids=lambda t: t.name)
def test_repack_program_equals_repack_weights_and_unpacks_back(wt):
    rng = np.random.default_rng(wt.nbits)
    n, k = 128, 256
    for bk in (128, 32):
        if bk * wt.nbits % 16:
            continue
        codes = rng.integers(0, 1 << wt.nbits, (n, k)).astype(np.uint8)
        plain = _plain(codes, wt)
        want = repack_weights(codes, wt, GemmSchedule(bk=bk))
        out = np.zeros_like(want)
        lowvm.interpret(repack_program, n, k, plain.reshape(-1), out.reshape(-1), wtype=wt,
                        bk=bk)
        assert np.array_equal(out, want), bk
        back = np.zeros_like(plain)
        lowvm.interpret(unpack_program, n, k, out.reshape(-1), back.reshape(-1), wtype=wt,
                        bk=bk)
        assert np.array_equal(back, plain), bk


def test_a_wrong_order_is_caught():
    """The comparison has teeth: int4 repacked in K tiles of 32 differs from the format
    of K tiles of 128."""
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 16, (64, 128)).astype(np.uint8)
    out = np.zeros_like(repack_weights(codes, lowvm.int4, GemmSchedule()))
    lowvm.interpret(repack_program, 64, 128, _plain(codes, lowvm.int4).reshape(-1),
                    out.reshape(-1), wtype=lowvm.int4, bk=32)
    assert not np.array_equal(out, repack_weights(codes, lowvm.int4, GemmSchedule()))


@pytest.mark.gpu
@pytest.mark.parametrize("wt", [lowvm.int4, lowvm.int3, lowvm.float4_e2m1, lowvm.uint8],
                         ids=lambda t: t.name)
def test_gpu_repack_program_equals_repack_weights(wt):
    import torch

    rng = np.random.default_rng(3)
    n, k = 256, 1024
    codes = rng.integers(0, 1 << wt.nbits, (n, k)).astype(np.uint8)
    plain = torch.from_numpy(_plain(codes, wt)).cuda()
    want = repack_weights(codes, wt, GemmSchedule())
    out = torch.zeros(want.shape, dtype=torch.uint8, device="cuda")
    lowvm.compile(repack_program, wtype=wt, bk=128)(n, k, plain, out)
    assert np.array_equal(out.cpu().numpy(), want)
    back = torch.zeros_like(plain)
    lowvm.compile(unpack_program, wtype=wt, bk=128)(n, k, out, back)
    assert torch.equal(back, plain)
