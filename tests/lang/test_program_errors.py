"""Every mistake a program author can make is reported at the line that made it.

Each test writes one mistake, marked with a trailing ``# <- name`` comment, and checks
that the error is a :class:`lowvm.ProgramError` (or :class:`lowvm.InterpretError`) whose
message names the problem and contains ``test_program_errors.py:<line of the mark>``.
"""

import re
from typing import Any

import numpy as np
import pytest

import lowvm
import lowvm.lang as vm
from lowvm.expr import ExprError

L16x8 = vm.spatial(8, 4).local(2, 2)
MMA = vm.mma_layouts("m16n8k16", vm.float16)


def _line(mark: str) -> int:
    """The line of this file that ends with ``# <- mark``."""
    with open(__file__) as f:
        found = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# <- {mark}")]
    assert len(found) == 1, f"mark {mark!r} found {len(found)} times"
    return found[0]


def expect(error, mark: str, *patterns: str):
    """Check the caught error: located at ``mark`` and matching every pattern."""
    message = str(error.value)
    where = f"test_program_errors.py:{_line(mark)}"
    assert where in message, f"{where} not in:\n{message}"
    for p in patterns:
        assert re.search(p, message), f"{p!r} not in:\n{message}"


def _prog(body, warps=1, **kwargs):
    """A one-block program over a float32 pointer whose body is ``body(x)``."""

    @vm.program(warps=warps, **kwargs)
    def prog(x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        body(x)

    return prog


# ---------------------------------------------------------------------------------------
# mistakes found while the program is built


def test_add_shape_mismatch():
    def body(x):
        a = vm.register_tensor(vm.float32, [16, 8], L16x8)
        b = vm.register_tensor(vm.float32, [16, 4], vm.spatial(8, 4).local(2, 1))
        a + b  # <- add-shapes

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "add-shapes", r"\[16, 8\]", r"\[16, 4\]", "do not broadcast")


def test_add_rank_mismatch():
    def body(x):
        a = vm.register_tensor(vm.float32, [16, 8], L16x8)
        b = vm.register_tensor(vm.float32, [128], vm.spatial(32).local(4))
        vm.add(b, a)  # <- add-ranks

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "add-ranks", "different ranks")


def test_dot_shape_mismatch():
    def body(x):
        a = vm.register_tensor(vm.float16, [16, 16], MMA.a)
        b = vm.register_tensor(vm.float16, [8, 8], vm.spatial(8, 4).local(1, 2))
        c = vm.register_tensor(vm.float32, [16, 8], MMA.c)
        vm.dot(a, b, c)  # <- dot-shapes

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "dot-shapes", "shape mismatch", r"a \[16, 16\] @ b \[8, 8\]")


def test_dot_unsupported_dtype():
    def body(x):
        a = vm.register_tensor(vm.float32, [16, 16], MMA.a)
        b = vm.register_tensor(vm.float32, [16, 8], MMA.b)
        c = vm.register_tensor(vm.float32, [16, 8], MMA.c)
        vm.dot(a, b, c)  # <- dot-dtype

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "dot-dtype", "float32 is not supported", "float16")


def test_dot_wrong_accumulator_type():
    def body(x):
        a = vm.register_tensor(vm.float16, [16, 16], MMA.a)
        b = vm.register_tensor(vm.float16, [16, 8], MMA.b)
        c = vm.register_tensor(vm.float16, [16, 8], MMA.c)
        vm.dot(a, b, c)  # <- dot-acc

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "dot-acc", "accumulate in float32")


def test_dot_mixed_operand_types():
    def body(x):
        a = vm.register_tensor(vm.float16, [16, 16], MMA.a)
        b = vm.register_tensor(vm.bfloat16, [16, 8], MMA.b)
        c = vm.register_tensor(vm.float32, [16, 8], MMA.c)
        vm.dot(a, b, c)  # <- dot-mixed

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "dot-mixed", "float16 and bfloat16 are not supported")


def test_layout_thread_count_differs_from_block():
    def body(x):
        lay = vm.spatial(32).local(2)
        vm.load_global(vm.global_view(x, [64]), [0], [64], lay)  # <- threads

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body, warps=2).build()
    expect(e, "threads", "32 threads", "block has 64", "2 warps")


