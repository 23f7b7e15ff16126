"""Runtime index and loop arithmetic is int32 in the interpreter, as in the kernel: it
wraps by default and the checked mode reports the wrap at its program line."""

import numpy as np
import pytest

import lowvm
import lowvm.lang as vm
from lowvm.expr import (
    INT32_MAX,
    INT32_MIN,
    ExprError,
    Int32OverflowError,
    Var,
    evaluate,
    evaluate_int32,
    wrap_int32,
)

N, A, B = Var("n"), Var("a"), Var("b")


def _line(mark: str) -> int:
    with open(__file__) as f:
        found = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# <- {mark}")]
    assert len(found) == 1
    return found[0]


@vm.program(warps=1)
def square_index(n: vm.int32, x: vm.ptr[vm.float32], out: vm.ptr[vm.float32]):
    vm.set_grid(1)
    g = vm.global_view(x, [64])
    t = vm.load_global(g, [n * n], [32], vm.spatial(32))  # <- square
    vm.store_global(vm.global_view(out, [32]), t, [0])


def _run_square(n: int, **kw) -> np.ndarray:
    x = np.arange(1, 65, dtype=np.float32)
    out = np.full(32, -1.0, np.float32)
    lowvm.interpret(square_index, n, x, out, **kw)
    return out


def test_an_index_that_wraps_reads_what_the_gpu_reads():
    # 65536 * 65536 = 2^32 is 0 in 32 bits: the GPU reads elements 0..31
    assert np.array_equal(_run_square(65536), np.arange(1, 33, dtype=np.float32))
    assert np.array_equal(_run_square(4), np.arange(17, 49, dtype=np.float32))
    # -46341^2 wraps to a negative index: outside, so 0 is read (as on the GPU)
    assert np.array_equal(_run_square(46341), np.zeros(32, np.float32))


def test_checked_mode_reports_the_wrap_at_its_line():
    with pytest.raises(lowvm.InterpretError) as e:
        _run_square(65536, checked=True)
    message = str(e.value)
    assert f"test_int32_arithmetic.py:{_line('square')}" in message
    assert "int32 overflow in (n * n): 65536 * 65536 = 4294967296" in message
    assert "gives 0" in message
    assert np.array_equal(_run_square(4, checked=True), np.arange(17, 49, dtype=np.float32))


def test_the_environment_switch(monkeypatch):
    monkeypatch.setenv("LOWVM_CHECKED", "1")
    with pytest.raises(lowvm.InterpretError, match="int32 overflow"):
        _run_square(65536)
    assert _run_square(65536, checked=False)[0] == 1.0  # the argument wins
    monkeypatch.setenv("LOWVM_CHECKED", "yes")
    with pytest.raises(lowvm.ProgramError, match="LOWVM_CHECKED is 'yes'; accepted"):
        _run_square(4)


