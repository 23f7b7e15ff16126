"""The prefill quantized GEMM: layouts, the interpreter against float64, codegen, the GPU."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import lowvm
from lowvm.ir import ProgramError
from lowvm.kernels.library import WEIGHT_BN, WEIGHT_WARPS_N, quantize_to_codes
from lowvm.kernels.quant_gemm import (
    GemmSchedule,
    deinterleave_chunks,
    repack_weights,
)
from lowvm.kernels.quant_gemm_prefill import (
    FORMAT_BN,
    FORMAT_WARPS_N,
    PREFILL_SCHEDULE,
    PREFILL_SCHEDULE_SM80,
    prefill_layouts,
    prefill_schedule_for,
    quant_gemm_prefill,
)
from lowvm.layouts import local_permutation
from tests.helpers.gemm import float64_reference, random_weights, relative_error, split_k_counters

FORMAT = GemmSchedule(bk=128)  # the repacked format prepare_weight makes for group 128


def test_format_constants_match_the_library():
    assert (FORMAT_BN, FORMAT_WARPS_N) == (WEIGHT_BN, WEIGHT_WARPS_N)


@pytest.mark.parametrize("wtype,bn,threads", [
    ("int4", 64, 512), ("int4", 128, 128), ("int3", 128, 256), ("float6_e3m2", 64, 128),
    ("int8", 64, 512), ("int8", 128, 512), ("int2", 64, 256)])
def test_each_thread_views_exactly_the_values_of_its_bytes(wtype, bn, threads):
    """Every byte is held by one thread, and the values a thread's bits decode to are the
    weights ``unpack_repacked`` puts at the value layout's (k, n)."""
    wt = lowvm.dtype(wtype)
    pl = prefill_layouts(wt, bn, 128, threads)
    assert pl.packed.replication == 1 and pl.values.replication == 1
    assert pl.packed.num_threads == pl.values.num_threads == threads
    assert pl.values.shape == (128, bn)
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 2 ** wt.nbits, size=(bn, 128)).astype(np.uint8)
    stored = repack_weights(codes, wt, FORMAT)  # [tiles * tile_rows, chunk]
    assert stored.shape == pl.packed.shape
    flat = pl.packed.table  # [T, L, 2] -> (row, byte)
    per_thread = stored[flat[..., 0], flat[..., 1]]  # each thread's bytes in local order
    vals = lowvm.dtypes.unpack(per_thread.reshape(-1), wt, pl.values.size).reshape(
        threads, -1)
    where = pl.stored.table  # (k, n) of each value, in the stored order
    assert np.array_equal(vals, codes[where[..., 1], where[..., 0]])
    # the cast to the MMA order renames each thread's registers, the same way in all
    assert local_permutation(pl.stored, pl.values) is not None
    # the format itself: deinterleaving gives the 128 format threads' streams
    assert deinterleave_chunks(stored, pl.format).shape[1] == pl.format.bytes_per_thread


def test_uneven_splits_are_program_errors():
    with pytest.raises(ProgramError, match="cannot split evenly"):
        prefill_layouts(lowvm.int3, 64, 128, 512)
    with pytest.raises(ProgramError, match="multiple of 64"):
        prefill_layouts(lowvm.int4, 96, 128, 128)


def _run(wtype, m, schedule, zero_point=False, bf16=False, seed=2):
    rng = np.random.default_rng(seed)
    n, k, g = 128, 512, 128
    wt = lowvm.dtype(wtype)
    codes, scales, zeros = random_weights(rng, wt, n, k, g, zero_point)
    packed = repack_weights(codes, wt, FORMAT)
    x = rng.standard_normal((m, k)).astype(np.float16)
    ref = float64_reference(x, codes, scales, wt, g, zeros)
    cast, adtype = np.float16, lowvm.float16
    if bf16:
        import ml_dtypes

        cast, adtype = ml_dtypes.bfloat16, lowvm.bfloat16
    y = np.full((m, n), np.nan, cast)
    ws = np.zeros((m, n), np.float32)
    zs = scales if zeros is None else zeros
    lowvm.interpret(quant_gemm_prefill.build(adtype=adtype, wtype=wt, group=g,
                                             zero_point=zero_point, schedule=schedule),
                    m, n, k, x.astype(cast), packed, scales.astype(cast), zs.astype(cast),
                    y, ws, split_k_counters(m, n))
    if schedule.split > 1:  # the last block of each tile left the workspace cleared
        assert not ws.any()
    return y, ref


_S = GemmSchedule
SCHEDULES = {
    "default": PREFILL_SCHEDULE,
    "bn64_4x4": _S(bm=128, bn=64, bk=128, warps_m=4, warps_n=4, stages=3),
    "bn128_2x4_pf2": _S(bm=64, bn=128, bk=128, warps_m=2, warps_n=4, stages=2, prefetch=2),
    "bn128_2x2": _S(bm=128, bn=128, bk=128, warps_m=2, warps_n=2, stages=3),
    "bn64_1x4_split2_pf2": _S(bm=64, bn=64, bk=128, warps_m=1, warps_n=4, split=2,
                              stages=2, prefetch=2),
    "unstaged": _S(bm=128, bn=64, bk=128, warps_m=2, warps_n=4, stages=None),
}