def test_layout_shape_differs_from_tile_shape():
    def body(x):
        lay = vm.spatial(32).local(4)
        vm.load_global(vm.global_view(x, [16, 8]), [0, 0], [16, 8], lay)  # <- layout-shape

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "layout-shape", r"has shape \[128\]", r"tile has shape \[16, 8\]")


def test_layout_that_is_not_a_layout():
    def body(x):
        vm.register_tensor(vm.float32, [32], "spatial(32)")  # <- not-layout

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "not-layout", "must be a RegisterLayout")


def test_shared_memory_over_the_limit():
    def body(x):
        vm.shared_tensor(vm.float32, [16, 16])  # 1024 bytes: exactly the limit
        vm.shared_tensor(vm.float16, [2])  # <- shared-limit

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body, max_shared_bytes=1024).build()
    expect(e, "shared-limit", "over the limit", "1028 bytes", "1024")


def test_shared_memory_freed_is_reused():
    def body(x):
        s = vm.shared_tensor(vm.float32, [16, 16])
        vm.free_shared(s)
        vm.shared_tensor(vm.float32, [16, 16])

    assert _prog(body, max_shared_bytes=1024).build().shared_bytes == 1024


def test_missing_set_grid():
    @vm.program(warps=1)  # <- no-grid
    def prog(x: vm.ptr[vm.float32]):
        vm.register_tensor(vm.float32, [32], vm.spatial(32))

    with pytest.raises(lowvm.ProgramError) as e:
        prog.build()
    expect(e, "no-grid", "grid is not set", "set_grid")


def test_view_with_different_bits_per_thread():
    def body(x):
        t = vm.register_tensor(vm.uint8, [128], vm.spatial(32).local(4))
        vm.view(t, vm.int4, vm.spatial(32).local(4))  # <- view-bits

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "view-bits", "4 x 8 = 32 bits", "4 x 4 = 16 bits")


def test_break_inside_vm_range():
    @vm.program(warps=1)
    def prog(n: vm.int32, x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        g = vm.global_view(x, [32])
        t = vm.load_global(g, [0], [32], vm.spatial(32))
        for _ in vm.range(n):  # <- break
            vm.store_global(g, t + 1.0)
            break
        vm.store_global(g, t)

    with pytest.raises(lowvm.ProgramError) as e:
        prog.build()
    expect(e, "break", "`break`")


def test_return_inside_vm_range():
    @vm.program(warps=1)
    def prog(n: vm.int32, x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        for _ in vm.range(n):  # <- return
            return

    with pytest.raises(lowvm.ProgramError) as e:
        prog.build()
    expect(e, "return", "`return`")


def test_python_if_on_a_runtime_value():
    @vm.program(warps=1)
    def prog(n: vm.int32, x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        if n > 4:  # <- python-if
            vm.sync()

    with pytest.raises(ExprError) as e:
        prog.build()
    expect(e, "python-if", "no truth value", "if_")


def test_python_range_over_a_runtime_value():
    @vm.program(warps=1)
    def prog(n: vm.int32, x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        for _ in range(n):  # <- python-range
            vm.sync()

    with pytest.raises(ExprError) as e:
        prog.build()
    expect(e, "python-range", "not a compile-time integer")


def test_python_if_on_a_tile():
    def body(x):
        t = vm.register_tensor(vm.float32, [32], vm.spatial(32))
        if t > 0.0:  # <- tile-if
            vm.sync()

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "tile-if", "no single truth value", "where")


def test_operands_with_different_dtypes():
    def body(x):
        a = vm.register_tensor(vm.float32, [32], vm.spatial(32))
        b = vm.register_tensor(vm.float16, [32], vm.spatial(32))
        vm.mul(a, b)  # <- dtypes

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "dtypes", "different types", "float16", "float32", "cast")


def test_float_only_and_int_only_ops():
    def body(x):
        a = vm.register_tensor(vm.int32, [32], vm.spatial(32))
        vm.exp(a)  # <- exp-int

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "exp-int", "exp needs a float type")

    def body2(x):
        a = vm.register_tensor(vm.float32, [32], vm.spatial(32))
        vm.mod(a, 2)  # <- mod-float

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body2).build()
    expect(e, "mod-float", "mod needs an integer type")


