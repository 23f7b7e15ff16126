"""The library's quantized GEMM: repacking, the interpreter against float64, the GPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import lowvm
import lowvm.lang as vm
from lowvm.dtypes import decode
from lowvm.errors import LowvmError
from lowvm.ir import ProgramError
from lowvm.kernels.library import (
    choose_schedule,
    fits_float16,
    prepare_weight,
    quant_linear,
    quantize_to_codes,
)
from lowvm.kernels.quant_gemm import (
    GemmSchedule,
    finish_split,
    quant_gemm,
    repack_weights,
    unpack_repacked,
)
from tests.helpers.gemm import float64_reference, relative_error, split_k_counters

TYPES = ["int4", "uint4", "int3", "int2", "int8", "uint6", "float4_e2m1", "float6_e3m2",
         "float8_e4m3"]


@pytest.mark.parametrize("wtype", TYPES)
def test_repack_round_trips(wtype):
    rng = np.random.default_rng(1)
    codes, _ = quantize_to_codes(rng.standard_normal((128, 256)), wtype, 128)
    sched = GemmSchedule()
    packed = repack_weights(codes, wtype, sched)
    assert packed.dtype == np.uint8
    assert packed.size * 8 == codes.size * lowvm.dtype(wtype).nbits
    assert np.array_equal(unpack_repacked(packed, wtype, 128, 256, sched), codes)


def _interpret_gemm(wtype, sched: GemmSchedule, m: int, seed: int, k: int = 512,
                    zero_point: bool = False, bf16: bool = False) -> float:
    """Run ``quant_gemm`` (``bf16``: on bfloat16 activations) with ``sched`` in the
    interpreter on random weights of the library's format (n = 128, group 128) and return
    its error against float64; split-K buffers must come back zeroed (``finish_split``
    runs for unfused schedules)."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    n, g, wt = 128, 128, lowvm.dtype(wtype)
    adt = ml_dtypes.bfloat16 if bf16 else np.float16
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), wtype, g)
    zeros = (rng.integers(0, 1 << wt.nbits, (k // g, n)).astype(np.float16) if zero_point
             else scales)
    packed = repack_weights(codes, wtype, GemmSchedule())  # the library's one format
    x = rng.standard_normal((m, k)).astype(np.float16)
    y = np.full((m, n), np.nan, adt)
    ws = np.zeros((m, n), np.float32)
    counters = np.zeros(-(-m // sched.rows) * (n // sched.bn), np.int32)
    adtype = lowvm.bfloat16 if bf16 else lowvm.float16
    lowvm.interpret(quant_gemm.build(adtype=adtype, wtype=wt, group=g, zero_point=zero_point,
                                     schedule=sched),
                    m, n, k, x.astype(adt), packed, scales.astype(adt), zeros.astype(adt), y,
                    ws, counters)
    if sched.split > 1 and not sched.fused_split:
        lowvm.interpret(finish_split.build(adtype=adtype), m * n, ws, y)
    # split-K: the last block of each tile (or finish_split) wrote y and left the
    # workspace and the counters cleared
    assert not ws.any() and not counters.any()
    ref = float64_reference(x, codes, scales, wtype, g, zeros if zero_point else None)
    return relative_error(y, ref)


@pytest.mark.parametrize("wtype,split,m,prefetch", [
    ("int4", 1, 3, 1), ("int3", 2, 1, 2), ("float6_e3m2", 1, 17, 2), ("uint2", 2, 5, 1),
    ("int8", 1, 2, 4)])
def test_interpreter_matches_float64(wtype, split, m, prefetch):
    assert _interpret_gemm(wtype, GemmSchedule(split=split, prefetch=prefetch), m, 2) < 2e-3


@pytest.mark.parametrize("wtype,split,m,prefetch,x_steps,stages", [
    ("int4", 1, 3, 1, 4, 2), ("int3", 2, 1, 2, 2, None), ("uint2", 1, 17, 2, 4, 3),
    ("float6_e3m2", 2, 2, 1, 2, 2)])
def test_x_steps_in_the_interpreter(wtype, split, m, prefetch, x_steps, stages):
    """x copied ``x_steps`` K steps at a time, weights still ``prefetch`` steps ahead."""
    sched = GemmSchedule(split=split, prefetch=prefetch, x_steps=x_steps, stages=stages)
    assert sched.steps_per_copy == x_steps
    assert _interpret_gemm(wtype, sched, m, 15, k=1024) < 2e-3


@pytest.mark.parametrize("wtype,split,m,prefetch,l2_ahead,bn,zero_point", [
    ("int4", 1, 3, 1, 2, 64, False), ("uint4", 2, 1, 2, 1, 64, True),
    ("int3", 1, 17, 1, 4, 32, False), ("uint8", 2, 2, 1, 3, 16, True)])
def test_l2_ahead_in_the_interpreter(wtype, split, m, prefetch, l2_ahead, bn, zero_point):
    """Weights, scales and zeros asked into the L2 ahead of the loads: same sums (the
    prefetches past the block's K range are clamped to its last step)."""
    sched = GemmSchedule(bn=bn, warps_n=min(4, bn // 16), split=split, prefetch=prefetch,
                         l2_ahead=l2_ahead)
    assert _interpret_gemm(wtype, sched, m, 17, k=1024, zero_point=zero_point) < 2e-3


@pytest.mark.parametrize("wtype,split,rows,prefetch,l2_ahead,zero_point", [
    ("int4", 1, 1, 2, 4, False), ("uint4", 2, 16, 1, 2, True), ("int3", 2, 1, 4, 1, False)])
def test_l2_ahead_with_x_whole_in_the_interpreter(wtype, split, rows, prefetch, l2_ahead,
                                                   zero_point):
    """x held whole and the weights asked into the L2 ahead: the same sums."""
    sched = GemmSchedule(x_whole=1024 // split, x_rows=rows, split=split, prefetch=prefetch,
                         l2_ahead=l2_ahead)
    m = 1 if rows == 1 else 13
    assert _interpret_gemm(wtype, sched, m, 17, k=1024, zero_point=zero_point) < 2e-3


def test_l2_prefetch_of_a_weight_tile_is_one_bulk_prefetch_on_sm90():
    """The 4 KB tile of a K step is one contiguous run: on sm_90 thread 0 asks for it with
    one cp.async.bulk.prefetch.L2 (the per-sector loop stays for older GPUs)."""
    from lowvm.driver import generate_cuda

    src = generate_cuda(quant_gemm.build(wtype=lowvm.int4, group=128, schedule=GemmSchedule(
        prefetch=2, x_whole=4096, x_rows=1, l2_ahead=4))).source
    assert src.count("#if __CUDA_ARCH__ >= 900") >= 2
    assert 'cp.async.bulk.prefetch.L2.global [%0], 4096;' in src  # the weight tile
    assert 'cp.async.bulk.prefetch.L2.global [%0], 128;' in src  # its 64 scales
    assert 'prefetch.global.L2 [%0];' in src


@pytest.mark.parametrize("wtype,bm,warps_m,k_slice,split,m,zero_point,shared", [
    ("int4", 64, 1, 16, 1, 37, False, False), ("uint4", 64, 1, 32, 2, 64, True, False),
    ("int3", 64, 1, 16, 1, 5, False, True), ("float6_e3m2", 16, 1, 64, 2, 3, False, False),
    ("uint8", 32, 1, 16, 1, 20, True, True),
    # two M-warps: the B slices are replicated over them
    ("int4", 32, 2, 16, 2, 20, True, False), ("int3", 32, 2, 32, 1, 9, False, True)])
def test_k_slices_in_the_interpreter(wtype, bm, warps_m, k_slice, split, m, zero_point,
                                     shared):
    """One M-warp over bm rows, the K step's MMAs over k_slice-deep slices of x and of
    the converted weights (vm.extract), register and staged bodies."""
    sched = GemmSchedule(bm=bm, warps_m=warps_m, split=split, stages=2, k_slice=k_slice,
                         weights_shared=shared, fused_split=False)
    assert _interpret_gemm(wtype, sched, m, 19, zero_point=zero_point) < 2e-3


@pytest.mark.parametrize("wtype,split,m,prefetch,x_whole,x_rows,zero_point,fused", [
    ("int4", 1, 1, 1, 512, 1, False, True), ("uint4", 2, 3, 2, 256, 1, True, True),
    ("int3", 2, 1, 1, 384, 1, False, False),  # x_whole past the block's K range
    ("float6_e3m2", 1, 5, 2, 512, 0, False, True), ("int8", 2, 17, 1, 256, 16, False, True),
    ("uint2", 4, 16, 1, 128, 0, True, False)])
def test_x_whole_in_the_interpreter(wtype, split, m, prefetch, x_whole, x_rows, zero_point,
                                    fused):
    """x for the block's whole K range held in shared memory (no copy in the loop): one
    row read as all 16 (x_rows=1; a block per row of y, so m = 3 is three blocks) or 16
    swizzled slabs; split-K fused and through finish_split."""
    sched = GemmSchedule(split=split, prefetch=prefetch, x_whole=x_whole, x_rows=x_rows,
                         fused_split=fused)
    assert sched.rows == (x_rows or 16)
    assert _interpret_gemm(wtype, sched, m, 23, zero_point=zero_point) < 2e-3


def _unchecked(**fields) -> GemmSchedule:
    """The default schedule with ``fields``, made without GemmSchedule's own checks (which
    would refuse them): what reaches the kernel's checks from a hand-made schedule."""
    s = object.__new__(GemmSchedule)
    for f in dataclasses.fields(GemmSchedule):
        object.__setattr__(s, f.name, fields.get(f.name, f.default))
    return s


@pytest.mark.parametrize("fields,message", [
    ({"x_rows": 1}, "x_rows=1 reads one row of x as every row of the MMA tile, which needs "
                    "x_whole"),
    ({"x_rows": 4, "x_whole": 512}, "x_rows=4 must be 0 \\(bm\\), 1 or bm=16"),
    ({"x_whole": 200}, "x_whole=200 must be 0 \\(x copied per step\\) or a positive multiple "
                       "of bk=128"),
    ({"x_whole": 512, "stages": 2}, "x_whole copies x once .* stages must be off"),
    ({"x_whole": 512, "x_steps": 2, "prefetch": 2}, "x_whole copies x once"),
    ({"x_whole": 512, "weights_shared": True}, "x_whole copies x once"),
    ({"swap_ab": True}, "swap_ab computes y\\^T one row of x at a time: it needs x_rows=1"),
    ({"swap_ab": True, "x_whole": 512, "x_rows": 1, "k_slice": 32},
     "swap_ab .* got 1, 1, 32")])
def test_x_whole_options_out_of_range_are_named(fields, message):
    with pytest.raises(ProgramError, match=message):
        quant_gemm.build(wtype=lowvm.int4, group=128, schedule=_unchecked(**fields))


def test_x_whole_one_row_is_read_with_ldmatrix_and_the_loop_has_no_copy():
    """The stride-0 layout of one x row still selects ldmatrix (every row address the
    same), and the main loop keeps neither cp.async nor a barrier."""
    from lowvm.driver import generate_cuda

    src = generate_cuda(quant_gemm.build(wtype=lowvm.int4, group=128, schedule=GemmSchedule(
        split=8, prefetch=2, x_whole=512, x_rows=1))).source
    loop = src[src.index("for (int i"):]
    loop = loop[:loop.index("// %g")]  # up to the result's global views after the loop
    assert "ldmatrix.sync" in loop and "mma.sync" in loop
    assert "cp.async" not in loop and "__syncthreads" not in loop
    assert src.count("cp.async.cg.shared.global") >= 1  # the one copy, before the loop


def test_choose_schedule_holds_x_whole_where_it_fits():
    one = choose_schedule(1, 28672, 4096, 128)
    assert (one.x_whole, one.x_rows, one.rows, one.stages) == (4096, 1, 1, None)
    down = choose_schedule(1, 4096, 14336, 128)
    assert down.x_rows == 1 and down.x_whole == 14336 // down.split
    # 16 rows x 512 columns (16 KB) held from M = 9; M = 2..8 stream x (measured faster)
    held = choose_schedule(16, 1024, 4096, 128)
    assert held.x_whole == 4096 // held.split and held.x_rows == 0 and held.rows == 16
    qkv = choose_schedule(8, 6144, 4096, 128)
    assert (qkv.x_whole, qkv.split, qkv.stages) == (0, 8, None)
    assert choose_schedule(16, 28672, 4096, 128).x_whole == 0  # 16 x 4096 x 2 B: too big
    assert choose_schedule(1, 28672, 4096, 128, x_whole=False).x_whole == 0
    assert choose_schedule(64, 6144, 4096, 128).x_whole == 0
    # the weights as the MMA's A operand: where one row of x is held, and only there
    assert one.swap_ab and down.swap_ab
    assert not any(choose_schedule(m, 6144, 4096, 128).swap_ab for m in (2, 8, 16, 64))
    assert not choose_schedule(1, 28672, 4096, 128, x_whole=False).swap_ab


def test_choose_schedule_streams_x_at_split_4_for_9_to_16_rows():
    """8 < M <= 16 where 16 rows would be held whole at split 8: x streamed, split 4,
    prefetch 2 (measured faster in graphs); M <= 8, grids under a block per SM at split
    4 and shapes not split 8 keep their schedules."""
    for m in (9, 16):
        for n in (6144, 4096):
            s = choose_schedule(m, n, 4096, 128)
            assert (s.split, s.prefetch, s.stages, s.x_whole) == (4, 2, None, 0), (m, n, s)
    assert choose_schedule(8, 6144, 4096, 128).split == 8
    assert choose_schedule(16, 1024, 4096, 128).x_whole == 512  # 64 blocks at split 4
    assert choose_schedule(16, 28672, 4096, 128).split == 1
    assert choose_schedule(16, 4096, 14336, 128).split == 8


def test_choose_schedule_pipelines_streamed_x_from_two_rows():
    """Decode grids under split 8 that stream x pipeline it two stages deep from M = 2
    (measured faster than a copy waited for every iteration); M = 1 streaming x (where
    x_whole is off) keeps the waited copy."""
    for m in (2, 4, 16):
        assert choose_schedule(m, 10240, 8192, 128).stages == 2
        assert choose_schedule(m, 28672, 4096, 128).stages == 2
    assert choose_schedule(1, 10240, 8192, 128, x_whole=False).stages is None


def test_choose_schedule_converts_each_weight_once_up_to_64_rows():
    """16 < M <= 64: one M-warp over the 64 rows with K-sliced MMAs (k_slice), 16-deep
    where K >= 14336 or the grid is not split; M = 16 and M > 64 keep their schedules."""
    for k, n, depth in ((4096, 28672, 16), (4096, 6144, 32), (14336, 4096, 16),
                        (8192, 10240, 32)):
        for m in (17, 64):
            s = choose_schedule(m, n, k, 128)
            assert (s.bm, s.warps_m, s.k_slice, s.fused_split) == (64, 1, depth, False)
    assert choose_schedule(16, 6144, 4096, 128).k_slice == 0
    assert choose_schedule(65, 6144, 4096, 128).k_slice == 0


def test_choose_schedule_splits_16_ways_at_batch_1_where_x_is_held_whole():
    down = choose_schedule(1, 4096, 14336, 128)  # 64 tiles, 112 K steps
    assert (down.split, down.x_whole, down.x_rows) == (16, 896, 1)
    assert choose_schedule(1, 4096, 14336, 128, x_whole=False).split == 8
    assert choose_schedule(16, 4096, 14336, 128).split == 8
    assert choose_schedule(1, 4096, 4096, 128).split == 8  # 2 steps per block at 16: no


def test_decode_prefetch_is_a_power_of_two_with_8_steps_per_prefetched_one():
    """Streamed decode blocks prefetch 4, 2 or 1 steps of weights, the deepest dividing
    their K steps with >= 8 of them per prefetched step: 8192 x 10240 (16 steps per block)
    2, 4096 x 28672 (32) 4, and blocks of 24..31 steps 2, never 3."""
    assert choose_schedule(4, 10240, 8192, 128).prefetch == 2
    assert choose_schedule(4, 28672, 4096, 128).prefetch == 4
    assert choose_schedule(4, 24576, 6144, 128).prefetch == 2  # 48 steps at split 2: 24
    for k in (2048, 3072, 3584, 4096, 6144, 8192, 14336):
        for n in (1024, 4096, 10240, 24576, 28672):
            for m in (1, 4, 9, 16):
                for bk in (32, 64, 128):
                    s = choose_schedule(m, n, k, bk)
                    steps = k // bk // s.split
                    assert s.prefetch in (1, 2, 4) and steps % s.prefetch == 0, (m, n, k, s)


@pytest.mark.parametrize("wtype,split,m,prefetch,zero_point,fused,bf16", [
    ("int4", 1, 1, 2, False, True, False), ("uint4", 2, 3, 1, True, True, True),
    ("int3", 4, 2, 1, False, False, False), ("float4_e2m1", 1, 1, 4, False, True, True),
    ("int2", 8, 1, 1, False, True, False), ("uint8", 2, 1, 2, True, False, True),
    ("float6_e3m2", 2, 3, 2, False, True, False)])
def test_swap_ab_in_the_interpreter(wtype, split, m, prefetch, zero_point, fused, bf16):
    """y^T = q^T x^T (weights as the MMA's A operand, x as B, one row of x per block):
    the same sums as float64, with zero points, split-K fused and through finish_split,
    float16 and bfloat16."""
    sched = GemmSchedule(split=split, prefetch=prefetch, x_whole=1024 // split, x_rows=1,
                         fused_split=fused, swap_ab=True)
    assert _interpret_gemm(wtype, sched, m, 41, k=1024, zero_point=zero_point,
                           bf16=bf16) < (2e-2 if bf16 else 2e-3)


def test_swap_ab_halves_the_mmas_of_a_decode_step():
    """At batch 1 the swapped step issues one m16n8k16 per 16 weight rows (not per 8) and
    one ldmatrix.x4 per 32 of K (not per 16); the weights' conversion is the same."""
    from lowvm.driver import generate_cuda

    def step(swap):
        src = generate_cuda(quant_gemm.build(wtype=lowvm.int4, group=128, schedule=GemmSchedule(
            prefetch=1, x_whole=512, x_rows=1, swap_ab=swap))).source
        loop = src[src.index("for (int i"):]
        return loop[:loop.index("// %g")]

    plain, swapped = step(False), step(True)
    assert plain.count("mma.sync.aligned") == 16 and swapped.count("mma.sync.aligned") == 8
    assert plain.count("ldmatrix.sync") == 8 and swapped.count("ldmatrix.sync") == 4
    assert "bit-manipulation cast" in swapped


def test_split_16_with_x_whole_in_the_interpreter():
    sched = GemmSchedule(split=16, x_whole=128, x_rows=1)
    assert _interpret_gemm("int4", sched, 3, 31, k=2048) < 2e-3


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3])
def test_gpu_split_16_with_x_whole(m):
    """16 blocks per output tile (one K step each) arriving at one counter."""
    import torch

    rng = np.random.default_rng(37)
    n, k, g = 256, 2048, 128
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), "int4", g)
    qw = prepare_weight(codes, scales, "int4", g)
    x = rng.standard_normal((m, k)).astype(np.float16)
    ref = float64_reference(x, codes, scales, "int4", g)
    for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 2e-2)):
        y = quant_linear(torch.from_numpy(x).cuda().to(dtype), qw,
                         GemmSchedule(split=16, x_whole=128, x_rows=1))
        assert relative_error(y.double().cpu().numpy(), ref) < tol, dtype


