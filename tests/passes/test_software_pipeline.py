"""Software pipelining (``vm.range(..., stages=S)``) and the rank-reducing shared accesses
it is built on: same results as the loop as written, no races, the expected prologue,
waits and groups in flight, clear errors for loops it cannot pipeline, CUDA that
compiles."""

from __future__ import annotations

import dataclasses
import re
import shutil

import numpy as np
import pytest

import lowvm
import lowvm.lang as vm
from lowvm.instructions import CommitGroup, CopyAsync, LoadShared, Sync, WaitGroup
from lowvm.interpreter.state import BlockState
from lowvm.ir import ForStmt, IfStmt, InstStmt, SeqStmt, walk
from lowvm.kernels.matmul_f16 import matmul_f16
from lowvm.kernels.quant_matmul import quant_matmul, quantize_weights
from lowvm.passes import PIPELINE
from lowvm.passes.rewrite import map_statements
from lowvm.passes.software_pipeline import pipeline_loops

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
RNG = np.random.default_rng(7)


def _flat(stmt):
    if isinstance(stmt, SeqStmt):
        return [s for inner in stmt.stmts for s in _flat(inner)]
    return [stmt]


def _top(program):
    """The top-level statements of a program's body (nested sequences flattened)."""
    return _flat(program.body)


def _loops(program):
    return [s for s in walk(program.body) if isinstance(s, ForStmt)]


def _insts(stmt, kind):
    return [s.inst for s in walk(stmt) if isinstance(s, InstStmt) and isinstance(s.inst, kind)]


# ---------------------------------------------------------------------------------------
# the kernels: pipelined == as written, bit for bit


def _matmul(m, n, k, a, b, stages):
    c = np.full((m, n), np.nan, np.float16)
    lowvm.interpret(matmul_f16, m, n, k, a, b, c, stages=stages)
    return c


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("trips", ["fewer", "equal", "more"])
def test_matmul_f16_pipelined_equals_unpipelined(stages, trips):
    bk = 32
    k = {"fewer": bk * (stages - 1) - 5, "equal": bk * stages, "more": bk * (stages + 2) + 7}
    k = k[trips]
    m, n = 40, 70
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((k, n)).astype(np.float16)
    plain = _matmul(m, n, k, a, b, None)
    piped = _matmul(m, n, k, a, b, stages)
    assert not np.isnan(plain).any()
    assert np.array_equal(piped, plain)  # the same arithmetic in the same order


@pytest.mark.parametrize("stages", [2, 4])
def test_matmul_f16_pipelined_zero_trips(stages):
    m, n = 8, 8
    a, b = np.zeros((m, 0), np.float16), np.zeros((0, n), np.float16)
    assert np.array_equal(_matmul(m, n, 0, a, b, stages), np.zeros((m, n), np.float16))


def _quant(m, n, k, wtype, group, stages, seed):
    rng = np.random.default_rng(seed)
    packed, scales = quantize_weights(rng.standard_normal((n, k)), wtype, group)
    x = rng.standard_normal((m, k)).astype(np.float16)
    y = np.full((m, n), np.nan, np.float16)
    lowvm.interpret(quant_matmul, m, n, k, x, packed, scales, y, wtype=lowvm.dtype(wtype),
                    group=group, stages=stages)
    return y


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("trips", ["fewer", "equal", "more"])
@pytest.mark.parametrize("wtype", ["int4", "int3"])
def test_quant_matmul_pipelined_equals_unpipelined(stages, trips, wtype):
    bk = 64
    trip_count = {"fewer": max(1, stages - 1), "equal": stages, "more": stages + 2}[trips]
    k, m, n = bk * trip_count, 19, 64
    plain = _quant(m, n, k, wtype, 64, None, seed=stages)
    piped = _quant(m, n, k, wtype, 64, stages, seed=stages)
    assert not np.isnan(plain).any()
    assert np.array_equal(piped, plain)


