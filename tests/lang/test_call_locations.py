"""Errors name the user's line of the call that failed, not the call that first built the
(cached) program, nor a line of lowvm, torch or the standard library on the way.

Lines are found by a trailing ``# <- name`` mark, as in test_program_errors.py.
"""

from __future__ import annotations

import contextlib
import os
import re

import numpy as np
import pytest
import torch

import lowvm
import lowvm.lang as vm
from lowvm import source_location
from lowvm.ir import IfStmt, walk
from lowvm.kernels.vector_add import vector_add
from tests.helpers.marks import marked_line

HERE = os.path.basename(__file__)
LOWVM_DIR = os.path.dirname(os.path.abspath(lowvm.__file__))


def _line(mark: str) -> int:
    """The line of this file that ends with ``# <- mark``."""
    return marked_line(__file__, mark)


def _starts_at(error: BaseException, mark: str) -> bool:
    """Whether the error's first line is this file's line of ``mark``."""
    first = str(error).splitlines()[0]
    return re.match(rf"(.*[/\\])?{re.escape(HERE)}:{_line(mark)}: ", first) is not None


def _names(message: str, mark: str) -> bool:
    return re.search(rf"{re.escape(HERE)}:{_line(mark)}: ", message) is not None


def _vectors(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = np.arange(n, dtype=np.float32)
    return a, 2 * a, np.zeros(n, np.float32)


# ---------------------------------------------------------------------------------------
# a cached program: the second call's line, not the first's


def test_library_program_error_names_this_call_not_the_first():
    a, b, c = _vectors(1000)
    vector_add._cache.clear()  # the first call below builds (and caches) it
    lowvm.interpret(vector_add, 1000, a, b, c)  # <- first call
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(vector_add, 2000, a, b, c)  # <- second call
    message = str(e.value)
    assert _starts_at(e.value, "second call"), message
    assert not _names(message, "first call")
    # the program line is the kernel library's own, by its package path
    assert re.search(r"in the program at lowvm/kernels/vector_add\.py:\d+: x = vm\.load_global",
                     message), message
    assert "element 1000 of the argument 'a'" in message
    assert e.value.call.lineno == _line("second call")
    assert e.value.loc.filename == os.path.join("lowvm", "kernels", "vector_add.py")


@vm.program(warps=1)
def copy32(n: vm.int32, x: vm.ptr[vm.float32], y: vm.ptr[vm.float32]):
    vm.set_grid(1)
    t = vm.load_global(vm.global_view(x, [n]), [0], [32], vm.spatial(32), inbounds=True)  # <- load
    vm.store_global(vm.global_view(y, [n]), t, [0])


def test_user_program_error_names_the_program_line_and_this_call():
    x, y = np.ones(32, np.float32), np.zeros(32, np.float32)
    lowvm.interpret(copy32, 32, x, y)
    with pytest.raises(lowvm.InterpretError) as e:
        lowvm.interpret(copy32, 16, x, y)  # <- short view
    message = str(e.value)
    assert _starts_at(e.value, "short view"), message
    assert re.search(rf"in the program at \S*{HERE}:{_line('load')}: ", message), message
    assert "inbounds=True" in message


def test_argument_errors_name_this_call():
    a, b, c = _vectors(64)
    lowvm.interpret(vector_add, 64, a, b, c)
    with pytest.raises(lowvm.ProgramError) as e:
        lowvm.interpret(vector_add, 64.0, a, b, c)  # <- float n
    assert _starts_at(e.value, "float n")
    assert "argument 'n'" in str(e.value)


def test_build_error_of_a_library_program_names_the_call_and_the_library_line():
    with pytest.raises(lowvm.ProgramError) as e:
        vector_add.build(block=96)  # <- bad block
    message = str(e.value)
    assert _starts_at(e.value, "bad block"), message
    assert re.search(r"in the program at lowvm/kernels/vector_add\.py:\d+: vm\.static_assert",
                     message), message
    assert "multiple of the 128 threads" in message


def test_build_error_of_a_user_program_names_the_program_line_and_the_call():
    @vm.program(warps=1)
    def bad(x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        vm.register_tensor(vm.float32, [16], vm.spatial(16))  # <- 16 threads

    with pytest.raises(lowvm.ProgramError) as e:
        bad.build()  # <- build bad
    message = str(e.value)
    assert _starts_at(e.value, "build bad"), message
    assert re.search(rf"in the program at \S*{HERE}:{_line('16 threads')}: ", message)
    assert e.value.loc.lineno == _line("16 threads")


def test_branch_line_is_the_users_not_contextlib():
    @vm.program(warps=1)
    def branch(n: vm.int32, x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        with vm.if_(n > 0):  # <- branch
            vm.store_global(vm.global_view(x, [32]), vm.register_tensor(
                vm.float32, [32], vm.spatial(32), 1.0))

    ifs = [s for s in walk(branch.build().body) if isinstance(s, IfStmt)]
    assert len(ifs) == 1
    assert ifs[0].loc.filename.endswith(HERE) and ifs[0].loc.lineno == _line("branch")


# ---------------------------------------------------------------------------------------
# the frame filter: lowvm, torch and the standard library are never the user's


def test_frame_filter_by_file():
    assert source_location.is_user_file(__file__)
    assert source_location.is_user_file("<stdin>")
    assert not source_location.is_user_file(os.path.join(LOWVM_DIR, "lang", "ops.py"))
    assert not source_location.is_user_file(os.path.join(LOWVM_DIR, "kernels", "x.py"))
    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    assert not source_location.is_user_file(
        os.path.join(torch_dir, "_library", "custom_ops.py"))
    assert not source_location.is_user_file(contextlib.__file__)
    assert not source_location.is_user_file("<frozen importlib._bootstrap>")
    # packages installed beside the standard library are not the standard library
    stdlib = os.path.dirname(os.path.abspath(contextlib.__file__))
    assert source_location.is_user_file(os.path.join(stdlib, "site-packages", "app", "m.py"))


def _function_in(filename: str, source: str, name: str, namespace: dict):
    """``name`` defined by ``source`` as if it were written in ``filename``: its frames
    carry that file name, as a real module's would."""
    exec(compile(source, filename, "exec"), namespace)
    return namespace[name]


def test_user_location_skips_synthetic_torch_and_lowvm_frames():
    torch_file = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "_library",
                              "custom_ops.py")
    inner = _function_in(os.path.join(LOWVM_DIR, "nn", "synthetic_backend.py"),
                         "def inner(where):\n    return where()\n", "inner",
                         {})
    outer = _function_in(torch_file, "def outer(f, where):\n    return f(where)\n", "outer",
                         {})
    loc = outer(inner, source_location.user_location)  # <- synthetic stack
    assert loc.filename.endswith(HERE) and loc.lineno == _line("synthetic stack")


def _register_stale_op():
    """``lowvm_tests::add_twice_the_length``, implemented "inside lowvm" as the layers'
    ``torch.ops.lowvm.*`` ops are: it runs vector_add over twice its input's length."""
    name = "lowvm_tests::add_twice_the_length"
    if hasattr(torch.ops.lowvm_tests, "add_twice_the_length"):
        return torch.ops.lowvm_tests.add_twice_the_length
    source = (
        "def impl(x):\n"
        "    a = x.numpy().copy()\n"
        "    c = a.copy()\n"
        "    interpret(vector_add, 2 * a.size, a, a, c)\n"
        "    return torch.from_numpy(c)\n"
    )
    impl = _function_in(os.path.join(LOWVM_DIR, "nn", "synthetic_op.py"), source, "impl",
                        {"interpret": lowvm.interpret, "vector_add": vector_add,
                         "torch": torch})
    impl.__annotations__ = {"x": torch.Tensor, "return": torch.Tensor}
    torch.library.custom_op(name, impl, mutates_args=())
    return torch.ops.lowvm_tests.add_twice_the_length


def test_error_inside_a_torch_custom_op_names_the_callers_line():
    op = _register_stale_op()
    x = torch.arange(256, dtype=torch.float32)
    with pytest.raises(lowvm.InterpretError) as e:
        op(x)  # <- custom op
    message = str(e.value)
    assert _starts_at(e.value, "custom op"), message
    assert "custom_ops.py" not in message and "torch" not in message.splitlines()[0]
