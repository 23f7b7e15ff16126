"""``dot_shared``: ``a @ tile^T + c`` with the tile read from shared memory (wgmma on sm_90a).

CPU: the interpreter against numpy, the selection of ``wgmma`` (and of the per-element
fallback where the layouts are not its fragments), the descriptor arithmetic against the
swizzle the interpreter uses, ptxas for sm_90a (no spills), the refusal on sm_80. GPU:
the kernel against the interpreter and a float64 product.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import lowvm
import lowvm.lang as vm
from lowvm.driver import arch_for, generate_cuda
from lowvm.instructions.plans import WgmmaPlan
from lowvm.ir import ProgramError
from lowvm.layouts import permute, swizzle_128b, wgmma_layouts
from lowvm.passes import run_passes

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


@vm.program
def shared_dot(a: vm.ptr[vm.float16], x: vm.ptr[vm.float16], y: vm.ptr[vm.float32],
               m: int = 128, n: int = 64, k: int = 32, col0: int = 0, warpgroups: int = 2,
               stages: int = 0, fragments: bool = True):
    """``y[m, n] = a[m, k] @ x[0:n, col0:col0+k]^T`` for one block; ``x`` is [n, 64] in
    global memory, copied whole into a 128-byte-swizzled shared tile (``stages`` > 0:
    the same through a pipelined loop of one iteration per stage, ``stages`` steps)."""
    vm.set_warps(4 * warpgroups)
    vm.set_grid(1)
    lay = wgmma_layouts(m, n, k, warpgroups)
    a_layout, c_layout = (lay.a, lay.c) if fragments else (None, None)
    if not fragments:  # a plain row-per-thread layout: not wgmma's fragments
        threads = 128 * warpgroups
        a_layout = vm.spatial(threads, 1) * vm.local(m // threads, k) if m >= threads \
            else vm.local(m, k) * vm.spatial(1, 1)
        c_layout = vm.spatial(threads, 1) * vm.local(m // threads, n)
    ga = vm.global_view(a, [m, k])
    gx = vm.global_view(x, [max(stages, 1) * n, 64])
    gy = vm.global_view(y, [m, n])
    av = vm.load_global(ga, [0, 0], [m, k], a_layout)
    acc = vm.register_tensor(vm.float32, [m, n], c_layout, init=0.0)
    sx = vm.shared_tensor(vm.float16, [n, 64], swizzle_128b(n, 64, vm.float16))
    if stages:
        for it in vm.range(stages, stages=2):
            vm.copy_async(sx, gx, [it * n, 0])
            vm.commit_group()
            vm.wait_group(0)
            vm.sync()
            vm.dot_shared(av, sx, acc, offsets=[0, col0], shape=[n, k], out=acc)
    else:
        vm.copy_async(sx, gx, [0, 0])
        vm.commit_group()
        vm.wait_group(0)
        vm.sync()
        vm.dot_shared(av, sx, acc, offsets=[0, col0], shape=[n, k], out=acc)
    vm.store_global(gy, acc, [0, 0])
    vm.free_shared(sx)


CASES = [  # (m, n, k, col0, warpgroups, stages)
    (64, 64, 64, 0, 1, 0),
    (128, 32, 32, 32, 2, 0),
    (256, 128, 16, 48, 2, 0),
    (128, 256, 64, 0, 2, 0),
    (128, 64, 32, 16, 2, 3),
]


def _data(m, n, k, stages, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float16)
    x = rng.standard_normal((max(stages, 1) * n, 64)).astype(np.float16)
    return a, x


def _reference(a, x, n, k, col0, stages):
    a64 = a.astype(np.float64)
    total = np.zeros((a.shape[0], n))
    for s in range(max(stages, 1)):
        total += a64 @ x[s * n:(s + 1) * n, col0:col0 + k].astype(np.float64).T
    return total


@pytest.mark.parametrize("m,n,k,col0,wg,stages", CASES)
def test_interpreter_matches_numpy(m, n, k, col0, wg, stages):
    a, x = _data(m, n, k, stages)
    y = np.zeros((m, n), np.float32)
    lowvm.interpret(shared_dot, a, x, y, m=m, n=n, k=k, col0=col0, warpgroups=wg,
                    stages=stages)
    np.testing.assert_allclose(y, _reference(a, x, n, k, col0, stages), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m,n,k,col0,wg,stages", CASES)
def test_selects_wgmma_and_aligns_the_tile(m, n, k, col0, wg, stages):
    program = shared_dot.build(m=m, n=n, k=k, col0=col0, warpgroups=wg, stages=stages)
    plans = [i.impl for i in run_passes(program).instructions() if i.mnemonic == "dot_shared"]
    assert plans and all(isinstance(p, WgmmaPlan) for p in plans)
    assert plans[0].n == n and plans[0].k_slices == k // 16 and plans[0].col0 == col0
    assert plans[0].m_tiles == m // (64 * wg)
    cuda = generate_cuda(program)
    assert cuda.needs_sm90a
    assert f"wgmma.mma_async.sync.aligned.m64n{n}k16.f32.f16.f16" in cuda.source
    assert cuda.source.count("wgmma.mma_async") == (m // (64 * wg)) * (k // 16)
    assert "__align__(1024)" in cuda.source and "fence.proxy.async.shared::cta" in cuda.source
    assert arch_for(cuda, "sm_90") == "sm_90a"
    with pytest.raises(ProgramError, match="sm_90a"):
        arch_for(cuda, "sm_80")


def test_other_layouts_keep_the_per_element_code():
    """A row-per-thread a/c is not wgmma's fragments: same meaning, generic lowering."""
    m, n, k = 256, 32, 32
    program = shared_dot.build(m=m, n=n, k=k, warpgroups=2, fragments=False)
    plans = [i.impl for i in run_passes(program).instructions() if i.mnemonic == "dot_shared"]
    assert plans == [None]
    cuda = generate_cuda(program)
    assert not cuda.needs_sm90a and "wgmma" not in cuda.source.split("lowvm_wgmma_desc")[-1]
    a, x = _data(m, n, k, 0)
    y = np.zeros((m, n), np.float32)
    lowvm.interpret(shared_dot, a, x, y, m=m, n=n, k=k, warpgroups=2, fragments=False)
    np.testing.assert_allclose(y, _reference(a, x, n, k, 0, 0), rtol=1e-5, atol=1e-4)