def test_where_condition_must_be_bool():
    def body(x):
        a = vm.register_tensor(vm.float32, [32], vm.spatial(32))
        vm.where(a, a, 0.0)  # <- where-cond

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "where-cond", "must be bool")


def test_static_assert_failing():
    def body(x):
        block = 48
        vm.static_assert(block % 32 == 0, "block must be a multiple of 32")  # <- static

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "static", "static_assert failed", "multiple of 32")


def test_static_assert_on_a_runtime_value():
    @vm.program(warps=1)
    def prog(n: vm.int32, x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        vm.static_assert(n > 0)  # <- static-runtime

    with pytest.raises(lowvm.ProgramError) as e:
        prog.build()
    expect(e, "static-runtime", "not known at compile time")


def test_out_tile_of_the_wrong_type():
    def body(x):
        a = vm.register_tensor(vm.float32, [32], vm.spatial(32))
        acc = vm.register_tensor(vm.float16, [32], vm.spatial(32))
        vm.add(a, a, out=acc)  # <- out-type

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "out-type", "out=%", "float16", "float32")


def test_wrong_number_of_offsets():
    def body(x):
        vm.load_global(vm.global_view(x, [16, 8]), [0], [16, 8], L16x8)  # <- offsets

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "offsets", "1 offsets for a rank-2")


def test_store_of_the_wrong_dtype():
    def body(x):
        t = vm.register_tensor(vm.float16, [32], vm.spatial(32))
        vm.store_global(vm.global_view(x, [32]), t)  # <- store-dtype

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "store-dtype", "storing a float16 tile into float32", "cast")


def test_sub_byte_pointer_must_be_viewed_from_bytes():
    @vm.program(warps=1)
    def prog(w: vm.ptr[vm.int4]):
        vm.set_grid(1)
        vm.global_view(w, [64])  # <- subbyte

    with pytest.raises(lowvm.ProgramError) as e:
        prog.build()
    expect(e, "subbyte", "4-bit type int4", "uint8")


def test_reduce_and_permute_bad_dims():
    def body(x):
        t = vm.register_tensor(vm.float32, [16, 8], L16x8)
        vm.sum(t, 2)  # <- reduce-dim

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body).build()
    expect(e, "reduce-dim", r"dim must be in \[-2, 2\)")

    def body2(x):
        t = vm.register_tensor(vm.float32, [16, 8], L16x8)
        vm.permute(t, [0, 0])  # <- permute-dims

    with pytest.raises(lowvm.ProgramError) as e:
        _prog(body2).build()
    expect(e, "permute-dims", "permutation")


def test_layout_error_while_building_is_located():
    def body(x):
        vm.register_tensor(vm.float32, [32], vm.spatial(32, 0))  # <- bad-layout

    with pytest.raises(lowvm.LayoutError) as e:
        _prog(body).build()
    expect(e, "bad-layout", "positive integer")


def test_vm_call_outside_a_program():
    with pytest.raises(lowvm.ProgramError) as e:
        vm.sync()  # <- outside
    expect(e, "outside", "@vm.program")


def test_unknown_and_missing_compile_time_constants():
    @vm.program(warps=1)
    def prog(x: vm.ptr[vm.float32], block: int):
        vm.set_grid(1)

    with pytest.raises(lowvm.ProgramError) as e:
        prog.build(blok=4)  # <- unknown-constant
    expect(e, "unknown-constant", "unknown compile-time parameters", "blok")
    with pytest.raises(lowvm.ProgramError) as e:
        lowvm.interpret(prog, np.zeros(4, np.float32))  # <- missing-constant
    expect(e, "missing-constant", "'block' needs a value")
    built = prog.build(block=4)
    with pytest.raises(lowvm.ProgramError) as e:
        lowvm.interpret(built, np.zeros(4, np.float32), block=8)  # <- rebuilt
    expect(e, "rebuilt", "already built")


# ---------------------------------------------------------------------------------------
# mistakes in the arguments of a run


