"""Reductions in registers (``shuffle_plan``): the plan's structure for the layouts the
kernels use, the general path where a layout has no plan, the emitted CUDA, and on the GPU
every plan against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import lowvm
import lowvm.lang as vm
from lowvm.codegen.emitters.reduce import shuffle_plan
from lowvm.driver import generate_cuda
from lowvm.layouts import reduce
from lowvm.layouts.mma_tiling import block_mma_layouts

MMA_C_64x8 = block_mma_layouts(64, 8, 128, 4, 1, vm.float16).c  # 4 warps along rows
LAYOUTS = {
    "one_warp_16x8": vm.spatial(8, 4).local(2, 2),
    "mma_c_64x8_4warps": MMA_C_64x8,
    "rows_over_warps_32x128": vm.spatial(4, 32).local(8, 4),
    "replicated_warps_16x8": reduce(vm.spatial(4, 1), [0], keepdims=True) * vm.spatial(8, 4)
    * vm.local(2, 2),
}


def test_plan_of_the_attention_scores_layout():
    """[64, 8] mma C layout over 4 warps, reduced over rows: 2 own rows, 3 lane bits
    (lane / 4), then the 3 other warps through shared memory."""
    plan = shuffle_plan(MMA_C_64x8, reduce(MMA_C_64x8, [0], keepdims=True), 0)
    assert plan is not None
    assert [len(g) for g in plan.groups] == [2, 2]
    assert sorted(plan.lane_masks) == [4, 8, 16]
    assert sorted(plan.warp_masks) == [32, 64, 96]
    # over columns: both values of a thread, then lanes 1 and 2 (lane % 4); no warps
    plan = shuffle_plan(MMA_C_64x8, reduce(MMA_C_64x8, [1]), 1)
    assert sorted(plan.lane_masks) == [1, 2] and plan.warp_masks == ()


def test_replicated_threads_are_not_combined_twice():
    lay = LAYOUTS["replicated_warps_16x8"]
    plan = shuffle_plan(lay, reduce(lay, [0]), 0)
    assert plan is not None and plan.warp_masks == ()  # warps hold copies: nothing to add


def test_no_plan_below_a_warp():
    lay = vm.spatial(4, 4).local(4, 2)  # 16 threads
    assert shuffle_plan(lay, reduce(lay, [0]), 0) is None


def _program(layout, dim, op, keepdims):
    shape = list(layout.shape)
    out_shape = list(shape)
    out_shape[dim] = 1
    if not keepdims:
        out_shape.pop(dim)

    @vm.program(warps=layout.num_threads // 32)
    def prog(x: vm.ptr[vm.float32], y: vm.ptr[vm.float32]):
        vm.set_grid(1)
        t = vm.load_global(vm.global_view(x, shape), [0] * len(shape), shape, layout)
        vm.store_global(vm.global_view(y, out_shape), vm.reduce(t, dim, op, keepdims))

    return prog, shape, out_shape


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_emitted_code_uses_the_plan(name):
    prog, _, _ = _program(LAYOUTS[name], 0, "sum", True)
    src = generate_cuda(prog.build()).source
    assert "(registers, " in src and "(through shared scratch)" not in src
    plan = shuffle_plan(LAYOUTS[name], reduce(LAYOUTS[name], [0], keepdims=True), 0)
    assert ("__shfl_xor_sync" in src) == bool(plan.lane_masks)


CASES = [(name, dim, op, keep) for name in sorted(LAYOUTS) for dim in (0, 1)
         for op in ("sum", "max", "min") for keep in (False, True)]


@pytest.mark.parametrize("name,dim,op,keep", CASES)
def test_interpreter_agrees_with_numpy(name, dim, op, keep):
    prog, shape, out_shape = _program(LAYOUTS[name], dim, op, keep)
    x = (np.random.default_rng(3).integers(-64, 64, shape) / 8).astype(np.float32)
    y = np.zeros(out_shape, np.float32)
    lowvm.interpret(prog, x, y)
    np.testing.assert_array_equal(y, getattr(np, op)(x, axis=dim, keepdims=keep))


@pytest.mark.gpu
@pytest.mark.parametrize("name,dim,op,keep", CASES)
def test_gpu_agrees_with_numpy(name, dim, op, keep):
    import torch

    prog, shape, out_shape = _program(LAYOUTS[name], dim, op, keep)
    x = (np.random.default_rng(4).integers(-64, 64, shape) / 8).astype(np.float32)
    xt = torch.tensor(x, device="cuda")
    yt = torch.full(out_shape, np.nan, dtype=torch.float32, device="cuda")
    lowvm.compile(prog)(xt, yt)
    np.testing.assert_array_equal(yt.cpu().numpy(), getattr(np, op)(x, axis=dim, keepdims=keep))