def test_a_schedule_whose_x_whole_is_short_of_the_k_range_is_refused():
    import torch

    rng = np.random.default_rng(0)
    codes, scales = quantize_to_codes(rng.standard_normal((64, 1024)), "int4", 128)
    qw = prepare_weight(codes, scales, "int4", 128, device="cpu")
    x = torch.zeros(1, 1024, dtype=torch.float16)
    with pytest.raises(LowvmError, match="x_whole = 512 columns cannot hold a block's K "
                                         "range, K / split = 1024"):
        quant_linear(x, qw, GemmSchedule(x_whole=512, x_rows=1))


def test_k_slice_must_divide_the_k_step():
    with pytest.raises(ProgramError, match="k_slice=24 must be a multiple of 16 dividing bk=128"):
        quant_gemm.build(wtype=lowvm.int4, group=128, schedule=_unchecked(k_slice=24))


def test_x_steps_must_be_a_multiple_of_prefetch():
    with pytest.raises(ProgramError, match="x_steps=3 must be a multiple of prefetch=2"):
        quant_gemm.build(wtype=lowvm.int4, group=128, schedule=_unchecked(prefetch=2, x_steps=3))


@pytest.mark.parametrize("fields,message", [
    (dict(k_slice=-16), r"k_slice=-16 must be a multiple of 16 dividing bk=128"),
    (dict(x_steps=-1), r"x_steps=-1 must be 0 \(prefetch's\) or positive"),
    (dict(l2_ahead=-2), r"l2_ahead=-2 must be 0 \(none\) or positive"),
    (dict(weights_shared=True, stages=2, x_steps=2),
     r"x_steps must be 0 or 1 and l2_ahead 0, got x_steps=2, l2_ahead=0"),
    (dict(weights_shared=True, stages=2, l2_ahead=1),
     r"x_steps must be 0 or 1 and l2_ahead 0, got x_steps=0, l2_ahead=1")])
