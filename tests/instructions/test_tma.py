"""mbarriers and the copy engine: exact interpreter meaning, the races and deadlocks it
reports, the build-time rules, the sm_90a code (SASS), and bit-exactness on the GPU."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import lowvm
import lowvm.lang as vm
from lowvm.interpreter.barriers import Mbarrier
from lowvm.interpreter.memory import InterpretError
from lowvm.ir import ProgramError

TILE = 64 * 64 * 2  # bytes of one float16 [64, 64] box


@vm.program(warps=4)
def ring_sum(m: vm.int32, k: vm.int32, x: vm.ptr[vm.float16], y: vm.ptr[vm.float32],
             stages: int = 2, wait: bool = True, expect: int = TILE):
    """``y[r] = sum(x[r, :])`` for 64-row blocks, x streamed through a TMA ring."""
    vm.set_grid(vm.cdiv(m, 64))
    gx = vm.global_view(x, [m, k])
    ring = vm.shared_tensor(vm.float16, [stages, 64, 64],
                            vm.tma_layout([stages, 64, 64], vm.float16))
    full = vm.mbarriers(stages)
    acc = vm.register_tensor(vm.float32, [64, 64], vm.spatial(32, 4).local(2, 16), init=0.0)
    row0 = vm.block_index(0) * 64
    steps = k // 64
    for j in range(stages):
        vm.mbarrier_expect_tx(full[j], expect)
        vm.copy_tma(ring, gx, [row0, j * 64], full[j], dst_offsets=[j, 0, 0])
    for it in vm.range(steps):
        s = it % stages
        if wait:
            vm.mbarrier_wait(full[s], (it // stages) % 2)
        t = vm.load_shared(ring, vm.spatial(32, 4).local(2, 16), offsets=[s, 0, 0],
                           shape=[64, 64])
        vm.add(acc, vm.cast(t, vm.float32), out=acc)
        vm.sync()
        with vm.if_(it + stages < steps):
            vm.mbarrier_expect_tx(full[s], expect)
            vm.copy_tma(ring, gx, [row0, (it + stages) * 64], full[s], dst_offsets=[s, 0, 0])
    vm.store_global(vm.global_view(y, [m]), vm.sum(acc, 1), [row0])


@vm.program(warps=4)
def bulk_then_store(n: vm.int32, w: vm.ptr[vm.uint8], out: vm.ptr[vm.uint8],
                    wait_store: bool = True):
    """Copy 32 rows of 128 bytes with one bulk copy, add 1 to every byte, and write the
    tile back with a tensor store (rows past ``n`` are skipped)."""
    vm.set_grid(vm.cdiv(n, 32))
    gw = vm.global_view(w, [n, 128])
    go = vm.global_view(out, [n, 128])
    tile = vm.shared_tensor(vm.uint8, [32, 128])
    done = vm.mbarriers(1)
    row0 = vm.block_index(0) * 32
    vm.mbarrier_expect_tx(done[0], 32 * 128)
    vm.copy_bulk(tile, gw, [row0, 0], [32, 128], done[0])
    vm.mbarrier_wait(done[0], 0)
    lay = vm.spatial(16, 8).local(2, 16)
    v = vm.load_shared(tile, lay)
    vm.sync()
    vm.store_shared(tile, vm.cast(vm.cast(v, vm.int32) + 1, vm.uint8), [0, 0])
    vm.store_tma(go, tile, [row0, 0])
    if wait_store:
        vm.store_tma_wait()


def _x(m: int, k: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((m, k)).astype(np.float16)


# -------------------------------------------------------------------------------------
# the interpreter


@pytest.mark.parametrize("m,k,stages", [(64, 256, 2), (96, 320, 3), (130, 128, 2)])
def test_ring_sum_matches_numpy(m, k, stages):
    x = _x(m, k)
    y = np.full(m, np.nan, np.float32)
    lowvm.interpret(ring_sum, m, k, x, y, stages=stages)
    ref = x.astype(np.float64).sum(1)
    assert np.abs(y - ref).max() < 1e-4  # float32 sums of float16 values


def test_bulk_copy_and_tensor_store_round_trip():
    n = 40  # the second block's tile reaches past n: its store skips those rows
    w = np.random.default_rng(1).integers(0, 255, (n, 128), dtype=np.uint8)
    out = np.zeros((n, 128), np.uint8)
    with pytest.raises(InterpretError, match="reaches outside"):  # a bulk copy has no bounds
        lowvm.interpret(bulk_then_store, n, w, out)
    n = 64
    w = np.random.default_rng(1).integers(0, 255, (n, 128), dtype=np.uint8)
    out = np.zeros((n, 128), np.uint8)
    lowvm.interpret(bulk_then_store, n, w, out)
    assert np.array_equal(out, (w.astype(np.int32) + 1).astype(np.uint8))


def test_a_read_before_the_wait_is_a_race():
    x = _x(64, 128)
    with pytest.raises(InterpretError, match="before an mbarrier_wait on %bar.*phase 0"):
        lowvm.interpret(ring_sum, 64, 128, x, np.zeros(64, np.float32), wait=False)


def test_a_byte_count_that_never_completes_is_a_deadlock():
    x = _x(64, 128)
    with pytest.raises(InterpretError, match=r"deadlock: .*%bar\d+\[0\].* 16 transaction bytes"):
        lowvm.interpret(ring_sum, 64, 128, x, np.zeros(64, np.float32), expect=TILE + 16)


def test_a_store_not_waited_for_is_refused_at_the_end():
    w = np.zeros((32, 128), np.uint8)
    with pytest.raises(ProgramError, match="store_tma_wait"):
        lowvm.interpret(bulk_then_store, 32, w, np.zeros_like(w), wait_store=False)


def test_mbarrier_phases_and_parity_are_the_hardwares():
    b = Mbarrier(0, "%b[0]", 2)
    assert b.done(1) and not b.done(0)  # before any phase: a wait for parity 1 returns
    b.expect(64)
    b.arrive(2)
    assert b.completed == 0 and not b.done(0)  # the bytes are still outstanding
    assert b.deliver(64) == 0 and b.completed == 1 and b.done(0) and not b.done(1)
    b.deliver(32)  # bytes before their announcement: the count goes negative
    b.arrive(1)
    b.expect(32)
    b.arrive(1)
    assert b.completed == 2 and b.done(1)
    b.arrive(4)  # arrivals beyond a phase complete the next ones
    assert b.completed == 4 and b.pending == 2


# -------------------------------------------------------------------------------------
# build-time rules


def test_a_box_not_laid_out_as_the_copy_writes_it_is_refused():
    @vm.program(warps=4)
    def bad(x: vm.ptr[vm.float16]):
        gx = vm.global_view(x, [64, 64])
        s = vm.shared_tensor(vm.float16, [64, 64], vm.shared_strided([64, 64], [72, 1]))
        bars = vm.mbarriers(1)
        vm.copy_tma(s, gx, [0, 0], bars[0])

    with pytest.raises(ProgramError,
                       match=r"not a box \[64, 64\] as the copy engine(.|\n)*tma_layout"):
        bad.build()


def test_barriers_inside_a_loop_are_refused():
    @vm.program(warps=1)
    def bad(n: vm.int32):
        for _ in vm.range(n):
            vm.mbarriers(1)

    with pytest.raises(ProgramError, match="top level"):
        bad.build()


def test_tensor_map_fields_are_innermost_first_and_checked():
    from lowvm.codegen.tensor_maps import TensorMapSpec
    from lowvm.expr import Var, as_expr
    from lowvm.runtime.errors import LaunchError
    from lowvm.runtime.tensor_map import tensor_map_fields

    m, k = Var("m"), Var("k")
    spec = TensorMapSpec("t", "x", lowvm.float16, (m, k), (k, as_expr(1)), (64, 64), 128)
    f = tensor_map_fields(spec, 0x1000, {"m": 96, "k": 320})
    assert (f.dims, f.strides, f.box, f.data_type) == ((320, 96), (640,), (64, 64), "FLOAT16")
    with pytest.raises(LaunchError, match="stride 100 along dim 0 is 200 bytes"):
        tensor_map_fields(spec, 0x1000, {"m": 96, "k": 100})
    with pytest.raises(LaunchError, match="multiple of 16"):
        tensor_map_fields(spec, 0x1008, {"m": 96, "k": 320})


# -------------------------------------------------------------------------------------
# sm_90a code


def _sass(source: str, tmp_path: Path) -> str:
    from tests.codegen.test_fast_cast import _wheel_tool

    (tmp_path / "k.cu").write_text(source)
    proc = subprocess.run(["nvcc", "-cubin", "-gencode=arch=compute_90a,code=sm_90a", "-O3",
                           "-std=c++17", "-o", "k.cubin", "k.cu"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    nvdisasm = shutil.which("nvdisasm") or _wheel_tool("nvdisasm")
    if nvdisasm is None:
        pytest.skip("no nvdisasm")
    return subprocess.run([nvdisasm, "-c", "k.cubin"], cwd=tmp_path, check=True,
                          capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("program,expected", [
    (ring_sum, {"UTMALDG", "SYNCS.ARRIVE.TRANS64", "SYNCS.PHASECHK.TRANS64.TRYWAIT"}),
    (bulk_then_store, {"UBLKCP", "UTMASTG", "SYNCS.PHASECHK.TRANS64.TRYWAIT"}),
])
def test_sass_has_the_copy_engine_and_mbarrier_instructions(program, expected, tmp_path):
    sass = _sass(lowvm.generate_cuda(program.build()).source, tmp_path)
    found = set(re.findall(r"\b(UTMA\w+|UBLKCP\w*|SYNCS[.\w]+)", sass))
    assert expected <= {f.split(".S.")[0] for f in found} | found, sorted(found)


def test_sm80_is_refused_for_mbarriers():
    from lowvm.driver import arch_for

    with pytest.raises(ProgramError, match="sm_90"):
        arch_for(lowvm.generate_cuda(ring_sum.build()), "sm_80")


# -------------------------------------------------------------------------------------
# on the GPU: bit-exact with the interpreter


@pytest.mark.gpu
@pytest.mark.parametrize("m,k,stages", [(64, 256, 2), (96, 320, 3), (200, 1024, 4)])
def test_gpu_ring_sum_matches_the_interpreter(m, k, stages):
    import torch

    x = _x(m, k, seed=m)
    want = np.zeros(m, np.float32)
    lowvm.interpret(ring_sum, m, k, x, want, stages=stages)
    kernel = lowvm.compile(ring_sum, stages=stages)
    y = torch.full((m,), float("nan"), device="cuda")
    kernel(m, k, torch.from_numpy(x).cuda(), y)
    got = y.cpu().numpy()
    # the interpreter sums in float64 and rounds once per add as the GPU does in float32;
    # the order of the final lane reduction is the GPU's: compare to float32 rounding
    assert np.abs(got - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    assert np.abs(got - x.astype(np.float64).sum(1)).max() < 1e-3


@pytest.mark.gpu
def test_gpu_bulk_copy_and_tensor_store_match_the_interpreter():
    import torch

    n = 96
    w = np.random.default_rng(2).integers(0, 255, (n, 128), dtype=np.uint8)
    want = np.zeros_like(w)
    lowvm.interpret(bulk_then_store, n, w, want)
    out = torch.zeros((n, 128), dtype=torch.uint8, device="cuda")
    lowvm.compile(bulk_then_store)(n, torch.from_numpy(w).cuda(), out)
    assert np.array_equal(out.cpu().numpy(), want)
