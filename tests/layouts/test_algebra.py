"""The layout algebra: primitives, laws (hypothesis), MMA fragments against the PTX ISA."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import lowvm
from lowvm.errors import LayoutError, LowvmError
from lowvm.layouts import (
    RegisterLayout,
    column_local,
    column_spatial,
    concat,
    local,
    mma_layouts,
    permute,
    reduce,
    spatial,
    visualize,
)

# ---------------------------------------------------------------------------------------
# primitives


def test_local_is_row_major_in_one_thread():
    lay = local(2, 3)
    assert lay.shape == (2, 3) and lay.num_threads == 1 and lay.local_size == 6
    assert [lay.logical_index(0, i) for i in range(6)] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)
    ]


def test_column_local_is_column_major():
    lay = column_local(2, 3)
    assert [lay.logical_index(0, i) for i in range(6)] == [
        (0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)
    ]


def test_spatial_and_column_spatial_number_threads():
    assert [spatial(2, 3).logical_index(t, 0) for t in range(6)] == [
        (0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)
    ]
    assert [column_spatial(2, 3).logical_index(t, 0) for t in range(6)] == [
        (0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)
    ]


def test_composition_replaces_each_element_by_a_tile():
    lay = spatial(2, 2) * local(1, 3)
    assert lay.shape == (2, 6) and lay.num_threads == 4 and lay.local_size == 3
    assert lay.logical_index(1, 2) == (0, 5)
    assert lay.logical_index(2, 0) == (1, 0)


def test_chained_form_equals_operator_form():
    assert local(2, 1).spatial(8, 4).local(1, 2) == local(2, 1) * spatial(8, 4) * local(1, 2)


def test_equal_when_they_map_the_same_way():
    assert local(2, 1) * local(1, 2) == local(2, 2)
    assert spatial(2) * spatial(3) == spatial(6)
    assert hash(spatial(2) * spatial(3)) == hash(spatial(6))
    assert permute(spatial(2, 3), [1, 0]) == column_spatial(3, 2)
    assert local(2, 2) != column_local(2, 2)
    assert len({local(4), local(2) * local(2), spatial(4)}) == 2


def test_layouts_are_immutable():
    lay = local(2, 2)
    with pytest.raises(AttributeError):
        lay.shape = (4,)  # type: ignore[misc]


def test_reduce_replicates_across_threads():
    lay = reduce(spatial(4, 8), dims=[1])
    assert lay.shape == (4,) and lay.num_threads == 32 and lay.replication == 8
    assert lay.owners((2,)) == [(t, 0) for t in range(16, 24)]
    kept = reduce(spatial(4, 8), dims=[1], keepdims=True)
    assert kept.shape == (4, 1)
    assert reduce(local(2, 3), dims=[1]) == local(2)


def test_reduce_of_mma_accumulator_rows():
    c = mma_layouts("m16n8k16", lowvm.float16).c
    rows = reduce(c, dims=[1])
    assert rows.shape == (16,) and rows.local_size == 2 and rows.replication == 4
    assert rows.owners((9,)) == [(t, 1) for t in (4, 5, 6, 7)]


def test_concat_puts_dims_side_by_side():
    lay = concat(spatial(4), local(3))
    assert lay.shape == (4, 3) and lay.num_threads == 4 and lay.local_size == 3
    assert lay == spatial(4, 1) * local(1, 3)


def test_errors_are_lowvm_errors_naming_the_value():
    with pytest.raises(LayoutError, match="0"):
        local(0, 2)
    with pytest.raises(LayoutError, match="rank"):
        local(2) * local(2, 2)
    with pytest.raises(LayoutError, match="thread 32"):
        spatial(8, 4).logical_index(32, 0)
    with pytest.raises(LowvmError, match=r"\(16, 0\)"):
        spatial(8, 4).owners((16, 0))
    with pytest.raises(LayoutError, match="permutation"):
        permute(local(2, 2), [0, 0])


# ---------------------------------------------------------------------------------------
# laws, with hypothesis

_PRIMS = (local, spatial, column_local, column_spatial)


@st.composite
def layouts(draw, rank: int = 2, max_parts: int = 3) -> RegisterLayout:
    parts = draw(st.integers(1, max_parts))
    lay = None
    for _ in range(parts):
        prim = draw(st.sampled_from(_PRIMS))
        shape = draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank))
        piece = prim(*shape)
        lay = piece if lay is None else lay * piece
    if draw(st.booleans()):
        lay = reduce(lay, [draw(st.integers(0, rank - 1))], keepdims=True)
    return lay


@settings(max_examples=150, deadline=None)
@given(layouts(), layouts(), layouts())
def test_composition_is_associative(a, b, c):
    # equality compares full tables: a rare draw of three 4096-element layouts would need
    # 6.9e10 entries (CI was once killed for memory), so keep the product small
    assume(a.num_threads * a.local_size * b.num_threads * b.local_size
           * c.num_threads * c.local_size <= 1 << 16)
    assert (a * b) * c == a * (b * c)


@settings(max_examples=150, deadline=None)
@given(layouts(), layouts())
def test_composition_multiplies_shapes_threads_and_locals(a, b):
    ab = a * b
    assert ab.shape == tuple(x * y for x, y in zip(a.shape, b.shape))
    assert ab.num_threads == a.num_threads * b.num_threads
    assert ab.local_size == a.local_size * b.local_size
    assert ab.replication == a.replication * b.replication


@settings(max_examples=150, deadline=None)
@given(layouts(max_parts=3))
def test_logical_index_and_owners_are_inverse(lay):
    seen = set()
    for t in range(lay.num_threads):
        for loc in range(lay.local_size):
            index = lay.logical_index(t, loc)
            assert (t, loc) in lay.owners(index)
            assert tuple(lay.table[t, loc]) == index
            seen.add(index)
    assert len(seen) == lay.size  # every element has an owner
    for index in itertools.product(*(range(s) for s in lay.shape)):
        owners = lay.owners(index)
        assert len(owners) == lay.replication
        assert all(lay.logical_index(t, loc) == index for t, loc in owners)


@settings(max_examples=100, deadline=None)
@given(layouts(), layouts())
def test_concat_counts(a, b):
    ab = concat(a, b)
    assert ab.shape == a.shape + b.shape
    assert ab.num_threads == a.num_threads * b.num_threads
    assert ab.local_size == a.local_size * b.local_size


# ---------------------------------------------------------------------------------------
# MMA fragments, checked against the formulas of the PTX ISA's fragment figures
# (groupID = lane >> 2, threadID_in_group = lane % 4)


def _ptx_f16_m16n8k16(operand: str, lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    if operand == "a":  # a0..a7
        row = g if i in (0, 1, 4, 5) else g + 8
        col = t * 2 + (i & 1) + (8 if i >= 4 else 0)
        return row, col
    if operand == "b":  # b0..b3
        return t * 2 + (i & 1) + (8 if i >= 2 else 0), g
    return (g if i < 2 else g + 8), t * 2 + (i & 1)  # c0..c3


def _ptx_f16_m16n8k8(operand: str, lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    if operand == "a":  # a0..a3
        return (g if i < 2 else g + 8), t * 2 + (i & 1)
    if operand == "b":  # b0, b1
        return t * 2 + i, g
    return (g if i < 2 else g + 8), t * 2 + (i & 1)


def _ptx_s8_m16n8k32(operand: str, lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    if operand == "a":  # a0..a15
        row = g if (i < 4 or 8 <= i < 12) else g + 8
        col = t * 4 + (i & 3) + (16 if i >= 8 else 0)
        return row, col
    if operand == "b":  # b0..b7
        return t * 4 + (i & 3) + (16 if i >= 4 else 0), g
    return (g if i < 2 else g + 8), t * 2 + (i & 1)


def _ptx_s8_m16n8k16(operand: str, lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    if operand == "a":  # a0..a7
        return (g if i < 4 else g + 8), t * 4 + (i & 3)
    if operand == "b":  # b0..b3
        return t * 4 + i, g
    return (g if i < 2 else g + 8), t * 2 + (i & 1)


@pytest.mark.parametrize(
    "shape, dtype, ref, sizes",
    [
        ("m16n8k16", lowvm.float16, _ptx_f16_m16n8k16, (8, 4, 4)),
        ("m16n8k16", lowvm.bfloat16, _ptx_f16_m16n8k16, (8, 4, 4)),
        ("m16n8k8", lowvm.float16, _ptx_f16_m16n8k8, (4, 2, 4)),
        ("m16n8k32", lowvm.int8, _ptx_s8_m16n8k32, (16, 8, 4)),
        ("m16n8k16", lowvm.int8, _ptx_s8_m16n8k16, (8, 4, 4)),
    ],
)
def test_mma_layouts_match_the_ptx_figures(shape, dtype, ref, sizes):
    mma = mma_layouts(shape, dtype)
    assert (mma.a.shape, mma.b.shape, mma.c.shape) == (
        (mma.m, mma.k), (mma.k, mma.n), (mma.m, mma.n)
    )
    for name, per_lane in zip("abc", sizes):
        lay = getattr(mma, name)
        assert lay.num_threads == 32 and lay.local_size == per_lane and lay.replication == 1
        for lane in range(32):
            for i in range(per_lane):
                assert lay.logical_index(lane, i) == ref(name, lane, i), (name, lane, i)


def test_mma_layouts_are_compositions_not_tables():
    mma = mma_layouts("m16n8k16", lowvm.float16)
    assert str(mma.c) == "local(2, 1).spatial(8, 4).local(1, 2)"
    assert str(mma.a) == "column_local(2, 2).spatial(8, 4).local(1, 2)"
    assert mma.accumulator_dtype == lowvm.float32


def test_mma_layouts_reject_unknown_shapes_and_types():
    with pytest.raises(LayoutError, match="m16n8k64"):
        mma_layouts("m16n8k64", lowvm.float16)
    with pytest.raises(LayoutError, match="float32"):
        mma_layouts("m16n8k16", lowvm.float32)


def test_visualize_accumulator_is_the_familiar_grid():
    text = visualize(mma_layouts("m16n8k16", lowvm.float16).c)
    lines = text.splitlines()
    assert "shape [16, 8], 32 threads, 4 per thread" in lines[0]
    grid = [line.split(":", 1)[1].split() for line in lines[2:]]
    assert len(grid) == 16 and all(len(r) == 8 for r in grid)
    assert grid[0] == ["0:0", "0:1", "1:0", "1:1", "2:0", "2:1", "3:0", "3:1"]
    assert grid[1][:2] == ["4:0", "4:1"]
    assert grid[8] == ["0:2", "0:3", "1:2", "1:3", "2:2", "2:3", "3:2", "3:3"]
    assert grid[15][-1] == "31:3"


def test_visualize_marks_replication_and_higher_ranks():
    text = visualize(reduce(spatial(4, 8), [1]))
    assert "held by 8 threads" in text
    assert visualize(local(2, 2, 2)).count("[") >= 2


def test_table_is_vectorised_logical_index():
    lay = mma_layouts("m16n8k32", lowvm.int8).a
    flat = lay.flat_table
    assert flat.shape == (32, 16)
    assert np.array_equal(np.sort(flat.ravel()), np.arange(16 * 32))