def test_schedule_options_out_of_range_are_named(fields, message):
    with pytest.raises(ProgramError, match=message):
        quant_gemm.build(wtype=lowvm.int4, group=128, schedule=_unchecked(**fields))


def test_unfused_split_k_in_the_interpreter():
    """fused_split=False: the GEMM only adds; finish_split converts and clears ws."""
    rng = np.random.default_rng(12)
    m, n, k, g = 37, 128, 512, 128
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), "int4", g)
    sched = GemmSchedule(bm=64, warps_m=2, split=2, stages=3, fused_split=False)
    packed = repack_weights(codes, "int4", sched)
    x = rng.standard_normal((m, k)).astype(np.float16)
    y = np.full((m, n), np.nan, np.float16)
    ws = np.zeros((m, n), np.float32)
    lowvm.interpret(quant_gemm.build(wtype=lowvm.int4, group=g, schedule=sched),
                    m, n, k, x, packed, scales, scales, y, ws, split_k_counters(m, n))
    assert np.isnan(y).all() and ws.any()  # the sums wait in ws for the epilogue
    lowvm.interpret(finish_split.build(), m * n, ws, y)
    assert not ws.any()
    assert relative_error(y, float64_reference(x, codes, scales, "int4", g)) < 2e-3


@pytest.mark.parametrize("wtype,bn,split,prefetch,m", [
    ("int4", 32, 1, 2, 3), ("int3", 16, 2, 1, 1), ("int8", 32, 2, 1, 17),
    ("float6_e3m2", 32, 1, 4, 2), ("uint2", 16, 1, 2, 5)])
