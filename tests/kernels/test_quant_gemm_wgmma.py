"""The Hopper (wgmma) quantized GEMM: interpreter against float64, selection, ptxas, GPU."""

from __future__ import annotations

import shutil
from dataclasses import replace

import numpy as np
import pytest

import lowvm
from lowvm.driver import generate_cuda
from lowvm.kernels.quant_gemm import GemmSchedule, repack_weights
from lowvm.kernels.quant_gemm_wgmma import WGMMA_SCHEDULE, quant_gemm_wgmma
from lowvm.passes import run_passes
from lowvm.passes.instruction_selection import WgmmaPlan
from tests.helpers.gemm import float64_reference, random_weights, relative_error, split_k_counters

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

_S = GemmSchedule
#: interpreter-sized schedules (warps_m = warpgroups x 4 warps; bn = 64 x warpgroups x tiles)
SCHEDULES = {
    "default": WGMMA_SCHEDULE,
    "bn256_bm128": _S(bm=128, bn=256, bk=128, warps_m=8, warps_n=1, stages=3),
    "wg1_bm64_split2_pf2": _S(bm=64, bn=64, bk=128, warps_m=4, warps_n=1, split=2,
                              stages=2, prefetch=2),
    "bm40_unstaged": _S(bm=40, bn=128, bk=128, warps_m=8, warps_n=1, stages=None),
    "bm128_pf2": _S(bm=128, bn=128, bk=128, warps_m=8, warps_n=1, stages=3, prefetch=2),
    # the library's decode-size schedule (M = 9..16 on large weights): K of 1024 and more
    "decode_bm16_split4_pf2": _S(bm=16, bn=64, bk=128, warps_m=4, warps_n=1, split=4,
                                 stages=2, prefetch=2),
}


def _run(wtype, m, schedule, zero_point=False, bf16=False, seed=3, n=256, k=512, g=128,
         gpu=False):
    rng = np.random.default_rng(seed)
    wt = lowvm.dtype(wtype)
    codes, scales, zeros = random_weights(rng, wt, n, k, g, zero_point)
    packed = repack_weights(codes, wt, GemmSchedule(bk=min(128, g)))
    x = rng.standard_normal((m, k)).astype(np.float16)
    ref = float64_reference(x, codes, scales, wt, g, zeros)
    cast, adtype = np.float16, lowvm.float16
    if bf16:
        import ml_dtypes

        cast, adtype = ml_dtypes.bfloat16, lowvm.bfloat16
    zs = scales if zeros is None else zeros
    consts = dict(adtype=adtype, wtype=wt, group=g, zero_point=zero_point, schedule=schedule)
    args = (x.astype(cast), packed, scales.astype(cast), zs.astype(cast))
    y = np.full((m, n), np.nan, cast)
    ws = np.zeros((m, n), np.float32)
    lowvm.interpret(quant_gemm_wgmma.build(**consts), m, n, k, *args, y, ws,
                    split_k_counters(m, n))
    if schedule.split > 1:
        assert not ws.any()
    if not gpu:
        return y, ref
    import torch

    dt = torch.bfloat16 if bf16 else torch.float16
    t = [torch.from_numpy(np.asarray(a, np.float32) if a.dtype == cast and bf16 else a)
         for a in args]
    t = [a.to("cuda", dt) if a.dtype != torch.uint8 else a.cuda() for a in t]
    out = torch.empty((m, n), dtype=dt, device="cuda")
    lowvm.compile(quant_gemm_wgmma, **consts)(
        m, n, k, *t, out, torch.zeros((m, n), dtype=torch.float32, device="cuda"),
        torch.from_numpy(split_k_counters(m, n)).cuda())
    torch.cuda.synchronize()
    return y, ref, out.float().cpu().numpy()


@pytest.mark.slow
@pytest.mark.parametrize("wtype,sched", [
    ("int4", "default"), ("int4", "bn256_bm128"), ("int4", "wg1_bm64_split2_pf2"),
    ("int4", "bm40_unstaged"), ("int3", "default"), ("float6_e3m2", "bn256_bm128"),
    ("int8", "default"), ("int2", "wg1_bm64_split2_pf2"), ("int4", "bm128_pf2")])
def test_interpreter_matches_float64(wtype, sched):
    y, ref = _run(wtype, 37, SCHEDULES[sched])
    assert relative_error(y, ref) < 2e-3


@pytest.mark.parametrize("wtype,m,zp", [("int4", 13, False), ("uint4", 9, True),
                                         ("int3", 16, False)])
def test_decode_schedule_in_the_interpreter(wtype, m, zp):
    """choose_wgmma_schedule's pick below M = 17: 16-row x tiles, split 4, prefetch 2."""
    y, ref = _run(wtype, m, SCHEDULES["decode_bm16_split4_pf2"], zero_point=zp, k=1024)
    assert relative_error(y, ref) < 2e-3