# ---------------------------------------------------------------------------------------
# the rewritten IR: prologue, waits, staged tiles, groups in flight


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_rewritten_matmul_has_prologue_wait_and_drain(stages):
    plain = matmul_f16.build()
    program = matmul_f16.build(stages=stages)
    top = _top(program)
    (loop,) = _loops(program)
    at = top.index(loop)
    before = [s for s in top[:at] if not isinstance(s, InstStmt) or
              isinstance(s.inst, (CommitGroup, CopyAsync))]
    # prologue: S - 1 guarded issues, each closed by its own commit
    assert len(before) == 2 * (stages - 1)
    assert all(isinstance(s, IfStmt) for s in before[0::2])
    assert all(isinstance(s.inst, CommitGroup) for s in before[1::2])
    for j, guard in enumerate(before[0::2]):
        copies = _insts(guard, CopyAsync)
        assert len(copies) == 2 and all(str(c.dst_offsets[0]) == str(j) for c in copies)
    # steady state: wait S-2 then sync, one refill + commit, loads of the current stage
    waits = _insts(loop.body, WaitGroup)
    assert [w.n for w in waits] == [stages - 2]
    assert len(_insts(loop.body, CommitGroup)) == 1
    assert len(_insts(loop.body, CopyAsync)) == 2
    loads = _insts(loop.body, LoadShared)
    assert len(loads) == 2 and all(ld.src.shape[0] == stages for ld in loads)
    assert loop.stages is None  # the pass does not run twice
    # one barrier per iteration: the body's closing sync moved after the drain
    assert len(_insts(loop.body, Sync)) == 1
    after = [s.inst for s in top[at + 1:] if isinstance(s, InstStmt)]
    assert isinstance(after[0], WaitGroup) and after[0].n == 0
    assert isinstance(after[1], Sync)
    # every copied tile is staged S times, and the budget is counted
    assert program.shared_bytes == stages * plain.shared_bytes
    assert pipeline_loops(program) is program


def test_closing_sync_stays_when_another_shared_tile_needs_it():
    """quant_matmul stores its dequantised weights to a single-buffered shared tile
    before the wait: the body's closing sync still protects it from the next store."""
    for stages in (None, 3):
        program = quant_matmul.build(wtype=lowvm.int4, group=64, stages=stages)
        (loop,) = _loops(program)
        assert len(_insts(loop.body, Sync)) == 2
        assert [w.n for w in _insts(loop.body, WaitGroup)] == [0 if stages is None else 1]


def test_commit_groups_in_flight_at_each_wait(monkeypatch):
    """Before every steady-state wait exactly S - 1 groups are pending (empty ones past
    the end included), and wait_group(S-2) completes exactly one: the tile consumed next."""
    stages, trips = 3, 5
    seen: list[tuple[int, int]] = []
    original = BlockState.wait_group

    def spy(self, n):
        seen.append((len(self.groups), n))
        original(self, n)

    monkeypatch.setattr(BlockState, "wait_group", spy)
    m, n, k = 16, 16, 32 * trips
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((k, n)).astype(np.float16)
    _matmul(m, n, k, a, b, stages)
    assert seen[:trips] == [(stages - 1, stages - 2)] * trips
    assert seen[trips] == (stages - 1, 0)  # the drain (the last S - 1 groups are empty)
    assert len(seen) == trips + 1  # one block


def test_stages_one_and_none_leave_the_loop_as_written():
    for stages in (None, 1):
        program = matmul_f16.build(stages=stages)
        (loop,) = _loops(program)
        assert [w.n for w in _insts(loop.body, WaitGroup)] == [0]
        assert all(c.dst.rank == 2 for c in _insts(program.body, CopyAsync))


def test_pass_is_registered_in_the_pipeline():
    assert ("software_pipeline", pipeline_loops) in PIPELINE


# ---------------------------------------------------------------------------------------
# the race detector watches the staged tiles


def _mutate(program, fn):
    return dataclasses.replace(program, body=map_statements(program.body, fn))


def _run_matmul_program(program, k=96):
    m, n = 16, 16
    a = RNG.standard_normal((m, k)).astype(np.float16)
    b = RNG.standard_normal((k, n)).astype(np.float16)
    c = np.zeros((m, n), np.float16)
    lowvm.interpret(program, m, n, k, a, b, c)


def test_race_detector_catches_a_pipeline_without_its_barrier():
    program = matmul_f16.build(stages=3)
    _run_matmul_program(program)  # the pass's program is clean

    def drop_first_sync(stmt):
        if isinstance(stmt, ForStmt):
            stmts = list(stmt.body.stmts)
            first = next(i for i, s in enumerate(stmts)
                         if isinstance(s, InstStmt) and isinstance(s.inst, Sync))
            return dataclasses.replace(stmt, body=SeqStmt(tuple(stmts[:first] +
                                                                stmts[first + 1:])))
        return None

    with pytest.raises(lowvm.InterpretError, match="before a sync"):
        _run_matmul_program(_mutate(program, drop_first_sync))


