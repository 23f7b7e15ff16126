"""lowvm.nn.layer.kernel_format: the torch repacker derived from the kernel library agrees with
the library (both directions) for every weight type and K tile, keeps agreeing when the
library's format changes, and its fingerprint tells formats apart."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lowvm
from lowvm.dtypes import all_dtypes
from lowvm.kernels import weight_format
from lowvm.kernels.quant_gemm import GemmSchedule, repack_weights, unpack_repacked
from lowvm.nn.errors import QuantizationError
from lowvm.nn.layer import kernel_format as kf

WEIGHT_TYPES = [d.name for d in all_dtypes() if d.nbits <= 8 and d.name != "int1"]


def _codes(n: int, k: int, nbits: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1 << nbits, (n, k), generator=g, dtype=torch.uint8)


def test_every_weight_type_is_listed():
    assert len(WEIGHT_TYPES) == 36 and "uint1" in WEIGHT_TYPES and "float3_e1m1" in WEIGHT_TYPES


@pytest.mark.parametrize("bk", [32, 128])
@pytest.mark.parametrize("wtype", WEIGHT_TYPES)
def test_torch_repack_is_the_library_repack(wtype, bk):
    fmt = kf.kernel_format(wtype, bk)
    assert fmt.fast  # the per-bit map was derived: conversion runs as torch gathers
    nbits = lowvm.dtype(wtype).nbits
    codes = _codes(2 * fmt.bn, 3 * bk, nbits, seed=nbits * bk)
    packed = fmt.repack(codes)
    library = repack_weights(codes.numpy(), wtype, GemmSchedule(bk=bk))
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == library.shape
    assert np.array_equal(packed.numpy(), library)
    assert packed.numel() * 8 == codes.numel() * nbits  # dense: no padding bits
    assert torch.equal(fmt.unpack(packed, *codes.shape), codes)
    assert np.array_equal(unpack_repacked(packed.numpy(), wtype, *codes.shape,
                                          GemmSchedule(bk=bk)), codes.numpy())


@pytest.mark.parametrize("wtype,bk", [("int4", 64), ("uint3", 48), ("float6_e3m2", 16)])
def test_other_k_tiles(wtype, bk):
    fmt = kf.kernel_format(wtype, bk)
    codes = _codes(64, 4 * bk, lowvm.dtype(wtype).nbits)
    packed = fmt.repack(codes)
    assert np.array_equal(packed.numpy(), repack_weights(codes.numpy(), wtype,
                                                         GemmSchedule(bk=bk)))
    assert torch.equal(fmt.unpack(packed, 64, 4 * bk), codes)


def test_conversion_in_blocks_matches_one_block(monkeypatch):
    fmt = kf.kernel_format("int3", 64)
    codes = _codes(128, 256, 3, seed=7)
    whole = fmt.repack(codes)
    monkeypatch.setattr(kf, "_BITS_PER_BLOCK", fmt.tile_bytes * 8)  # one tile per block
    assert torch.equal(fmt.repack(codes), whole)
    assert torch.equal(fmt.unpack(whole, 128, 256), codes)


def test_fingerprints_are_stable_and_tell_formats_apart():
    a = kf.kernel_format("int4", 128)
    assert kf.KernelFormat(lowvm.int4, 128).fingerprint == a.fingerprint  # recomputed
    assert kf.kernel_format(lowvm.int4, 128) is a  # cached, by type or name
    others = {kf.kernel_format(t, bk).fingerprint
              for t, bk in [("int4", 64), ("uint4", 128), ("int3", 128), ("float4_e2m1", 128)]}
    assert len(others) == 4 and a.fingerprint not in others
    assert len(a.fingerprint) == 16 and int(a.fingerprint, 16) >= 0


def _swap_nibbles(packed: np.ndarray) -> np.ndarray:
    """Another format: the library's bytes with nibbles swapped and two bits flipped."""
    return ((packed << 4) | (packed >> 4)).astype(np.uint8) ^ np.uint8(0x81)


def _unswap_nibbles(packed: np.ndarray) -> np.ndarray:
    flipped = packed ^ np.uint8(0x81)
    return ((flipped << 4) | (flipped >> 4)).astype(np.uint8)


