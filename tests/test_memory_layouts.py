"""Shared-memory layouts (swizzles, bank conflicts), global layouts and expressions."""

from __future__ import annotations

import numpy as np
import pytest

import lowvm
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