def test_descriptor_rows_follow_the_interpreters_swizzle():
    """The hardware's 128-byte swizzle (16-byte chunk ^= address bits 7..9) on a
    1024-aligned tile of 128-byte rows is the layout the interpreter stores: so the
    descriptor (start + 32 bytes per K slice, 8-row groups 1024 bytes apart) names the
    elements the interpreter reads."""
    n = 64
    lay = swizzle_128b(n, 64, vm.float16)
    for row in range(n):
        for col in range(64):
            linear = row * 64 + col
            byte = 2 * linear
            # what the hardware computes from the descriptor of the K slice holding col
            start = 32 * (col // 16)
            addr = (row // 8) * 1024 + (row % 8) * 128 + start + 2 * (col % 16)
            hw = addr ^ (((addr >> 7) & 7) << 4)
            assert hw == 2 * int(lay.swizzle(np.array(linear))), (row, col, byte)


@pytest.mark.parametrize("mistake,match", [
    ("short k", r"shape mismatch: a \[64, 32\] @ tile\^T \(tile \[64, 16\]\)"),
    ("float32 x", "operand types float16 and float32 are not supported; accepted: both "
                  "float16, bfloat16"),
    ("no layout", "a and c need layouts"),
    ("register b", "b must be a shared tile, got RegisterTensor"),
])
def test_errors_name_the_operands(mistake, match):
    @vm.program
    def bad(a: vm.ptr[vm.float16], x: vm.ptr[vm.float16]):
        vm.set_warps(4)
        vm.set_grid(1)
        lay = wgmma_layouts(64, 64, 32, 1)
        av = vm.load_global(vm.global_view(a, [64, 32]), [0, 0], [64, 32], lay.a)
        acc = vm.register_tensor(vm.float32, [64, 64], None if mistake == "no layout"
                                 else lay.c, init=0.0)
        dt = vm.float32 if mistake == "float32 x" else vm.float16
        sx = vm.shared_tensor(dt, [64, 64], swizzle_128b(64, 64, dt))
        if mistake == "register b":
            sx = acc
        vm.dot_shared(av, sx, acc, shape=[64, 16 if mistake == "short k" else 32])

    with pytest.raises(lowvm.LowvmError, match=match):
        bad.build()


def test_the_planner_names_a_wgmma_schedule_it_refuses():
    """wgmma_quant_linear's planner raises before any GPU work, naming the value."""
    from types import SimpleNamespace

    from lowvm.kernels.dispatch import WGMMA, plan
    from lowvm.kernels.gemm_schedule import GemmSchedule

    weight = SimpleNamespace(n=4096, k=4096, bk=128, wtype=lowvm.int4, group=128)
    s = GemmSchedule(bm=100, bn=128, bk=128, warps_m=8, warps_n=1, stages=3)  # not marked
    with pytest.raises(lowvm.LowvmError, match="bm=100: the wgmma GEMM takes a multiple of 8"):
        plan(WGMMA, 64, weight, lowvm.float16, False, s)


@needs_nvcc
@pytest.mark.parametrize("m,n,k,col0,wg,stages", CASES[1:2] + CASES[3:])
def test_ptxas_sm90a_without_spills(m, n, k, col0, wg, stages):
    from lowvm.runtime import resource_usage

    cuda = generate_cuda(shared_dot.build(m=m, n=n, k=k, col0=col0, warpgroups=wg,
                                          stages=stages))
    usage = resource_usage(cuda.source, "sm_90a")[cuda.kernel_name]
    assert usage["spill_store_bytes"] == 0 and usage["spill_load_bytes"] == 0, usage


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k,col0,wg,stages", CASES)
def test_gpu_matches_interpreter_and_float64(m, n, k, col0, wg, stages):
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs sm_90a (H100/H200)")
    a, x = _data(m, n, k, stages, seed=1)
    y_ref = np.zeros((m, n), np.float32)
    lowvm.interpret(shared_dot, a, x, y_ref, m=m, n=n, k=k, col0=col0, warpgroups=wg,
                    stages=stages)
    y = torch.zeros((m, n), dtype=torch.float32, device="cuda")
    lowvm.compile(shared_dot, m=m, n=n, k=k, col0=col0, warpgroups=wg, stages=stages)(
        torch.from_numpy(a).cuda(), torch.from_numpy(x).cuda(), y)
    torch.cuda.synchronize()
    got = y.cpu().numpy()
    np.testing.assert_allclose(got, y_ref, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got, _reference(a, x, n, k, col0, stages), rtol=1e-4,
                               atol=1e-3)


def _async_program(mistake: str):
    """One dot_shared with wait=False over a staged x, with ``mistake`` made before the
    dot_wait (or none)."""
    @vm.program
    def async_dot(a: vm.ptr[vm.float16], x: vm.ptr[vm.float16], y: vm.ptr[vm.float32]):
        vm.set_warps(4)
        vm.set_grid(1)
        lay = wgmma_layouts(64, 64, 32, 1)
        src = vm.load_global(vm.global_view(a, [32, 64], [1, 32]), [0, 0], [32, 64],
                             permute(lay.a, [1, 0]))
        av = vm.transpose(src)  # a renaming: the wgmma reads src's registers
        acc = vm.register_tensor(vm.float32, [64, 64], lay.c, init=0.0)
        sx = vm.shared_tensor(vm.float16, [64, 64], swizzle_128b(64, 64, vm.float16))
        gx = vm.global_view(x, [64, 64])
        vm.copy_async(sx, gx, [0, 0])
        vm.commit_group()
        vm.wait_group(0)
        vm.sync()
        vm.dot_shared(av, sx, acc, shape=[64, 32], out=acc, wait=False)
        # the same operand again, chained into the same accumulator: allowed
        vm.dot_shared(av, sx, acc, shape=[64, 32], out=acc, wait=False)
        if mistake == "overwrite a":  # the registers the tensor cores are reading
            vm.assign(av, vm.load_global(vm.global_view(a, [64, 32]), [0, 0], [64, 32], lay.a))
        if mistake == "overwrite a's source":  # what a renames: the same registers
            vm.assign(src, vm.load_global(vm.global_view(a, [32, 64], [1, 32]), [0, 0], [32, 64],
                                          permute(lay.a, [1, 0])))
        if mistake == "read acc":
            vm.store_global(vm.global_view(y, [64, 64]), acc, [0, 0])
        if mistake == "overwrite tile":
            vm.sync()
            vm.copy_async(sx, gx, [0, 0])
            vm.commit_group()
            vm.wait_group(0)
        if mistake == "free tile":
            vm.free_shared(sx)
        if mistake != "no wait":  # (which then also leaves acc unread)
            vm.dot_wait()
            vm.store_global(vm.global_view(y, [64, 64]), acc, [0, 0])
        if mistake not in ("free tile", "no wait"):
            vm.free_shared(sx)

    return async_dot


@pytest.mark.parametrize("mistake,match", [
    ("read acc", "uses %.* while a dot_shared issued with wait=False"),
    ("overwrite a", "uses %.* while a dot_shared issued with wait=False"),
    ("overwrite a's source", "uses %.* while a dot_shared issued with wait=False"),
    ("overwrite tile", "may still be reading; vm.dot_wait"),
    ("free tile", "freed while a dot_shared issued with wait=False"),
    ("no wait", "not followed by vm.dot_wait"),
])
def test_interpreter_rejects_uses_before_dot_wait(mistake, match):
    a, x = _data(64, 64, 32, 0)
    with pytest.raises(lowvm.LowvmError, match=match):
        lowvm.interpret(_async_program(mistake), a, x, np.zeros((64, 64), np.float32))


def test_async_dots_chain_and_wait_once():
    """Two chained dots without wait, then dot_wait: the same sums; the lowering still
    waits at each call (issuing without waiting gave wrong sums on the H100), and the
    dot_wait reserves the named registers up to its own wait."""
    a, x = _data(64, 64, 32, 0)
    y = np.zeros((64, 64), np.float32)
    program = _async_program("")
    lowvm.interpret(program, a, x, y)
    np.testing.assert_allclose(y, 2 * _reference(a, x, 64, 32, 0, 0), rtol=1e-5, atol=1e-4)
    source = generate_cuda(program.build()).source
    assert source.count("wgmma.commit_group") == 2
    assert source.count("wgmma.wait_group") == 3
    assert source.index("wgmma.wait_group") > source.index("wgmma.commit_group")