def test_a_changed_format_is_followed_and_changes_the_fingerprint(monkeypatch):
    """If the library stores bits elsewhere (here: nibbles swapped, two bits flipped), the
    derived torch repacker follows it and the fingerprint changes."""
    real = kf.KernelFormat(lowvm.int4, 128)
    monkeypatch.setattr(weight_format, "repack_weights",
                        lambda codes, wt, s, order=None: _swap_nibbles(
                            repack_weights(codes, wt, s, order)))
    monkeypatch.setattr(weight_format, "unpack_repacked",
                        lambda p, wt, n, k, s, order=None: unpack_repacked(
                            _unswap_nibbles(p), wt, n, k, s, order))
    changed = kf.KernelFormat(lowvm.int4, 128)
    assert changed.fast and changed.fingerprint != real.fingerprint
    codes = _codes(128, 256, 4, seed=3)
    packed = changed.repack(codes)
    expected = _swap_nibbles(repack_weights(codes.numpy(), "int4", GemmSchedule(bk=128)))
    assert np.array_equal(packed.numpy(), expected)
    assert torch.equal(changed.unpack(packed, 128, 256), codes)


def test_a_format_that_is_no_bit_map_falls_back_to_the_library(monkeypatch):
    """Codes stored plus one (carries: not a per-bit map): the check fails, and conversion
    goes through the library's numpy functions, still exact."""
    real = kf.kernel_format("uint3", 64)
    monkeypatch.setattr(weight_format, "repack_weights",
                        lambda codes, wt, s, order=None: repack_weights(
                            ((codes.astype(np.int64) + 1) % 8).astype(np.uint8), wt, s, order))
    monkeypatch.setattr(weight_format, "unpack_repacked",
                        lambda p, wt, n, k, s, order=None: ((unpack_repacked(
                            p, wt, n, k, s, order).astype(np.int64) - 1) % 8).astype(np.uint8))
    fmt = kf.KernelFormat(lowvm.uint3, 64)
    assert not fmt.fast
    assert fmt.fingerprint != real.fingerprint
    codes = _codes(64, 128, 3, seed=5)
    packed = fmt.repack(codes)
    plus_one = ((codes.numpy().astype(np.int64) + 1) % 8).astype(np.uint8)
    assert np.array_equal(packed.numpy(), repack_weights(plus_one, "uint3",
                                                         GemmSchedule(bk=64)))
    assert torch.equal(fmt.unpack(packed, 64, 128), codes)


def test_the_tile_order_is_checked(monkeypatch):
    """A library that stored N tiles before K tiles would fail the 2 x 2 tile check."""
    def n_major(codes, wt, s, order=None):
        n, k = codes.shape
        tiles = [repack_weights(codes[:, kt * s.bk:(kt + 1) * s.bk], wt, s, order)
                 for kt in range(k // s.bk)]  # each: the K tile's N tiles in order
        per_n = [np.split(t, n // s.bn) for t in tiles]
        return np.concatenate([per_n[kt][nt] for nt in range(n // s.bn)
                               for kt in range(k // s.bk)])

    monkeypatch.setattr(weight_format, "repack_weights", n_major)
    fmt = kf.KernelFormat(lowvm.int4, 32)
    assert not fmt.fast  # the fast path would put tiles in the wrong order
    codes = _codes(128, 64, 4, seed=9)
    assert np.array_equal(fmt.repack(codes).numpy(),
                          n_major(codes.numpy(), "int4", GemmSchedule(bk=32)))


def test_shapes_outside_the_tiles_are_refused():
    fmt = kf.kernel_format("int4", 128)
    with pytest.raises(QuantizationError, match="N a multiple of 64 and K of bk=128"):
        fmt.repack(torch.zeros(96, 128, dtype=torch.uint8))
    with pytest.raises(QuantizationError, match=r"has shape \(256, 16\); got \(16, 256\)"):
        fmt.unpack(torch.zeros(16, 256, dtype=torch.uint8), 64, 128)



@pytest.mark.parametrize("wtype", ["int2", "int3", "uint4", "e4m3", "int8"])
@pytest.mark.parametrize("bk", [32, 128])
def test_geometry_is_the_weight_formats(wtype, bk):
    fmt = kf.kernel_format(wtype, bk)
    library = weight_format.weight_format(wtype, bk)
    assert fmt.format is library
    assert (fmt.bn, fmt.bk, fmt.chunk, fmt.tile_bytes) == (
        library.bn, library.bk, library.chunk, library.tile_bytes)
    codes = np.zeros((2 * library.bn, 3 * bk), np.uint8)
    assert fmt.shape(*codes.shape) == library.shape(*codes.shape) == library.repack(codes).shape