@pytest.mark.slow
def test_zero_points_bfloat16_and_group_64_in_the_interpreter():
    y, ref = _run("uint4", 37, WGMMA_SCHEDULE, zero_point=True)
    assert relative_error(y, ref) < 2e-3
    y, ref = _run("uint4", 21, WGMMA_SCHEDULE, zero_point=True, bf16=True)
    assert relative_error(y.astype(np.float64), ref) < 2e-2
    s = GemmSchedule(bm=64, bn=128, bk=64, warps_m=8, warps_n=1, stages=2)
    y, ref = _run("int4", 37, s, g=64)
    assert relative_error(y, ref) < 2e-3


@pytest.mark.parametrize("sched", sorted(SCHEDULES))
def test_every_dot_is_a_wgmma(sched):
    consts = dict(wtype=lowvm.int4, group=128, schedule=SCHEDULES[sched])
    program = run_passes(quant_gemm_wgmma.build(**consts))
    impls = [i.impl for i in program.instructions() if i.mnemonic == "dot_shared"]
    assert impls and all(isinstance(p, WgmmaPlan) for p in impls)
    assert generate_cuda(quant_gemm_wgmma.build(**consts)).needs_sm90a


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("wtype,sched", [("int4", "default"), ("int4", "bn256_bm128"),
                                         ("int3", "default"), ("int8", "default")])
def test_ptxas_sm90a_without_spills(wtype, sched):
    from lowvm.runtime import resource_usage

    cuda = generate_cuda(quant_gemm_wgmma.build(wtype=lowvm.dtype(wtype), group=128,
                                                schedule=SCHEDULES[sched]))
    usage = resource_usage(cuda.source, "sm_90a")[cuda.kernel_name]
    assert usage["spill_store_bytes"] == 0 and usage["spill_load_bytes"] == 0, usage


#: the library's four kinds of wgmma schedule (choose_wgmma_schedule)
LIBRARY_KINDS = {"256-row x tiles": WGMMA_SCHEDULE,
                 "narrow": replace(WGMMA_SCHEDULE, bm=64, bn=64, warps_m=4, stages=2,
                                   prefetch=2),
                 "32-row x tiles, split": replace(WGMMA_SCHEDULE, bm=32, split=2, prefetch=2),
                 "16-row x tiles, decode": replace(WGMMA_SCHEDULE, bm=16, bn=64, warps_m=4,
                                                   split=4, stages=2, prefetch=2)}


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("kind", sorted(LIBRARY_KINDS))
@pytest.mark.parametrize("wtype", ["int2", "int3", "uint4", "float6_e3m2", "float8_e4m3"])
def test_library_kinds_compile_without_spills_for_every_width(kind, wtype):
    from lowvm.runtime import resource_usage

    cuda = generate_cuda(quant_gemm_wgmma.build(wtype=lowvm.dtype(wtype), group=128,
                                                schedule=LIBRARY_KINDS[kind]))
    usage = resource_usage(cuda.source, "sm_90a")[cuda.kernel_name]
    assert usage["spill_store_bytes"] == 0 and usage["spill_load_bytes"] == 0, usage


@pytest.mark.gpu
@pytest.mark.parametrize("wtype,sched,m,zp,bf16", [
    ("int4", "default", 300, False, False), ("int4", "bn256_bm128", 129, False, False),
    ("int4", "wg1_bm64_split2_pf2", 37, False, False), ("int4", "bm40_unstaged", 41, False,
                                                         False),
    ("int3", "default", 77, False, False), ("int8", "default", 256, False, False),
    ("uint4", "default", 200, True, False), ("uint4", "default", 64, True, True),
    ("float6_e3m2", "bn256_bm128", 90, False, False),
    ("int4", "bm128_pf2", 200, False, False)])
def test_gpu_matches_interpreter_and_float64(wtype, sched, m, zp, bf16):
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a (H100/H200)")
    y, ref, out = _run(wtype, m, SCHEDULES[sched], zero_point=zp, bf16=bf16, gpu=True)
    tol = 2e-2 if bf16 else 2e-3
    assert relative_error(out, ref) < tol
    np.testing.assert_allclose(out, np.asarray(y, np.float32), rtol=2e-2, atol=2e-2)