def test_race_detector_catches_a_refill_before_the_consumers_are_done():
    program = matmul_f16.build(stages=2)

    def refill_first(stmt):
        # move the refill (guarded copies + commit) to the top of the loop body, before
        # the wait + sync that separates it from the previous iteration's readers
        if isinstance(stmt, ForStmt):
            stmts = list(stmt.body.stmts)
            at = next(i for i, s in enumerate(stmts) if isinstance(s, IfStmt))
            moved = stmts[at:at + 2]
            rest = stmts[:at] + stmts[at + 2:]
            return dataclasses.replace(stmt, body=SeqStmt(tuple(rest[:2] + moved + rest[2:])))
        return None

    with pytest.raises(lowvm.InterpretError, match="overwrites shared memory"):
        _run_matmul_program(_mutate(program, refill_first))


# ---------------------------------------------------------------------------------------
# loops of other shapes: runtime start, step > 1, a pipelined loop inside another loop

TILE = 32


@vm.program(warps=1)
def strided_tile_sum(start: vm.int32, stop: vm.int32, x: vm.ptr[vm.float32],
                     y: vm.ptr[vm.float32], step: int = 1, stages: int | None = None):
    """y[:TILE] = the sum of the TILE-wide tiles at start, start + step, ... of both rows
    of x [2, stop * TILE]; y[TILE:] = how many tiles were added."""
    vm.set_grid(1)
    gx = vm.global_view(x, [2, stop * TILE])
    lay = vm.spatial(TILE)
    s = vm.shared_tensor(vm.float32, [1, TILE])
    acc = vm.register_tensor(vm.float32, [TILE], lay, 0.0)
    count = vm.register_tensor(vm.float32, [TILE], lay, 0.0)
    for r in vm.range(2):
        for t in vm.range(start, stop, step, stages=stages):
            vm.copy_async(s, gx, [r, t * TILE])
            vm.commit_group()
            vm.add(count, 1.0, out=count)
            vm.wait_group(0)
            vm.sync()
            vm.add(acc, vm.load_shared(s, lay, [0, 0]), out=acc)
            vm.sync()
    vm.store_global(vm.global_view(y, [2 * TILE]), acc)
    vm.store_global(vm.global_view(y, [2 * TILE]), count, [TILE])
    vm.free_shared(s)


@pytest.mark.parametrize("stages", [2, 3, 5])
@pytest.mark.parametrize("start, stop, step", [(0, 7, 1), (2, 9, 3), (3, 5, 2), (4, 4, 1)])
def test_runtime_start_and_step_and_nested_loop(stages, start, stop, step):
    x = RNG.standard_normal((2, stop * TILE)).astype(np.float32)
    outs = []
    for s in (None, stages):
        y = np.full(2 * TILE, np.nan, np.float32)
        lowvm.interpret(strided_tile_sum, start, stop, x, y, step=step, stages=s)
        outs.append(y)
    assert np.array_equal(outs[0], outs[1])
    # and it sums what it should (fp32 order is the loop's own: compare loosely)
    picked = x.reshape(2, stop, TILE)[:, start:stop:step].sum(axis=1)
    np.testing.assert_allclose(outs[1][:TILE], picked.sum(axis=0), rtol=1e-5, atol=1e-5)
    assert np.all(outs[1][TILE:] == 2 * len(range(start, stop, step)))


# ---------------------------------------------------------------------------------------
# loops that cannot be pipelined: a clear error naming the loop's line