def test_narrow_blocks_read_the_format_in_the_interpreter(wtype, bn, split, prefetch, m):
    """bn = 16/32 blocks (1/2 warps) read their warps' rows of the 64-wide format tiles."""
    rng = np.random.default_rng(13)
    n, k, g = 128, 512, 128
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), wtype, g)
    packed = repack_weights(codes, wtype, GemmSchedule())  # the library's one format
    sched = GemmSchedule(bn=bn, warps_n=bn // 16, split=split, prefetch=prefetch)
    x = rng.standard_normal((m, k)).astype(np.float16)
    y = np.full((m, n), np.nan, np.float16)
    ws = np.zeros((m, n), np.float32)
    counters = np.zeros(-(-m // 16) * (n // bn), np.int32)
    lowvm.interpret(quant_gemm.build(wtype=lowvm.dtype(wtype), group=g, schedule=sched),
                    m, n, k, x, packed, scales, scales, y, ws, counters)
    assert not ws.any() and not counters.any()
    assert relative_error(y, float64_reference(x, codes, scales, wtype, g)) < 2e-3


@pytest.mark.parametrize("wtype,split,m,stages,zero_point", [
    ("int4", 1, 3, 3, False), ("uint4", 2, 1, 2, True), ("int3", 1, 17, 4, False),
    ("float4_e2m1", 2, 2, 3, False), ("uint8", 1, 1, 2, True)])
def test_staged_weights_in_the_interpreter(wtype, split, m, stages, zero_point):
    """weights_shared: weights, scales and zeros staged through shared memory by cp.async."""
    rng = np.random.default_rng(8)
    n, k, g = 128, 512, 128
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), wtype, g)
    wt = lowvm.dtype(wtype)
    zeros = (rng.integers(0, 1 << wt.nbits, (k // g, n)).astype(np.float16) if zero_point
             else scales)
    sched = GemmSchedule(split=split, stages=stages, weights_shared=True)
    packed = repack_weights(codes, wtype, sched)
    x = rng.standard_normal((m, k)).astype(np.float16)
    y = np.full((m, n), np.nan, np.float16)
    ws = np.zeros((m, n), np.float32)
    program = quant_gemm.build(wtype=wt, group=g, zero_point=zero_point, schedule=sched)
    lowvm.interpret(program, m, n, k, x, packed, scales, zeros, y, ws, split_k_counters(m, n))
    assert not ws.any()
    ref = float64_reference(x, codes, scales, wtype, g, zeros if zero_point else None)
    assert relative_error(y, ref) < 2e-3


def test_zero_points_and_bfloat16_in_the_interpreter():
    import ml_dtypes

    rng = np.random.default_rng(4)
    m, n, k, g = 3, 64, 256, 128
    codes = rng.integers(0, 16, size=(n, k)).astype(np.uint8)
    scales = (rng.random((k // g, n)) / 8 + 0.01).astype(np.float16)
    zeros = rng.integers(0, 16, size=(k // g, n)).astype(np.float16)
    packed = repack_weights(codes, "uint4", GemmSchedule())
    x = rng.standard_normal((m, k)).astype(np.float16)
    w = (codes.astype(np.float64) - np.repeat(zeros.T, g, 1)) * np.repeat(scales.T, g, 1)
    ref = x.astype(np.float64) @ w.T
    y = np.zeros((m, n), np.float16)
    lowvm.interpret(quant_gemm.build(wtype=lowvm.uint4, group=g, zero_point=True),
                    m, n, k, x, packed, scales, zeros, y, np.zeros((m, n), np.float32),
                    split_k_counters(m, n))
    assert relative_error(y, ref) < 2e-3
    bf = ml_dtypes.bfloat16
    yb = np.zeros((m, n), bf)
    lowvm.interpret(quant_gemm.build(adtype=lowvm.bfloat16, wtype=lowvm.uint4, group=g,
                                     zero_point=True),
                    m, n, k, x.astype(bf), packed, scales.astype(bf), zeros.astype(bf), yb,
                    np.zeros((m, n), np.float32), split_k_counters(m, n))
    assert relative_error(yb.astype(np.float64), ref) < 2e-2


def test_schedule_fills_the_gpu_for_small_n():
    s = choose_schedule(1, 4096, 14336, 128)
    assert s.bm == 16 and s.split > 1 and (4096 // 64) * s.split >= 2 * 132
    big = choose_schedule(4096, 28672, 4096, 128)
    assert big.split == 1 and big.bm == 128


def test_bad_shapes_raise_lowvm_errors():
    codes = np.zeros((100, 256), np.uint8)
    with pytest.raises(LowvmError, match="multiple of 64"):
        prepare_weight(codes, np.ones((2, 100), np.float16), "int4", 128, device="cpu")
    with pytest.raises(LowvmError, match="must divide"):
        prepare_weight(np.zeros((64, 256), np.uint8), np.ones((2, 64), np.float16), "int4",
                       100, device="cpu")


def test_generated_code_uses_the_expected_instructions():
    from lowvm.driver import generate_cuda

    src = generate_cuda(quant_gemm.build(wtype=lowvm.int4, group=128)).source
    for needle in ("mma.sync.aligned.m16n8k16", "cp.async.cg.shared.global", "ldmatrix.sync",
                   "uint4", "cp.async.wait_group"):
        assert needle in src, needle


def test_one_program_per_activation_type_names_and_lists_its_specialisation():
    """The bfloat16 build is named ``quant_gemm_bf16``; the schedule is listed field by
    field (every field but ``wgmma``) after the weight's constants."""
    from dataclasses import fields

    from lowvm.driver import generate_cuda

    s = GemmSchedule(split=4, prefetch=2, fused_split=False)
    for adtype, name, c_type in ((lowvm.float16, "quant_gemm", "__half"),
                                 (lowvm.bfloat16, "quant_gemm_bf16", "__nv_bfloat16")):
        program = quant_gemm.build(adtype=adtype, wtype=lowvm.int4, group=128, schedule=s)
        assert program.name == name
        assert [str(p.type) for p in program.params if p.name in ("x", "scales", "zeros", "y")
                ] == [f"ptr<{adtype.name}>"] * 4
        listed = dict(program.constants)
        assert list(listed) == ["wtype", "group", "zero_point"] + [
            f.name for f in fields(GemmSchedule) if f.name != "wgmma"]
        assert (listed["split"], listed["prefetch"], listed["fused_split"]) == (4, 2, False)
        src = generate_cuda(program).source
        assert f"// lowvm program {name} [wtype=int4, group=128, zero_point=False, bm=16, " in src
        assert f"{c_type}* __restrict__ x" in src
    with pytest.raises(lowvm.ProgramError, match="'schedule' takes a GemmSchedule, got"):
        quant_gemm.build(schedule=s.__dict__)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 33])
def test_gpu_zero_points_and_bfloat16(m):
    import torch

    rng = np.random.default_rng(5)
    n, k, g = 256, 1024, 128
    codes = rng.integers(0, 16, size=(n, k)).astype(np.uint8)
    scales = (rng.random((k // g, n)) / 8 + 0.01).astype(np.float16)
    zeros = rng.integers(0, 16, size=(k // g, n)).astype(np.float16)
    qw = prepare_weight(codes, scales, "uint4", g, zeros=zeros)
    w = (codes.astype(np.float64) - np.repeat(zeros.T, g, 1)) * np.repeat(scales.T, g, 1)
    x = torch.randn(m, k, device="cuda", dtype=torch.float16)
    ref = x.double().cpu().numpy() @ w.T
    for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 2e-2)):
        y = quant_linear(x.to(dtype), qw)
        assert y.dtype == dtype
        assert relative_error(y.double().cpu().numpy(), ref) < tol, dtype


@pytest.mark.gpu
@pytest.mark.parametrize("wtype", TYPES)
@pytest.mark.parametrize("m", [1, 7, 16, 33, 130])
def test_gpu_matches_float64(wtype, m):
    import torch

    rng = np.random.default_rng(3)
    n, k, g = 256, 1024, 128
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), wtype, g)
    qw = prepare_weight(codes, scales, wtype, g)
    x = rng.standard_normal((m, k)).astype(np.float16)
    ref = float64_reference(x, codes, scales, wtype, g)
    for split, prefetch in ((1, 1), (2, 4 if m <= 16 else 1), (4, 2)):
        s = choose_schedule(m, n, k, qw.bk).resplit(k, split=split, prefetch=prefetch)
        y = quant_linear(torch.from_numpy(x).cuda(), qw, s)
        torch.cuda.synchronize()
        assert relative_error(y.cpu().numpy(), ref) < 2e-3, (wtype, m, split)


def _check_schedules_on_gpu(wtype, m, seed, schedules):
    """``quant_linear`` with each of ``schedules(weight)`` against float64, in f16 (when
    the type fits it) and bf16."""
    import torch

    rng = np.random.default_rng(seed)
    n, k, g = 256, 1024, 128
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), wtype, g)
    qw = prepare_weight(codes, scales, wtype, g)
    x = rng.standard_normal((m, k)).astype(np.float16)
    ref = float64_reference(x, codes, scales, wtype, g)
    for s in schedules(qw):
        for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 2e-2)):
            if dtype == torch.float16 and not fits_float16(qw.wtype):
                continue
            y = quant_linear(torch.from_numpy(x).cuda().to(dtype), qw, s)
            torch.cuda.synchronize()
            assert relative_error(y.double().cpu().numpy(), ref) < tol, (wtype, m, s, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("wtype", TYPES)
@pytest.mark.parametrize("m", [1, 16, 33])
def test_gpu_narrow_blocks_match_float64(wtype, m):
    """bn = 32 (2 warps) and 16 (1 warp) blocks on the library's format, split 1 and 2."""
    _check_schedules_on_gpu(wtype, m, 14, lambda qw: [
        dataclasses.replace(choose_schedule(m, qw.n, qw.k, qw.bk, x_whole=False), bn=bn,
                            warps_n=bn // 16,
                            split=split, prefetch=prefetch, stages=None)
        for bn, split, prefetch in ((32, 1, 4), (32, 2, 2), (16, 1, 2))])


@pytest.mark.gpu
@pytest.mark.parametrize("wtype", TYPES)
@pytest.mark.parametrize("m", [1, 16, 33])
def test_gpu_x_steps_match_float64(wtype, m):
    """x copied 2 or 4 K steps at a time (split 1 and 2, prefetch 1 and 2), weights asked
    into the L2 ahead (l2_ahead), wide and narrow blocks; K-sliced MMAs (k_slice)."""
    _check_schedules_on_gpu(wtype, m, 16, lambda qw: [
        dataclasses.replace(choose_schedule(m, qw.n, qw.k, qw.bk, x_whole=False), split=split,
                            prefetch=prefetch, x_steps=xs, stages=stages, l2_ahead=ahead,
                            bn=bn, warps_n=bn // 16)
        for split, prefetch, xs, stages, ahead, bn in (
            (1, 1, 4, 2, 0, 64), (2, 2, 4, None, 0, 64), (2, 1, 2, 3, 0, 64),
            (1, 2, 0, None, 2, 64), (2, 1, 0, 4, 4, 64), (1, 1, 0, None, 3, 32))] + [
        # x held whole (one row at m = 1, else 16-row slabs) with the L2 asked ahead
        GemmSchedule(bk=qw.bk, x_whole=qw.k, x_rows=1 if m == 1 else 0).resplit(
            qw.k, split=split, prefetch=prefetch, l2_ahead=ahead)
        for split, prefetch, ahead in ((1, 2, 4), (2, 1, 2))] + [
        dataclasses.replace(choose_schedule(m, qw.n, qw.k, qw.bk, x_whole=False), bm=bm,
                            warps_m=1,
                            split=split, k_slice=ks, stages=stages, prefetch=1,
                            weights_shared=shared, fused_split=split == 1 or m <= 16)
        for bm, split, ks, stages, shared in (
            (64, 1, 16, 3, False), (64, 2, 32, 2, False), (16, 2, 64, 4, False),
            (64, 1, 16, 3, True))])


@pytest.mark.gpu
@pytest.mark.parametrize("wtype", TYPES)
@pytest.mark.parametrize("m", [1, 3, 16])
def test_gpu_x_whole_match_float64(wtype, m):
    """x held for the block's whole K range: one row read as all 16 (a block per row of
    y: m = 3 and 16 launch 3 and 16 row blocks), with x as the MMA's A operand or as B
    (swap_ab), at splits 1/2/8 and prefetch 1/2/4, and 16 rows in swizzled slabs;
    split-K fused and unfused; f16 and bf16."""
    _check_schedules_on_gpu(wtype, m, 29, lambda qw: [
        GemmSchedule(bk=qw.bk, x_whole=qw.k, x_rows=rows, swap_ab=swap).resplit(
            qw.k, split=split, prefetch=prefetch, fused_split=fused)
        for rows, split, prefetch, fused in (
            (1, 1, 4, True), (1, 2, 2, True), (1, 8, 1, True), (1, 2, 1, False),
            (0, 2, 2, True), (0, 8, 1, True), (0, 4, 1, False))
        for swap in ((False, True) if rows == 1 else (False,))])


@pytest.mark.gpu
@pytest.mark.parametrize("wtype", TYPES)
@pytest.mark.parametrize("m", [1, 5, 16])
def test_gpu_staged_weights_match_float64(wtype, m):
    """The weights_shared decode schedules (stages 2..6, split 1/2), f16 and bf16."""
    _check_schedules_on_gpu(wtype, m, 9, lambda qw: [
        GemmSchedule(16, 64, qw.bk, 1, 4, split, stages, 1, weights_shared=True)
        for split, stages in ((1, 2), (2, 4), (1, 6))])


@pytest.mark.gpu
@pytest.mark.parametrize("group", [32, 64, 1024])  # 1024 = K: one scale per output channel
@pytest.mark.parametrize("wtype", ["int4", "int3", "float4_e2m1", "uint8"])
def test_gpu_groups_and_activation_types(group, wtype):
    import torch

    rng = np.random.default_rng(6)
    n, k = 128, 1024
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), wtype, group)
    qw = prepare_weight(codes, scales, wtype, group)
    for m in (1, 37, 300):
        x = rng.standard_normal((m, k)).astype(np.float16)
        ref = float64_reference(x, codes, scales, wtype, group)
        for dtype, tol in ((torch.float16, 2e-3), (torch.bfloat16, 2e-2)):
            y = quant_linear(torch.from_numpy(x).cuda().to(dtype), qw)
            assert y.dtype == dtype
            assert relative_error(y.double().cpu().numpy(), ref) < tol, (m, dtype)


_LOW_BIT = [t.name for t in lowvm.dtypes.all_dtypes() if t.nbits <= 8 and t.name != "int1"]


@pytest.mark.parametrize("wtype", _LOW_BIT)
def test_interpreter_every_type_group_and_activation_type(wtype):
    """Every 1..8-bit type x groups 32 / 64 / 128 / per-channel x f16 / bf16 activations."""
    import ml_dtypes

    rng = np.random.default_rng(7)
    m, n, k = 3, 64, 256
    for group in (32, 64, 128, k):
        codes, scales = quantize_to_codes(rng.standard_normal((n, k)), wtype, group)
        bk = min(128, group)
        sched = GemmSchedule(bk=bk)
        packed = repack_weights(codes, wtype, sched)
        x = rng.standard_normal((m, k)).astype(np.float16)
        ref = float64_reference(x, codes, scales, wtype, group)
        if not np.linalg.norm(ref):
            continue  # e.g. uint1 codes of an all-negative group: nothing to compare
        kernels = [(lowvm.bfloat16, ml_dtypes.bfloat16, 2e-2)]
        if fits_float16(lowvm.dtype(wtype)):  # else the library refuses f16 (tested below)
            kernels.append((lowvm.float16, np.float16, 2e-3))
        for adtype, adt, tol in kernels:
            y = np.zeros((m, n), adt)
            lowvm.interpret(quant_gemm.build(adtype=adtype, wtype=lowvm.dtype(wtype),
                                             group=group, schedule=sched),
                            m, n, k, x.astype(adt), packed, scales.astype(adt),
                            scales.astype(adt), y, np.zeros((m, n), np.float32),
                            split_k_counters(m, n))
            assert relative_error(y.astype(np.float64), ref) < tol, (group, adt)


def test_float16_activations_are_refused_for_types_beyond_float16():
    import torch

    assert not fits_float16(lowvm.dtype("float7_e5m1"))
    assert fits_float16(lowvm.int8) and fits_float16(lowvm.dtype("float8_e5m2"))
    codes, scales = quantize_to_codes(np.random.default_rng(8).standard_normal((64, 128)),
                                      "float7_e5m1", 64)
    qw = prepare_weight(codes, scales, "float7_e5m1", 64, device="cpu")
    with pytest.raises(LowvmError, match="bfloat16"):
        quant_linear(torch.zeros(2, 128, dtype=torch.float16), qw)


def test_atomic_add_refuses_wrong_types_and_replicated_tiles():
    from lowvm.ir import ProgramError
    from lowvm.layouts import reduce, spatial

    @vm.program(warps=1)
    def add_into(out: vm.ptr[vm.float32], half: vm.ptr[vm.float16], replicated: int = 0,
                 wrong_type: int = 0):
        vm.set_grid(1)
        if wrong_type:
            tile = vm.register_tensor(vm.float16, [32], vm.spatial(32), init=1.0)
            vm.atomic_add(vm.global_view(half, [32]), tile, [0])
        else:
            layout = reduce(spatial(2, 16), [0]) if replicated else spatial(32)
            size = 16 if replicated else 32
            tile = vm.register_tensor(vm.float32, [size], layout, init=1.0)
            vm.atomic_add(vm.global_view(out, [size]), tile, [0])

    out = np.zeros(32, np.float32)
    lowvm.interpret(add_into, out, np.zeros(32, np.float16))
    lowvm.interpret(add_into, out, np.zeros(32, np.float16))
    assert np.array_equal(out, np.full(32, 2.0, np.float32))  # adds, not stores
    with pytest.raises(ProgramError, match="float16 into float16"):
        add_into.build(wrong_type=1)
    with pytest.raises(ProgramError, match="replicated 2 times"):
        add_into.build(replicated=1)


def test_a_schedule_that_does_not_fit_the_weight_is_refused():
    import torch

    codes, scales = quantize_to_codes(np.random.default_rng(9).standard_normal((64, 256)),
                                      "int4", 128)
    qw = prepare_weight(codes, scales, "int4", 128, device="cpu")
    x = torch.zeros(2, 256, dtype=torch.float16)
    with pytest.raises(LowvmError, match="format"):
        quant_linear(x, qw, GemmSchedule(bk=64))
    with pytest.raises(LowvmError, match="prefetch"):
        quant_linear(x, qw, GemmSchedule(split=2, prefetch=4))
    with pytest.raises(LowvmError, match="format"):  # narrow blocks: register body only
        quant_linear(x, qw, GemmSchedule(bn=32, warps_n=2, stages=2, weights_shared=True))
    with pytest.raises(LowvmError, match="format"):  # bn must be 16 x warps_n
        quant_linear(x, qw, GemmSchedule(bn=32, warps_n=1))
    with pytest.raises(LowvmError, match="columns"):
        quant_linear(torch.zeros(2, 128, dtype=torch.float16), qw)


def test_the_library_uses_a_tuned_schedule_from_the_tuning_cache(tmp_path, monkeypatch):
    """quant_linear's planner takes the autotuner's cached pick for this GPU and shape
    when the weight's format can run it, and falls back to choose_schedule otherwise."""
    import torch

    from lowvm.tune import TuneCache, lookup
    from lowvm.tune.cache import TuneKey, schedule_to_json

    monkeypatch.setattr(lookup, "_device_name", lambda device: "Test GPU")
    rng = np.random.default_rng(13)
    n, k, g = 256, 1024, 128
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), "int4", g)
    qw = prepare_weight(codes, scales, "int4", g, device="cpu")
    cache = TuneCache(tmp_path / "tune.json")
    assert lookup.tuned_schedule(1, qw, cache) is None  # nothing tuned yet
    tuned = GemmSchedule(stages=3, split=2)
    cache.put(TuneKey.for_problem("Test GPU", "int4", g, n, k, 1),
              {**schedule_to_json(tuned), "seconds": 1e-5})
    assert lookup.tuned_schedule(1, qw, cache) == tuned
    assert lookup.tuned_schedule(1, qw, TuneCache(tmp_path / "other.json")) is None
    # a pick the repacked format cannot run (bn = 128) is ignored
    cache.put(TuneKey.for_problem("Test GPU", "int4", g, n, k, 1),
              {**schedule_to_json(GemmSchedule(bn=128)), "seconds": 1e-5})
    assert lookup.tuned_schedule(1, qw, cache) is None
    # an unreadable cache: one warning, then the built-in schedules
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    with pytest.warns(UserWarning, match="tuning cache"):
        assert lookup.tuned_schedule(1, qw, TuneCache(bad)) is None
    assert isinstance(qw.packed, torch.Tensor)


def test_split_k_buffers_are_per_stream_and_per_graph_capture(monkeypatch):
    """Eager calls on one stream share a pair; each graph capture gets its own (allocated
    and zeroed inside it), so graphs replayed in any order never see another's state."""
    from lowvm.runtime import workspaces

    where = {"stream": 7, "capture": 0}
    monkeypatch.setattr(workspaces, "stream_and_capture",
                        lambda device: (where["stream"], where["capture"]))
    monkeypatch.setattr(workspaces, "_SPLIT", {})
    monkeypatch.setattr(workspaces, "_RETIRED", [])
    import torch

    cpu = torch.device("cpu")
    eager = workspaces.split_buffers(cpu, 64 * 4096, 256)
    assert workspaces.split_buffers(cpu, 16 * 1024, 64) is eager  # smaller: the same pair
    assert not eager[0].any() and not eager[1].any()
    where["capture"] = 11
    first = workspaces.split_buffers(cpu, 16 * 1024, 64)
    assert first is not eager
    where["capture"] = 12
    second = workspaces.split_buffers(cpu, 16 * 1024, 64)
    assert second is not first and second is not eager
    grown = workspaces.split_buffers(cpu, eager[0].numel() * 4, 64)  # outgrown in capture 12
    assert grown is not second and workspaces._RETIRED == [second]  # kept: kernels use it
    where.update(stream=8, capture=0)
    assert workspaces.split_buffers(cpu, 16, 1) is not eager  # another stream


@pytest.mark.gpu
def test_gpu_split_k_in_graphs_replayed_in_any_order_and_buffers_left_clean():
    """Two captured graphs of split-K GEMMs (fused at M = 1, two-kernel at M = 40),
    replayed second-first and repeatedly, give the float64 result; eager calls leave
    every workspace and counter zeroed."""
    import torch

    from lowvm.runtime import workspaces

    rng = np.random.default_rng(14)
    n, k, g = 256, 2048, 128
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), "int4", g)
    qw = prepare_weight(codes, scales, "int4", g)
    xs = {m: torch.randn(m, k, device="cuda", dtype=torch.float16) for m in (1, 40)}
    assert all(choose_schedule(m, n, k, qw.bk).split > 1 for m in xs)
    refs = {m: float64_reference(x.cpu().numpy(), codes, scales, "int4", g) for m, x in xs.items()}
    for m, x in xs.items():  # eager first: compiles, and the per-stream pair is cleaned
        assert relative_error(quant_linear(x, qw).cpu().numpy(), refs[m]) < 2e-3
    torch.cuda.synchronize()
    assert all(not ws.any() and not c.any() for ws, c in workspaces._SPLIT.values())
    graphs, outs = {}, {}
    for m, x in xs.items():
        graphs[m] = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graphs[m]):
            outs[m] = quant_linear(x, qw)
    for _ in range(3):
        for m in (40, 1):  # the second graph first
            graphs[m].replay()
            torch.cuda.synchronize()
            assert relative_error(outs[m].cpu().numpy(), refs[m]) < 2e-3, m