@pytest.mark.parametrize("expr, env, wrapped", [
    (A * B, {"a": 65536, "b": 65536}, 0),
    (A + B, {"a": INT32_MAX, "b": 1}, INT32_MIN),
    (A - B, {"a": INT32_MIN, "b": 1}, INT32_MAX),
    (-A, {"a": INT32_MIN}, INT32_MIN),
    (A // B, {"a": INT32_MIN, "b": -1}, INT32_MIN),
    (A << B, {"a": 3, "b": 31}, INT32_MIN),
    (A << B, {"a": 3, "b": 32}, 0),  # shl.b32 by 32 or more gives 0
    (A >> B, {"a": -5, "b": 40}, -1),  # shr.s32 fills with the sign
    (A * B + 7, {"a": 46341, "b": 46341}, wrap_int32(46341**2 + 7)),
])
def test_int32_evaluation(expr, env, wrapped):
    assert evaluate_int32(expr, env) == wrapped
    with pytest.raises(Int32OverflowError, match="int32 overflow"):
        evaluate_int32(expr, env, checked=True)


def test_int32_evaluation_without_overflow_is_exact():
    env = {"a": 123456, "b": -789}
    for expr in (A * B, A + B, A - B, A // B, A % B, -A, (A * 3) >> 2):
        assert evaluate_int32(expr, env, checked=True) == evaluate(expr, env)
    assert evaluate_int32(A % B, {"a": -7, "b": 2}) == -1  # C's remainder: the dividend's sign
    assert evaluate_int32(A * 0.5, {"a": 3}) == 1.5  # floats keep float arithmetic


def test_only_the_side_c_evaluates_is_evaluated():
    guarded = A.not_equals(0).logical_and((B // A).equals(2))
    assert evaluate_int32(guarded, {"a": 0, "b": 4}) is False
    with pytest.raises(ExprError, match="division by zero"):
        evaluate_int32(B // A, {"a": 0, "b": 4})


def test_a_constant_beyond_int32_is_refused():
    with pytest.raises(ExprError, match="constant 4294967296 .* does not fit int32"):
        evaluate_int32(A + 2**32, {"a": 1})


@vm.program(warps=1)
def near_the_end(start: vm.int32, x: vm.ptr[vm.float32], out: vm.ptr[vm.float32]):
    vm.set_grid(1)
    t = vm.load_global(vm.global_view(x, [64]), [start], [32], vm.spatial(32))  # <- near-end
    vm.store_global(vm.global_view(out, [32]), t, [0])


@pytest.mark.parametrize("checked", [False, True])
def test_a_tile_whose_indices_pass_int32_is_refused(checked):
    x, out = np.ones(64, np.float32), np.zeros(32, np.float32)
    lowvm.interpret(near_the_end, INT32_MAX - 31, x, out, checked=checked)  # just fits
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(near_the_end, INT32_MAX - 30, x, out, checked=checked)
    assert "beyond int32 along dim 0" in str(e.value)
    assert f"test_int32_arithmetic.py:{_line('near-end')}" in str(e.value)


@vm.program(warps=1)
def counter(start: vm.int32, stop: vm.int32, step: vm.int32, out: vm.ptr[vm.int32]):
    vm.set_grid(1)
    g = vm.global_view(out, [32])
    one = vm.register_tensor(vm.int32, [32], vm.spatial(32), init=1)
    for _ in vm.range(start, stop, step):  # <- counter
        vm.atomic_add(g, one, [0])


def test_a_loop_counter_that_would_overflow_is_refused():
    out = np.zeros(32, np.int32)
    lowvm.interpret(counter, INT32_MAX - 3, INT32_MAX, 1, out)  # the counter ends at MAX
    assert out[0] == 3
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(counter, INT32_MAX - 3, INT32_MAX, 2, out)
    assert "becomes 2147483648, outside int32" in str(e.value)
    assert f"test_int32_arithmetic.py:{_line('counter')}" in str(e.value)
    with pytest.raises(lowvm.InterpretError, match="becomes -2147483649"):
        lowvm.interpret(counter, INT32_MIN + 3, INT32_MIN, -2, out)


def test_a_constant_named_checked_is_not_shadowed():
    @vm.program(warps=1)
    def prog(x: vm.ptr[vm.float32], checked: bool = False):
        vm.set_grid(1)

    with pytest.raises(lowvm.ProgramError, match="named 'checked'.*build it first"):
        lowvm.interpret(prog, np.zeros(1, np.float32), checked=True)
    lowvm.interpret(prog.build(checked=True), np.zeros(1, np.float32))


def test_an_atomic_add_of_a_replicated_inferred_tile_is_refused_plainly():
    @vm.program(warps=1)
    def prog(out: vm.ptr[vm.int32]):
        vm.set_grid(1)
        one = vm.register_tensor(vm.int32, [1], None, init=1)
        vm.atomic_add(vm.global_view(out, [1]), one, [0])

    with pytest.raises(lowvm.ProgramError, match="replicated 32 times"):
        prog.build()


@pytest.mark.gpu
@pytest.mark.parametrize("n", [4, 65536, 46341, 92682])
def test_gpu_reads_what_the_interpreter_reads(n):
    import torch

    x = torch.arange(1, 65, dtype=torch.float32, device="cuda")
    out = torch.full((32,), -1.0, device="cuda")
    lowvm.compile(square_index)(n, x, out)
    torch.cuda.synchronize()
    assert np.array_equal(out.cpu().numpy(), _run_square(n))