@pytest.mark.parametrize("wtype,sched", [
    ("int4", "default"), ("int4", "bn64_4x4"), ("int4", "bn128_2x4_pf2"),
    ("int4", "unstaged"), ("int3", "default"), ("int3", "bn128_2x2"),
    ("float6_e3m2", "default"), ("float6_e3m2", "bn64_1x4_split2_pf2"),
    ("int8", "default"), ("int8", "bn64_4x4"), ("int2", "bn64_4x4")])
def test_interpreter_matches_float64(wtype, sched):
    y, ref = _run(wtype, 37, SCHEDULES[sched])
    assert relative_error(y, ref) < 2e-3


@pytest.mark.parametrize("sched", ["default", "bn64_4x4"])
def test_zero_points_in_the_interpreter(sched):
    y, ref = _run("uint4", 37, SCHEDULES[sched], zero_point=True)
    assert relative_error(y, ref) < 2e-3


def test_group_64_uses_bk_64():
    rng = np.random.default_rng(6)
    m, n, k, g = 37, 128, 512, 64
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), "int4", g)
    packed = repack_weights(codes, "int4", GemmSchedule(bk=64))  # prepare_weight's format
    x = rng.standard_normal((m, k)).astype(np.float16)
    y = np.full((m, n), np.nan, np.float16)
    lowvm.interpret(quant_gemm_prefill.build(wtype=lowvm.int4, group=g,
                                             schedule=replace(PREFILL_SCHEDULE_SM80, bk=64)),
                    m, n, k, x, packed, scales, scales, y, np.zeros((m, n), np.float32),
                    split_k_counters(m, n))
    assert relative_error(y, float64_reference(x, codes, scales, "int4", g)) < 2e-3


def test_bfloat16_in_the_interpreter():
    y, ref = _run("uint4", 37, PREFILL_SCHEDULE, zero_point=True, bf16=True)
    assert relative_error(y.astype(np.float64), ref) < 2e-2


def test_a_wrong_value_layout_gives_a_wrong_answer():
    """The float64 comparison can fail: weights whose rows are shifted by one (values
    viewed at the wrong (k, n)) give a clearly wrong product."""
    rng = np.random.default_rng(3)
    m, n, k, g = 20, 128, 256, 128
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), "int4", g)
    packed = np.roll(repack_weights(codes, "int4", FORMAT), 1, axis=0)
    x = rng.standard_normal((m, k)).astype(np.float16)
    y = np.zeros((m, n), np.float16)
    lowvm.interpret(quant_gemm_prefill.build(wtype=lowvm.int4, group=g),
                    m, n, k, x, packed, scales, scales, y, np.zeros((m, n), np.float32),
                    split_k_counters(m, n))
    assert relative_error(y, float64_reference(x, codes, scales, "int4", g)) > 0.5


def test_selected_instructions():
    from lowvm.ir import InstStmt, walk
    from lowvm.passes import run_passes

    program = run_passes(quant_gemm_prefill.build(wtype=lowvm.int4, group=128))
    impls: dict[str, set[str]] = {}
    for st in walk(program.body):
        if isinstance(st, InstStmt):
            impls.setdefault(st.inst.mnemonic, set()).add(str(st.inst.impl))
    assert all(i.startswith("ldmatrix") for i in impls["load_shared"]), impls["load_shared"]
    assert impls["store_shared"] == {"vector 4B"}
    assert all(i.startswith("mma.sync") for i in impls["dot"])
    assert all(i.startswith("cp.async") for i in impls["copy_async"])


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("wtype,sched", [("int4", "default"), ("int4", "bn64_4x4"),
                                         ("float6_e3m2", "default")])
def test_compiles_without_spills(arch, wtype, sched):
    from lowvm.driver import generate_cuda
    from lowvm.runtime import resource_usage

    s = prefill_schedule_for(arch) if sched == "default" else SCHEDULES[sched]
    cuda = generate_cuda(quant_gemm_prefill.build(wtype=lowvm.dtype(wtype), group=128,
                                                  schedule=s))
    for needle in ("mma.sync.aligned.m16n8k16", "ldmatrix.sync", "cp.async.cg.shared.global",
                   "cp.async.wait_group"):
        assert needle in cuda.source, needle
    usage = resource_usage(cuda.source, arch)[cuda.kernel_name]
    assert usage["spill_store_bytes"] == 0 and usage["spill_load_bytes"] == 0, usage
    limit = 65536 // (s.warps_m * s.warps_n * 32)
    assert usage["registers"] <= min(255, limit), usage


# ---------------------------------------------------------------------------------------
# GPU (the lead runs these on the H100)