@pytest.mark.gpu
@pytest.mark.parametrize("graph", [False, True])
def test_gpu_overlapped_launch_waits_for_the_kernel_that_writes_x(graph):
    """Inside overlapped_launches a GEMM starts while the kernel before it runs; it must
    still read the x that kernel writes (here a 64 MB reduction, ~30 us): eager and in a
    CUDA graph replayed with new inputs."""
    import torch

    from lowvm.kernels.library import overlapped_launches

    rng = np.random.default_rng(18)
    m, n, k, g = 1, 4096, 4096, 128
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), "int4", g)
    qw = prepare_weight(codes, scales, "int4", g)
    deq = torch.from_numpy(decode(codes, lowvm.int4).astype(np.float32)).cuda() * torch.from_numpy(
        np.repeat(scales.T.astype(np.float32), g, 1)).cuda()
    big = torch.empty(m, k, 4096, device="cuda", dtype=torch.float16)
    x = torch.zeros(m, k, device="cuda", dtype=torch.float16)
    outs = []

    def step():
        # a first call makes the split-K buffers (in a capture: the capture's own, zeroed
        # by fill kernels), so that nothing runs between the producer and the GEMM
        quant_linear(x, qw)
        torch.mean(big, dim=2, out=x)  # the producer of x, right before the GEMM
        with overlapped_launches():
            outs.append(quant_linear(x, qw))

    captured = None
    if graph:
        big.normal_()
        step()
        torch.cuda.synchronize()
        captured = torch.cuda.CUDAGraph()
        with torch.cuda.graph(captured):
            step()
        y_graph = outs[-1]
    for trial in range(3):
        big.normal_(mean=float(trial), std=4.0)
        if captured is not None:
            captured.replay()
        else:
            step()
        torch.cuda.synchronize()
        y = (y_graph if captured is not None else outs[-1]).float()
        ref = x.float() @ deq.T
        assert float((y - ref).norm() / ref.norm()) < 2e-3, trial