@vm.program(warps=1)
def scale(n: vm.int32, x: vm.ptr[vm.float32], y: vm.ptr[vm.float16]):
    """y = x over [n], in blocks of 32."""
    vm.set_grid(vm.cdiv(n, 32))
    off = [vm.block_index() * 32]
    t = vm.load_global(vm.global_view(x, [n]), off, [32], vm.spatial(32))  # <- load
    vm.store_global(vm.global_view(y, [n]), vm.cast(t, vm.float16), off)


def test_scale_runs_with_correct_arguments():
    x, y = np.arange(40, dtype=np.float32), np.zeros(40, np.float16)
    lowvm.interpret(scale, 40, x, y)
    np.testing.assert_array_equal(y, x)


def test_wrong_number_of_runtime_arguments():
    x, y = np.zeros(40, np.float32), np.zeros(40, np.float16)
    with pytest.raises(lowvm.ProgramError) as e:
        lowvm.interpret(scale, x, y)  # <- nargs
    expect(e, "nargs", "takes 3 runtime arguments", "got 2", "n: int32")
    with pytest.raises(lowvm.ProgramError) as e:
        scale.interpret(40, x, y, y)  # <- nargs-method
    expect(e, "nargs-method", "got 4")


def test_wrong_array_dtype_for_a_pointer():
    x, y = np.zeros(40, np.float32), np.zeros(40, np.float32)
    with pytest.raises(lowvm.ProgramError) as e:
        lowvm.interpret(scale, 40, x, y)  # <- array-dtype
    expect(e, "array-dtype", "argument 'y'", "ptr<float16>", "got an array of float32")


def test_wrong_scalar_arguments():
    x, y = np.zeros(40, np.float32), np.zeros(40, np.float16)
    with pytest.raises(lowvm.ProgramError) as e:
        lowvm.interpret(scale, 40.0, x, y)  # <- scalar-float
    expect(e, "scalar-float", "argument 'n'", "expected an int")
    with pytest.raises(lowvm.ProgramError) as e:
        lowvm.interpret(scale, 2**31, x, y)  # <- scalar-range
    expect(e, "scalar-range", "outside")
    with pytest.raises(lowvm.ProgramError) as e:
        lowvm.interpret(scale, 40, [0.0] * 40, y)  # <- list-arg
    expect(e, "list-arg", "expected a numpy array", "list")


def test_non_contiguous_array():
    x = np.zeros((40, 2), np.float32)[:, 0]
    with pytest.raises(lowvm.ProgramError) as e:
        lowvm.interpret(scale, 40, x, np.zeros(40, np.float16))  # <- strided
    expect(e, "strided", "C-contiguous")


def test_global_view_larger_than_the_array_raises():
    x = np.arange(50, dtype=np.float32)
    y = np.zeros(100, np.float16)
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(scale, 100, x, y)  # the view says 100 elements, x has 50
    expect(e, "load", "argument 'x'", "50 elements", "larger than the array")
    # nothing past what the blocks before the bad one computed was written
    np.testing.assert_array_equal(y[:32], x[:32])
    np.testing.assert_array_equal(y[32:], 0)


def test_integer_overflow_names_the_line():
    @vm.program(warps=1)
    def prog(x: vm.ptr[vm.int8]):
        vm.set_grid(1)
        g = vm.global_view(x, [32])
        t = vm.load_global(g, [0], [32], vm.spatial(32))
        vm.store_global(g, t * 2)  # <- overflow

    x = np.full(32, 64, np.int8)
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(prog, x)
    expect(e, "overflow", "integer overflow", "128", "int8")


def test_register_init_that_does_not_fit():
    def body(x):
        vm.register_tensor(vm.int8, [32], vm.spatial(32), 200)  # <- init-overflow

    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(_prog(body), np.zeros(1, np.float32))
    expect(e, "init-overflow", "integer overflow", "200")