def _gpu_check(wtype, m, schedule, zero_point=False, n=256, k=1024):
    import torch

    from lowvm.kernels.library import prefill_quant_linear, prepare_weight

    rng = np.random.default_rng(7)
    g = 128
    wt = lowvm.dtype(wtype)
    codes, scales, zeros = random_weights(rng, wt, n, k, g, zero_point)
    qw = prepare_weight(codes, scales, wt, g, zeros=zeros)
    x = rng.standard_normal((m, k)).astype(np.float16)
    ref = float64_reference(x, codes, scales, wt, g, zeros)
    xt = torch.from_numpy(x).cuda()
    for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 2e-2)):
        y = prefill_quant_linear(xt.to(dtype), qw, schedule)
        torch.cuda.synchronize()
        assert y.dtype == dtype
        assert relative_error(y.double().cpu().numpy(), ref) < tol, (wtype, m, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("wtype", ["int4", "int3", "float6_e3m2", "int8", "int2"])
@pytest.mark.parametrize("m", [65, 130, 300])
def test_gpu_matches_float64(wtype, m):
    _gpu_check(wtype, m, None)


@pytest.mark.gpu
@pytest.mark.parametrize("sched", sorted(SCHEDULES))
def test_gpu_schedules_match_float64(sched):
    _gpu_check("int4", 257, SCHEDULES[sched])


@pytest.mark.gpu
def test_gpu_zero_points_large_shape():
    _gpu_check("uint4", 1000, None, zero_point=True, n=1024, k=2048)


# ---------------------------------------------------------------------------------------
# library entry points (CPU-checkable parts)


@pytest.mark.parametrize("wtype", ["int4", "int3", "uint4", "float6_e3m2", "int8", "int1"])
@pytest.mark.parametrize("n", [28672, 6144, 192])
def test_chosen_prefill_schedules_fit(wtype, n):
    from lowvm.kernels.library import choose_prefill_schedule
    from lowvm.kernels.quant_gemm_prefill import threads_fit

    s = choose_prefill_schedule(4096, n, 4096, 128, wtype)
    assert n % s.bn == 0 and s.bn % FORMAT_BN == 0 and s.bk == 128
    assert threads_fit(lowvm.dtype(wtype), s)
    assert (4096 // s.bk) % (s.split * s.prefetch) == 0


def test_prefill_kernel_switch_names_a_kernel():
    from lowvm.kernels import library

    assert library.PREFILL_KERNEL in ("quant_gemm", "quant_gemm_prefill")


def test_prefill_quant_linear_rejects_bad_inputs():
    torch = pytest.importorskip("torch")
    from lowvm.errors import LowvmError
    from lowvm.kernels.library import prefill_quant_linear, prepare_weight

    codes, scales = quantize_to_codes(np.zeros((64, 256), np.float32) + 1, "int4", 128)
    qw = prepare_weight(codes, scales, "int4", 128, device="cpu")
    with pytest.raises(LowvmError, match="x must be"):
        prefill_quant_linear(torch.zeros(4, 256), qw)
    with pytest.raises(LowvmError, match="columns"):
        prefill_quant_linear(torch.zeros(4, 128, dtype=torch.float16), qw)
    bad = GemmSchedule(bm=128, bn=128, bk=128, warps_m=4, warps_n=2)
    with pytest.raises(LowvmError, match="does not fit"):
        prefill_quant_linear(torch.zeros(4, 256, dtype=torch.float16), qw, bad)
    decode_only = GemmSchedule(bm=128, bn=64, bk=128, warps_m=4, warps_n=2, k_slice=16)
    with pytest.raises(LowvmError, match=r"\{'k_slice': 16\} are options of quant_gemm's "
                                         "decode body"):
        prefill_quant_linear(torch.zeros(4, 256, dtype=torch.float16), qw, decode_only)


def test_prefill_split_follows_the_measured_rule():
    """quant_gemm up to M = 128; the prefill kernel from there where its 256 x 128 tiles
    give >= 80 blocks, else with K split 2 or 4 ways while blocks keep >= 24 K steps."""
    from lowvm.kernels.library import choose_prefill_schedule, prefill_split

    assert [prefill_split(m, 28672, 4096, 128) for m in (64, 128, 129, 4096)] == [0, 0, 1, 1]
    assert prefill_split(256, 4096, 14336, 128) == 4    # 32 blocks -> 128
    assert prefill_split(256, 8192, 28672, 128) == 2    # 64 blocks -> 128
    assert prefill_split(256, 6144, 4096, 128) == 0     # split 2 would leave 16 steps
    assert prefill_split(512, 6144, 4096, 128) == 1     # 96 blocks
    s = choose_prefill_schedule(256, 4096, 14336, 128, "int4")
    assert s.split == 4 and (14336 // s.bk) % (s.split * s.prefetch) == 0
    assert choose_prefill_schedule(4096, 4096, 14336, 128, "int4").split == 1