def test_overlap_is_dropped_for_the_call_that_casts_the_scales():
    """A first bfloat16 call casts the float16 scales right before the GEMM, which reads
    them before its wait: that launch must not overlap; later calls (cast cached) do."""
    import types

    import torch

    from lowvm.kernels import dispatch, library

    launched = []

    def gemm(*args, overlap):
        launched.append(overlap)

    gemm.cuda = types.SimpleNamespace(waits_prior_grid=True)
    qw = library.QuantWeight(torch.zeros(4, 16, dtype=torch.uint8),
                             torch.ones(1, 64, dtype=torch.float16), lowvm.int4, 128, 64, 128,
                             128)
    planner = lambda *a: (gemm, None, False)  # noqa: E731
    with library.overlapped_launches():
        for dtype in (torch.bfloat16, torch.bfloat16, torch.float16):
            dispatch._run(torch.zeros(1, 128, dtype=dtype), qw, None, planner)
    dispatch._run(torch.zeros(1, 128, dtype=torch.float16), qw, None, planner)
    assert launched == [False, True, True, False]


def test_resplit_keeps_x_whole_to_a_blocks_k_range():
    s = GemmSchedule(split=8, x_whole=512, x_rows=1).resplit(4096, split=2, prefetch=2)
    assert (s.split, s.prefetch, s.x_whole, s.x_rows) == (2, 2, 2048, 1)
    assert GemmSchedule(split=8).resplit(4096, split=2).x_whole == 0