def test_tile_read_before_written():
    @vm.program(warps=1)
    def prog(n: vm.int32, x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        g = vm.global_view(x, [32])
        with vm.if_(n > 0):
            t = vm.load_global(g, [0], [32], vm.spatial(32))
        vm.store_global(g, t)  # <- unwritten

    x = np.ones(32, np.float32)
    lowvm.interpret(prog, 1, x)
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(prog, 0, x)
    expect(e, "unwritten", "read before any instruction wrote it")


def test_shared_index_outside_the_tile():
    def body(x):
        s = vm.shared_tensor(vm.float32, [32])
        t = vm.register_tensor(vm.float32, [32], vm.spatial(32))
        vm.store_shared(s, t, [4])  # <- shared-oob

    with pytest.raises(lowvm.ProgramError) as e:  # when built: CUDA does not test it
        _prog(body).build()
    expect(e, "shared-oob", "outside the shared tile", r"indices \[4, 36\)", r"0 to 0")


def test_shared_tile_used_after_free():
    def body(x):
        s = vm.shared_tensor(vm.float32, [32])
        vm.free_shared(s)
        vm.store_shared(s, vm.register_tensor(vm.float32, [32], vm.spatial(32)))  # <- freed

    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(_prog(body), np.zeros(1, np.float32))
    expect(e, "freed", "after free_shared")


@pytest.mark.parametrize("warps", [0, -1, 33, 64, 2.0, True])
def test_bad_warp_counts_are_refused_where_the_program_is_defined(warps):
    with pytest.raises(lowvm.ProgramError) as e:
        @vm.program(warps=warps)  # <- warps
        def kernel(n: vm.int32):
            vm.set_grid(1)
    expect(e, "warps", r"warps must be an integer in \[1, 32\]", re.escape(repr(warps)))


def test_a_constant_of_the_wrong_type_is_named_at_the_build_call():
    from lowvm.kernels.vector_add import vector_add

    with pytest.raises(lowvm.ProgramError) as e:
        vector_add.build(block="512")  # <- constant type
    expect(e, "constant type", "'block' takes an integer", "'512'")
    assert vector_add.build(block=256).name == "vector_add"


@vm.program(warps=4)
def _untyped(n: vm.int32, a: vm.ptr[vm.float32], block=512, scale: vm.constexpr = 0.5,
             name: vm.constexpr = "x", flag=False, stages: int | None = None,
             wtype: vm.constexpr = vm.int4, anything: Any = 3):
    """Compile-time parameters declared by default, by vm.constexpr, by a union, or not."""
    vm.static_assert(block % 128 == 0, "block must be a multiple of 128")
    vm.set_grid(vm.cdiv(n, block))


@pytest.mark.parametrize("constants, accepted", [
    ({"block": "512"}, r"'block' takes an integer \(the type of its default 512\), got '512'"),
    ({"block": 512.0}, r"'block' takes an integer .*got 512\.0 \(float\)"),
    ({"block": True}, r"'block' takes an integer .*got True \(bool\)"),
    ({"scale": "0.5"}, r"'scale' takes a number \(the type of its default 0\.5\)"),
    ({"name": 3}, r"'name' takes a string"),
    ({"flag": "yes"}, r"'flag' takes a bool"),
    ({"stages": "2"}, r"'stages' takes an integer or None, got '2' \(str\)"),
])
def test_constants_of_the_wrong_type_are_refused_at_the_users_line(constants, accepted):
    with pytest.raises(lowvm.ProgramError) as e:
        _untyped.build(**constants)  # <- untyped constant
    expect(e, "untyped constant", accepted)
    assert "not all arguments converted" not in str(e.value)


def test_constants_of_the_declared_type_are_accepted():
    _untyped.build(block=256, scale=1, name="y", flag=True, stages=None)
    _untyped.build(block=np.int64(256), stages=3)
    # a default of another type (a data type) and an explicit Any declare nothing
    _untyped.build(wtype="int3", anything="whatever")


def test_constant_shared_offset_outside_the_tile_is_refused_before_any_cuda():
    @vm.program(warps=4)
    def past_the_end(x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        s = vm.shared_tensor(vm.float32, [256])
        t = vm.register_tensor(vm.float32, [128], vm.spatial(128), 1.0)
        vm.store_shared(s, t, [200])  # <- store past the end

    for make in (past_the_end.build, lambda: lowvm.compile(past_the_end, arch="sm_80")):
        with pytest.raises(lowvm.ProgramError) as e:
            make()
        expect(e, "store past the end", r"the tile \[128\] at offsets \[200\] reaches outside "
               r"the shared tile %s\d+ of shape \[256\]", r"indices \[200, 328\)",
               "offsets from 0 to 128")
