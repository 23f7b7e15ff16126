"""The verify pass: accepts every example unchanged, refuses malformed programs."""

from __future__ import annotations

import inspect

import pytest

import lowvm.lang as vm
from lowvm.dtypes import float32, int32
from lowvm.expr import Const, Var
from lowvm.instructions import Cast, Elementwise, RegisterInit
from lowvm.ir import ForStmt, InstStmt, Program, ProgramError, RegisterTensor, SeqStmt
from lowvm.layouts import column_spatial, spatial
from lowvm.passes import PIPELINE
from lowvm.passes.layout_inference import infer_layouts
from lowvm.passes.verify import verify
from tests.helpers.programs import EXAMPLES


def _line_of(fn, needle: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if needle in line)


def _program(*stmts, num_warps: int = 1) -> Program:
    return Program("hand_built", (), (Const(1),), num_warps, SeqStmt(tuple(stmts)))


def _tile(name: str, known: bool = True) -> RegisterTensor:
    """A float32[32] tile, one element per thread of one warp (or of unknown layout)."""
    return RegisterTensor(name, float32, (32,), spatial(32) if known else None)


def test_verify_and_inference_are_the_first_passes():
    assert [name for name, _ in PIPELINE] == ["verify", "layout_inference", "software_pipeline",
                                              "vectorize", "instruction_selection"]
    assert PIPELINE[0][1] is verify and PIPELINE[1][1] is infer_layouts


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_examples_pass_unchanged(name):
    template, constants = EXAMPLES[name]
    program = template.build(**constants)
    assert verify(program) is program


def test_a_tile_without_layout_is_refused_until_inference_has_run():
    t, u = _tile("t", known=False), _tile("u", known=False)
    program = _program(InstStmt(RegisterInit(out=t, value=Const(1))),
                       InstStmt(Elementwise(out=u, op="add", args=(t, Const(1)))))
    with pytest.raises(ProgramError, match="%t has no layout; run layout inference"):
        verify(program)
    inferred = infer_layouts(program)
    assert verify(inferred) is inferred
    assert all(i.output().layout is not None for i in inferred.instructions())


def test_read_before_write_inside_a_loop_is_refused():
    t, u = _tile("t"), _tile("u")
    body = SeqStmt((InstStmt(Elementwise(out=u, op="add", args=(t, Const(1)))),  # reads t
                    InstStmt(RegisterInit(out=t, value=Const(0)))))               # writes t
    program = _program(ForStmt(Var("i"), Const(0), Const(4), Const(1), body))
    with pytest.raises(ProgramError, match="%t is used before it is written"):
        verify(program)
    # written above the loop, the same body is fine
    fine = _program(InstStmt(RegisterInit(out=t, value=Const(0))),
                    ForStmt(Var("i"), Const(0), Const(4), Const(1), body))
    assert verify(fine) is fine


def test_failing_instruction_checks_are_reported():
    a = RegisterTensor("a", float32, (8, 4), spatial(8, 4))
    b = RegisterTensor("b", int32, (8, 4), column_spatial(8, 4))  # not a's layout
    program = _program(InstStmt(RegisterInit(out=a, value=Const(0))),
                       InstStmt(Cast(out=b, src=a)))
    with pytest.raises(ProgramError, match="keeps the layout"):
        verify(program)


def test_layout_over_the_wrong_number_of_threads_is_refused():
    t = RegisterTensor("t", float32, (64,), spatial(64))
    program = _program(InstStmt(RegisterInit(out=t, value=Const(0))), num_warps=1)
    with pytest.raises(ProgramError, match="64 threads but the block has 32"):
        verify(program)


def test_two_tiles_with_one_name_are_refused():
    a, b = _tile("same"), _tile("same")
    program = _program(InstStmt(RegisterInit(out=a, value=Const(0))),
                       InstStmt(RegisterInit(out=b, value=Const(0))))
    with pytest.raises(ProgramError, match="two different tiles are named %same"):
        verify(program)


def test_shared_tile_freed_twice_names_both_lines():
    @vm.program(warps=1)
    def twice(x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        s = vm.shared_tensor(vm.float32, [32])
        vm.store_shared(s, vm.register_tensor(vm.float32, [32], vm.spatial(32)))
        vm.free_shared(s)  # first
        vm.free_shared(s)  # second

    program = twice.build()
    with pytest.raises(ProgramError, match="freed twice") as info:
        verify(program)
    assert info.value.loc.lineno == _line_of(twice.fn, "# second")
    assert f":{_line_of(twice.fn, '# first')}:" in str(info.value)


def test_shared_tile_used_after_free_is_refused():
    @vm.program(warps=1)
    def after(x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        s = vm.shared_tensor(vm.float32, [32])
        vm.store_shared(s, vm.register_tensor(vm.float32, [32], vm.spatial(32)))
        vm.free_shared(s)
        vm.load_shared(s)  # after the free

    with pytest.raises(ProgramError, match="used after free_shared") as info:
        verify(after.build())
    assert info.value.loc.lineno == _line_of(after.fn, "# after the free")


def test_free_inside_a_loop_of_a_tile_allocated_outside_is_refused():
    @vm.program(warps=1)
    def looped(n: vm.int32):
        vm.set_grid(1)
        s = vm.shared_tensor(vm.float32, [32])
        for _ in vm.range(n):
            t = vm.shared_tensor(vm.float32, [32])
            vm.free_shared(t)  # allocated in the loop: fine
            vm.free_shared(s)  # every iteration

    with pytest.raises(ProgramError, match="freed inside it") as info:
        verify(looped.build())
    assert info.value.loc.lineno == _line_of(looped.fn, "# every iteration")


def test_tiles_written_in_a_branch_may_be_read_after_it():
    @vm.program(warps=1)
    def branch(n: vm.int32, y: vm.ptr[vm.float32]):
        vm.set_grid(1)
        t = vm.register_tensor(vm.float32, [32], vm.spatial(32))
        with vm.if_(n > 0):
            u = vm.add(t, 1.0)
        vm.store_global(vm.global_view(y, [32]), u)

    program = branch.build()
    assert verify(program) is program


def test_constant_shared_offsets_outside_the_tile_are_refused():
    """A hand-built (or rewritten) program is held to the bounds the builder checks: the
    CUDA code does not test shared indices."""
    from lowvm.instructions import AllocShared, StoreShared
    from lowvm.ir import SharedTensor
    from lowvm.layouts import shared_row_major

    s = SharedTensor("s", float32, shared_row_major(256))
    t = RegisterTensor("t", float32, (128,), spatial(32).local(4))

    def store_at(offset: int) -> Program:
        return _program(InstStmt(AllocShared(out=s)),
                        InstStmt(RegisterInit(out=t, value=Const(1))),
                        InstStmt(StoreShared(dst=s, src=t, offsets=(Const(offset),))))

    for fits in (0, 64, 128):
        assert verify(store_at(fits)) is not None
    for outside, covers in ((200, r"\[200, 328\)"), (129, r"\[129, 257\)"), (-1, r"\[-1, 127\)")):
        with pytest.raises(ProgramError, match=rf"outside the shared tile %s .*covers indices "
                                               rf"{covers}; accepted: offsets from 0 to 128"):
            verify(store_at(outside))
    # offsets known only at run time are the interpreter's to check
    runtime = _program(InstStmt(AllocShared(out=s)),
                       InstStmt(RegisterInit(out=t, value=Const(1))),
                       InstStmt(StoreShared(dst=s, src=t, offsets=(Var("n") * 200,))))
    assert verify(runtime) is runtime