def test_schedules_named_by_fields():
    """The benchmark scripts' field=value/... names (stages 0: none; flags 0/1)."""
    from lowvm.kernels.gemm_schedule import with_fields

    base = GemmSchedule(split=8, stages=4)
    assert with_fields(base, "") == base
    assert with_fields(base, "bm=64/warps_m=1/k_slice=16/stages=0/fused_split=0") == \
        GemmSchedule(bm=64, warps_m=1, split=8, k_slice=16, stages=None, fused_split=False)


def test_scales_in_another_activation_type_are_cast_once_and_then_returned():
    """A second bfloat16 call must get the cached bfloat16 copy, not the float16 scales
    (it did, and the launch then refused them: found by the GPU tests of x_whole)."""
    import torch

    rng = np.random.default_rng(0)
    codes, scales = quantize_to_codes(rng.standard_normal((64, 256)), "uint4", 128)
    zeros = np.full(scales.shape, 8, np.float16)
    qw = prepare_weight(codes, scales, "uint4", 128, device="cpu", zeros=zeros)
    assert qw.holds(torch.float16) and not qw.holds(torch.bfloat16)
    first = qw.for_dtype(torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in first) and qw.holds(torch.bfloat16)
    again = qw.for_dtype(torch.bfloat16)
    assert again[0] is first[0] and again[1] is first[1]
    assert qw.for_dtype(torch.float16) == (qw.scales, qw.zeros)