def test_library_schedule_rule():
    """choose_wgmma_schedule: x tiles of 32 / 64 / 128 / 256 rows by M, 128 rows where 256
    would leave under 80 blocks; K split up to two blocks per SM (>= 16 steps each) for
    tiles of <= 64 rows, to 80 blocks for larger ones; narrow tiles (64 x 64 on one
    warpgroup, unsplit) where 128-row weight tiles leave under one wave at M > 32 and
    K <= 16384; None for K tiles under 64."""
    from lowvm.kernels.library import choose_wgmma_schedule

    def pick(m, n, k):
        s = choose_wgmma_schedule(m, n, k, 128, lowvm.int4)
        return s.bm, s.bn, s.split, s.prefetch

    assert pick(64, 28672, 4096) == (64, 128, 1, 2)      # 224 blocks
    assert pick(32, 28672, 4096) == (32, 128, 1, 2)
    assert pick(32, 6144, 4096) == (32, 128, 2, 2)       # 48 -> 96 (no narrow tiles <= 32)
    assert pick(64, 6144, 4096) == (64, 64, 1, 2)        # narrow: 96 blocks of 64 rows
    assert pick(64, 8192, 28672) == (64, 128, 4, 2)      # K > 16384: 64 -> 256 by split
    assert pick(256, 6144, 4096) == (64, 64, 1, 2)       # narrow: 4 x 96 blocks
    assert pick(256, 4096, 14336) == (64, 64, 1, 2)
    assert pick(256, 8192, 28672) == (128, 128, 1, 2)    # 32 blocks of 256 rows -> 128
    assert pick(256, 28672, 4096) == (256, 128, 1, 1)
    assert pick(4096, 28672, 4096) == (256, 128, 1, 1)
    assert pick(4096, 4096, 4096) == (256, 128, 1, 1)    # 512 blocks: no narrow tiles
    s = choose_wgmma_schedule(300, 6144 + 64, 4096, 128, lowvm.int4)  # N not a multiple of 128
    assert (s.bn, s.warps_m) == (64, 4)
    assert pick(16, 10240, 8192) == (16, 64, 4, 2)       # decode sizes: one warpgroup
    assert pick(9, 8192, 28672) == (16, 64, 4, 2)
    assert pick(12, 8192, 8320) == (16, 64, 1, 1)        # 65 K steps: no split, no prefetch
    assert choose_wgmma_schedule(64, 4096, 4096, 32, lowvm.int4) is None
    assert choose_wgmma_schedule(64, 4096, 4096, 64, lowvm.int3).bk == 64


def test_library_dispatch_rule():
    """quant_linear's kernel by M (on sm_90): quant_gemm up to M = 16 (from M = 9 wgmma
    where K and N are both >= 8192 and K >= 16384), wgmma from 17 to 32, at 33..64 on
    weights of >= 1e8 elements or where narrow tiles apply with K <= 8192, wgmma above
    64."""
    from types import SimpleNamespace

    from lowvm.kernels.library import runs_wgmma

    def weight(k, n, bk=128):
        return SimpleNamespace(n=n, k=k, bk=bk, wtype=lowvm.int4)

    big, small = weight(4096, 28672), weight(4096, 6144)
    assert [runs_wgmma(m, big) for m in (16, 17, 32, 64, 65, 4096)] == [False] + [True] * 5
    assert [runs_wgmma(m, small) for m in (16, 17, 32, 33, 64, 65)] == [False] + [True] * 5
    deep = weight(14336, 4096)  # 5.9e7 elements, K over 8192: quant_gemm at 33..64
    assert [runs_wgmma(m, deep) for m in (32, 33, 64, 65)] == [True, False, False, True]
    assert not runs_wgmma(256, weight(4096, 4096, bk=32))
    wide, deep_wide = weight(8192, 10240), weight(28672, 8192)
    assert [runs_wgmma(m, wide) for m in (1, 8, 9, 16, 17)] == [False] * 4 + [True]
    assert [runs_wgmma(m, deep_wide) for m in (8, 9, 16)] == [False, True, True]
    assert not any(runs_wgmma(m, w) for m in (9, 16) for w in (big, small, deep))


@pytest.mark.gpu
@pytest.mark.parametrize("m,dtype,n,k", [
    (17, "float16", 384, 1024), (32, "bfloat16", 384, 1024), (300, "float16", 384, 1024),
    # decode sizes on a weight with K and N >= 8192 and K >= 16384
    # (wgmma_decode_min_m, _dim and _k)
    (9, "float16", 8192, 16384), (16, "bfloat16", 8192, 16384)])
def test_quant_linear_runs_wgmma_on_sm90(m, dtype, n, k):
    """Where runs_wgmma says so on sm_90, quant_linear runs the wgmma plan; results match
    float64."""
    import torch

    from lowvm.kernels import dispatch
    from lowvm.kernels.library import prepare_weight, quant_linear, quantize_to_codes

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a (H100/H200)")
    rng = np.random.default_rng(9)
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), "int4", 128)
    qw = prepare_weight(codes, scales, "int4", 128)
    x = torch.from_numpy(rng.standard_normal((m, k)).astype(np.float32)).cuda().to(
        getattr(torch, dtype))
    before = len([key for key in dispatch._PLANS if key[0] == dispatch.WGMMA])
    y = quant_linear(x, qw)
    torch.cuda.synchronize()
    assert len([key for key in dispatch._PLANS if key[0] == dispatch.WGMMA]) == before + 1
    ref = float64_reference(x.float().cpu().numpy(), codes, scales, lowvm.int4, 128)
    assert relative_error(y.float().cpu().numpy(), ref) < (2e-2 if dtype == "bfloat16" else 2e-3)
