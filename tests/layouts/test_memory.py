"""Shared-memory layouts (swizzles, bank conflicts), global layouts and expressions."""

from __future__ import annotations

import numpy as np
import pytest

import lowvm
import lowvm.lang as vm
from lowvm.errors import LayoutError, LowvmError
from lowvm.expr import ExprError, Var, evaluate, free_vars, select
from lowvm.layouts import (
    global_column_major,
    global_row_major,
    global_strided,
    shared_column_major,
    shared_row_major,
    swizzle_128b,
    visualize,
)
from lowvm.layouts.shared import staged_layout


def test_shared_row_and_column_major():
    assert shared_row_major(3, 4).offset((2, 1)) == 9
    assert shared_column_major(3, 4).offset((2, 1)) == 5
    assert np.array_equal(shared_row_major(2, 3).offsets(), [[0, 1, 2], [3, 4, 5]])
    with pytest.raises(LayoutError, match=r"\(3, 0\)"):
        shared_row_major(3, 4).offset((3, 0))


@pytest.mark.parametrize("rows, cols, dt", [(8, 64, "float16"), (32, 128, "bfloat16"),
                                            (16, 128, "int8"), (8, 32, "float32")])
def test_swizzle_is_a_permutation_that_keeps_16_byte_chunks(rows, cols, dt):
    lay = swizzle_128b(rows, cols, dt)
    offs = lay.offsets()
    assert np.array_equal(np.sort(offs.ravel()), np.arange(rows * cols))
    per_chunk = 16 // (lowvm.dtype(dt).nbits // 8)
    chunks = offs.reshape(rows, cols // per_chunk, per_chunk)
    # the elements of a 16-byte chunk stay contiguous and in order, in the same row
    assert np.all(np.diff(chunks, axis=2) == 1)
    assert np.all(chunks[..., 0] // cols == np.arange(rows)[:, None])


def _banks(byte_addresses: np.ndarray) -> np.ndarray:
    """The 4-byte banks (of 32) touched by 16-byte accesses starting at the addresses."""
    words = byte_addresses[:, None] // 4 + np.arange(4)[None, :]
    return (words % 32).ravel()


def test_swizzle_makes_ldmatrix_conflict_free():
    """ldmatrix reads 8 rows x 16 bytes per phase; those must hit 32 distinct banks."""
    rows, cols = 64, 64
    plain = shared_row_major(rows, cols).offsets()
    swz = swizzle_128b(rows, cols, lowvm.float16).offsets()
    for chunk in range(cols // 8):
        for first_row in range(0, rows, 8):
            r = np.arange(first_row, first_row + 8)
            assert len(set(_banks(swz[r, chunk * 8] * 2))) == 32
            # without the swizzle every row of the phase hits the same 4 banks
            assert len(set(_banks(plain[r, chunk * 8] * 2))) == 4


def test_swizzle_rejects_bad_rows():
    with pytest.raises(LayoutError, match="cols=48"):
        swizzle_128b(8, 48, lowvm.float16)
    with pytest.raises(LayoutError, match="int4"):
        swizzle_128b(8, 256, lowvm.int4)


def test_global_layout_with_runtime_sizes():
    m, k = Var("M"), Var("K")
    lay = global_row_major(m, k)
    off = lay.offset((Var("i"), 3))
    assert evaluate(off, {"M": 5, "K": 7, "i": 2}) == 17
    assert free_vars(off) == {Var("K"), Var("i")}
    assert lay.bind({"M": 5, "K": 7}) == ((5, 7), (7, 1))
    assert global_column_major(m, k).bind({"M": 5, "K": 7})[1] == (1, 5)
    view = global_strided((4, 2), (k * 2, 1))
    assert np.array_equal(view.offsets({"K": 3})[:, 1], [1, 7, 13, 19])
    assert "0  1  2" in visualize(global_row_major(2, 3), {}) or "0 1 2" in visualize(
        global_row_major(2, 3), {}
    )


def test_expressions_fold_and_follow_c_division():
    n = Var("n")
    assert (n + 0) is n and (n * 1) is n and evaluate(n * 0) == 0
    assert evaluate(Var("a") // 2, {"a": -7}) == -3  # truncation, as in C
    assert evaluate(Var("a") % 2, {"a": -7}) == -1
    assert evaluate(select(n < 3, 10, 20), {"n": 5}) == 20
    with pytest.raises(ExprError, match="n"):
        bool(n < 3)
    with pytest.raises(LowvmError, match="'n'"):
        evaluate(n + 1, {})


# ---------------------------------------------------------------------------------------
# a shared layout with a stride-0 dim: one stored row read as every row


@vm.program(warps=1)
def broadcast_rows(x: vm.ptr[vm.float16], y: vm.ptr[vm.float16], stored_rows: int = 1,
                   by_copy: bool = True):
    """y[r, :] = x[0, :] for 16 rows, through a [16, 16] shared tile whose rows all lie
    on one row of storage (strides [0, 1])."""
    vm.set_grid(1)
    s = vm.shared_tensor(vm.float16, [16, 16], vm.shared_strided([16, 16], [0, 1]))
    gx = vm.global_view(x, [16, 16])
    if by_copy:
        vm.copy_async(s, gx, [0, 0], shape=[stored_rows, 16])
        vm.commit_group()
        vm.wait_group(0)
    else:
        vm.store_shared(s, vm.load_global(gx, [0, 0], [stored_rows, 16]))
    vm.sync()
    vm.store_global(vm.global_view(y, [16, 16]), vm.load_shared(s, vm.spatial(16, 2).local(1, 8)))


@pytest.mark.parametrize("by_copy", [True, False])
def test_a_stride_0_shared_dim_reads_one_stored_row_as_every_row(by_copy):
    x = np.random.default_rng(3).standard_normal((16, 16)).astype(np.float16)
    y = np.zeros((16, 16), np.float16)
    lowvm.interpret(broadcast_rows, x, y, by_copy=by_copy)
    assert np.array_equal(y, np.broadcast_to(x[:1], (16, 16)))


@pytest.mark.parametrize("by_copy", [True, False])
def test_writing_two_rows_onto_one_stride_0_row_raises(by_copy):
    x = np.random.default_rng(3).standard_normal((16, 16)).astype(np.float16)
    with pytest.raises(lowvm.InterpretError, match="writes two different elements of the tile "
                                                   "to one address"):
        lowvm.interpret(broadcast_rows, x, np.zeros((16, 16), np.float16), stored_rows=2,
                        by_copy=by_copy)


def test_a_stride_0_shared_tile_compiles_for_sm_80():
    src = lowvm.compile(broadcast_rows, arch="sm_80").source
    assert "cp.async" in src


def test_staged_layout_keeps_each_stage_laid_out_as_before():
    sw = vm.swizzle_128b(16, 64, vm.float16)
    staged = staged_layout(sw, 3, 16)
    offs = staged.offsets()
    stride = staged.strides[0]
    assert stride % (1 << (sw.swizzle.base + sw.swizzle.shift + sw.swizzle.bits)) == 0
    for s in range(3):
        assert np.array_equal(offs[s], s * stride + sw.offsets())
    odd = staged_layout(vm.shared_row_major(3, 5), 2, 16)  # 15 elements -> 16 (32 bytes)
    assert odd.strides == (16, 5, 1) and odd.shape == (2, 3, 5)