def _one_block(body, **kwargs):
    @vm.program(warps=1, **kwargs)
    def prog(n: vm.int32, x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        body(n, vm.global_view(x, [n * TILE]))

    return prog


def _error(body, **kwargs) -> str:
    with pytest.raises(lowvm.ProgramError) as e:
        _one_block(body, **kwargs).build()
    return str(e.value)


def _line_of(fn, marker: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, text in enumerate(lines) if marker in text)


def test_error_body_not_starting_with_copy():
    def body(n, gx):
        s = vm.shared_tensor(vm.float32, [TILE])
        for t in vm.range(n, stages=2):  # loop-here
            vm.sync()
            vm.copy_async(s, gx, [t * TILE])
            vm.commit_group()
            vm.wait_group(0)
            vm.sync()

    message = _error(body)
    assert "does not start with copy_async" in message and "stages=2" in message
    assert f":{_line_of(body, 'loop-here')}" in message


@pytest.mark.parametrize("problem, expected", [
    ("no-commit", "not followed by commit_group"),
    ("wait-1", "wait_group(1)"),
    ("no-sync", "not followed by sync"),
    ("no-wait", "no top-level wait_group(0)"),
    ("use-before", "uses %"),
    ("store-after", "may only be read by load_shared"),
    ("second-commit", "only the copies at the start of the body may be asynchronous"),
])
def test_error_loop_shapes(problem, expected):
    lay = vm.spatial(TILE)

    def body(n, gx):
        s = vm.shared_tensor(vm.float32, [TILE])
        for t in vm.range(n, stages=3):  # loop-here
            vm.copy_async(s, gx, [t * TILE])
            if problem != "no-commit":
                vm.commit_group()
            if problem == "use-before":
                vm.store_shared(s, vm.register_tensor(vm.float32, [TILE], lay))
            if problem != "no-wait":
                vm.wait_group(1 if problem == "wait-1" else 0)
            if problem != "no-sync":
                vm.sync()
            if problem == "store-after":
                vm.store_shared(s, vm.register_tensor(vm.float32, [TILE], lay))
            if problem == "second-commit":
                vm.commit_group()
            vm.load_shared(s, lay)
            vm.sync()

    message = _error(body)
    assert expected in message, message
    assert f":{_line_of(body, 'loop-here')}" in message


def test_error_tile_used_outside_the_loop():
    lay = vm.spatial(TILE)

    def body(n, gx):
        s = vm.shared_tensor(vm.float32, [TILE])
        for t in vm.range(n, stages=2):  # loop-here
            vm.copy_async(s, gx, [t * TILE])
            vm.commit_group()
            vm.wait_group(0)
            vm.sync()
            vm.load_shared(s, lay)
            vm.sync()
        vm.load_shared(s, lay)  # after the loop

    message = _error(body)
    assert "also used outside the loop" in message
    assert f":{_line_of(body, 'loop-here')}" in message


def test_error_runtime_step():
    def body(n, gx):
        s = vm.shared_tensor(vm.float32, [TILE])
        for t in vm.range(0, n, n, stages=2):  # loop-here
            vm.copy_async(s, gx, [t * TILE])
            vm.commit_group()
            vm.wait_group(0)
            vm.sync()

    assert "positive compile-time integer" in _error(body)


@pytest.mark.parametrize("stages", [2, 4])
def test_error_shared_budget(stages):
    def body(n, gx):
        s = vm.shared_tensor(vm.float32, [1024])  # 4 KB, fits the limit alone
        for t in vm.range(n, stages=stages):  # loop-here
            vm.copy_async(s, gx, [t * TILE], shape=[1024])
            vm.commit_group()
            vm.wait_group(0)
            vm.sync()
            vm.load_shared(s, vm.spatial(32).local(32))
            vm.sync()

    if stages == 2:  # 2 x 4 KB: just fits
        assert _one_block(body, max_shared_bytes=8192).build().shared_bytes == 8192
        return
    message = _error(body, max_shared_bytes=8192)
    assert "16384 bytes" in message and "8192" in message and "fewer stages" in message


@pytest.mark.parametrize("stages", [0, -1, True, 2.5])
def test_error_bad_stages_value(stages):
    def body(n, gx):
        for _ in vm.range(n, stages=stages):  # loop-here
            pass

    message = _error(body)
    assert "stages must be None or an integer >= 1" in message


# ---------------------------------------------------------------------------------------
# rank-reducing shared access, directly


@vm.program(warps=1)
def stage_roundtrip(m: vm.int32, x: vm.ptr[vm.int32], y: vm.ptr[vm.int32], stage: int = 1):
    """Copy x [m, 32] into stage ``stage`` of a [3, 8, 32] tile (rows past m zero) and
    write it to y[0]; store twice its row 5 at [2, 3, :] and write that to y[1, 0]."""
    vm.set_grid(1)
    gx = vm.global_view(x, [m, 32])
    s = vm.shared_tensor(vm.int32, [3, 8, 32])
    vm.copy_async(s, gx, [0, 0], shape=[8, 32], dst_offsets=[stage, 0, 0])
    vm.commit_group()
    vm.wait_group(0)
    vm.sync()
    tile = vm.load_shared(s, vm.spatial(8, 4).local(1, 8), [stage, 0, 0])  # [8, 32]
    vm.store_global(vm.global_view(y, [24, 32]), tile, [0, 0])
    line = vm.load_shared(s, vm.spatial(32), [stage, 5, 0])  # [32]
    vm.sync()
    vm.store_shared(s, line * 2, [2, 3, 0])
    vm.sync()
    back = vm.load_shared(s, vm.spatial(32), [2, 3, 0])
    vm.store_global(vm.global_view(y, [768]), back, [256])


def test_rank_reducing_copy_load_store():
    for stage in (0, 1):
        for m in (8, 6):
            x = RNG.integers(-1000, 1000, (m, 32)).astype(np.int32)
            y = np.full((3, 8, 32), 7, np.int32)
            lowvm.interpret(stage_roundtrip, m, x, y, stage=stage)
            full = np.zeros((8, 32), np.int32)
            full[:m] = x
            assert np.array_equal(y[0], full)  # copied into one stage, zero-filled
            assert np.array_equal(y[1, 0], 2 * full[5])  # rank-1 load and store
            assert np.all(y[1, 1:] == 7) and np.all(y[2] == 7)


@vm.program(warps=1)
def stage_index(x: vm.ptr[vm.float32], lead: int = 0, tail: int = 0, copy_lead: int = 0,
                store: bool = False):
    """One access to a [2, 32] shared tile at [lead, tail] / a copy at [copy_lead, 0]."""
    vm.set_grid(1)
    gx = vm.global_view(x, [32])
    s = vm.shared_tensor(vm.float32, [2, 32])
    vm.copy_async(s, gx, [0], dst_offsets=[copy_lead, 0])
    vm.commit_group()
    vm.wait_group(0)
    vm.sync()
    if store:
        vm.store_shared(s, vm.register_tensor(vm.float32, [32], vm.spatial(32)), [lead, tail])
    else:
        vm.load_shared(s, vm.spatial(32), [lead, tail])


@pytest.mark.parametrize("store", [False, True])
@pytest.mark.parametrize("lead, tail, copy_lead, covers", [
    (2, 0, 0, "dim 0 it covers index 2"), (-1, 0, 0, "dim 0 it covers index -1"),
    (0, 1, 0, r"dim 1 it covers indices \[1, 33\)"), (0, 0, 2, "dim 0 it covers index 2"),
])
def test_rank_reducing_offsets_out_of_range(lead, tail, copy_lead, covers, store):
    """Constant offsets outside the shared tile are refused when the program is built
    (the CUDA code does not test shared indices), before anything runs."""
    x = np.zeros(32, np.float32)
    with pytest.raises(lowvm.ProgramError) as e:
        lowvm.interpret(stage_index, x, lead=lead, tail=tail, copy_lead=copy_lead,
                        store=store)
    assert not isinstance(e.value, lowvm.InterpretError)
    message = str(e.value)
    assert "outside the shared tile" in message and "[2, 32]" in message
    assert re.search(covers, message), message
    assert "test_software_pipeline.py:" in message


@vm.program(warps=1)
def runtime_stage_index(lead: vm.int32, x: vm.ptr[vm.float32]):
    """A load from a [2, 32] shared tile at a stage known only when it runs."""
    vm.set_grid(1)
    s = vm.shared_tensor(vm.float32, [2, 32])
    vm.copy_async(s, vm.global_view(x, [32]), [0])
    vm.commit_group()
    vm.wait_group(0)
    vm.sync()
    vm.load_shared(s, vm.spatial(32), [lead, 0])


@pytest.mark.parametrize("lead, bad", [(2, "(2, 0)"), (-1, "(-1, 0)")])
def test_runtime_offsets_out_of_range_are_caught_by_the_interpreter(lead, bad):
    x = np.zeros(32, np.float32)
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(runtime_stage_index, lead, x)
    message = str(e.value)
    assert "outside the shared tile" in message and bad in message and "[2, 32]" in message


def test_rank_reducing_reads_are_race_checked_per_stage():
    x = np.zeros(32, np.float32)
    lowvm.interpret(stage_index, x, lead=0)  # the stage that was copied: fine
    with pytest.raises(lowvm.InterpretError, match="never written"):
        lowvm.interpret(stage_index, x, lead=1)  # the other stage: never written


@pytest.mark.parametrize("what, expected", [
    ("tile-rank", "more dims than"),
    ("tile-size", "does not fit the trailing dims"),
    ("copy-shape-rank", "give one size per global dim"),
    ("copy-dst-offsets", "offsets"),
    ("copy-too-big", "does not fit the trailing dims"),
])
def test_rank_reducing_build_errors(what, expected):
    def body(n, gx):
        s = vm.shared_tensor(vm.float32, [2, 32])
        if what == "tile-rank":
            vm.load_shared(s, vm.spatial(2, 2, 8), [0, 0], shape=[2, 2, 8])
        elif what == "tile-size":
            vm.load_shared(s, vm.spatial(32).local(2), [0, 0], shape=[64])
        elif what == "copy-shape-rank":
            vm.copy_async(s, gx, [0], shape=[1, 32])
        elif what == "copy-dst-offsets":
            vm.copy_async(s, gx, [0], dst_offsets=[0])
        else:
            vm.copy_async(s, gx, [0], shape=[64])

    assert expected in _error(body)


# ---------------------------------------------------------------------------------------
# CUDA


@needs_nvcc
@pytest.mark.parametrize("template, constants", [
    (matmul_f16, {"stages": 3}),
    (quant_matmul, {"wtype": lowvm.int4, "group": 64, "stages": 2}),
    (quant_matmul, {"wtype": lowvm.int3, "group": 128, "stages": 4}),
    (strided_tile_sum, {"step": 2, "stages": 3}),
    (stage_roundtrip, {"stage": 2}),
], ids=["matmul_f16_s3", "quant_int4_s2", "quant_int3_s4", "strided_s3", "stage_roundtrip"])
def test_pipelined_cuda_compiles_for_sm80(template, constants):
    from lowvm.driver import generate_cuda
    from lowvm.runtime import resource_usage

    program = template.build(**constants)
    cuda = generate_cuda(program)
    if "stages" in constants:
        assert f"wait_group {constants['stages'] - 2}" in cuda.source
    usage = resource_usage(cuda.source, "sm_80")[cuda.kernel_name]
    assert usage["registers"] > 0


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("kernel", ["matmul_f16", "quant_matmul"])
def test_gpu_pipelined_kernels_equal_unpipelined(kernel, stages):
    """On the GPU the pipelined kernel runs the same arithmetic as the loop as written:
    identical output (and close to float64)."""
    import torch

    rng = np.random.default_rng(stages)
    if kernel == "matmul_f16":
        m, n, k = 96, 80, 32 * (stages + 3) + 8
        a = rng.standard_normal((m, k)).astype(np.float16)
        b = rng.standard_normal((k, n)).astype(np.float16)
        args, template, consts = (m, n, k, a, b), matmul_f16, {}
        ref = a.astype(np.float64) @ b.astype(np.float64)
    else:
        m, n, k = 37, 128, 64 * (stages + 3)
        w = rng.standard_normal((n, k))
        packed, scales = quantize_weights(w, "int4", 64)
        x = rng.standard_normal((m, k)).astype(np.float16)
        args, template = (m, n, k, x, packed, scales), quant_matmul
        consts = {"wtype": lowvm.int4, "group": 64}
        from lowvm.kernels.quant_matmul import dequantize_weights

        ref = x.astype(np.float64) @ dequantize_weights(packed, scales, "int4", 64, k).T
    outs = []
    for s in (None, stages):
        out = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
        dev = [torch.from_numpy(v).cuda() if isinstance(v, np.ndarray) else v for v in args]
        lowvm.compile(template, stages=s, **consts)(*dev, out)
        torch.cuda.synchronize()
        outs.append(out.cpu().numpy())
    assert np.array_equal(outs[0], outs[1])
    err = np.linalg.norm(outs[1].astype(np.float64) - ref) / np.linalg.norm(ref)
    assert err < 2e-3
