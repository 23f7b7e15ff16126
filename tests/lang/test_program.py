"""``@vm.program`` parameters: pointers whose element type is a compile-time constant
(``vm.ptr[vm.dtype_of(...)]``), constants that are objects, and how a specialisation is
named and listed."""

from __future__ import annotations

import shutil
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import lowvm
import lowvm.lang as vm
from lowvm.driver import generate_cuda


@vm.program(warps=4)
def double(n: vm.int32, x: vm.ptr[vm.dtype_of("adtype")], y: vm.ptr[vm.dtype_of("adtype")],
           adtype: vm.constexpr = vm.float16, block: int = 512):
    """``y = x + x`` for x and y of ``adtype``."""
    vm.set_grid(vm.cdiv(n, block))
    start = [vm.block_index() * block]
    v = vm.load_global(vm.global_view(x, [n]), start, [block],
                       vm.spatial(128).local(block // 128))
    vm.store_global(vm.global_view(y, [n]), v + v, start)


@pytest.mark.parametrize("adtype,name", [(lowvm.float16, "double"),
                                         (lowvm.bfloat16, "double_bf16"),
                                         (lowvm.float32, "double_f32")])
def test_a_pointer_takes_its_element_type_from_a_constant(adtype, name):
    program = double.build(adtype=adtype)
    assert [str(p) for p in program.params] == [
        "n: int32", f"x: ptr<{adtype.name}>", f"y: ptr<{adtype.name}>"]
    # the type names the specialisation (the default's name is the template's) and is not
    # listed among its constants
    assert program.name == name and program.constants == (("block", 512),)
    x = torch.randn(1000).to(getattr(torch, adtype.name))
    y = torch.zeros_like(x)
    lowvm.interpret(double, 1000, x, y, adtype=adtype)
    assert torch.equal(y, x + x)
    cuda = generate_cuda(program)
    assert f"// lowvm program {name} [block=512]" in cuda.source
    assert cuda.kernel_name.startswith(f"lowvm_{name}_")


def test_the_template_shows_its_pointers_by_their_constant():
    assert "x: ptr<adtype>, y: ptr<adtype>" in repr(double)
    assert double.build() is double.build(adtype=lowvm.float16)  # one cached build


def test_the_interpreter_checks_the_resolved_type():
    x = np.ones(1000, np.float16)
    with pytest.raises(lowvm.ProgramError, match=r"argument 'x' \(ptr<bfloat16>\)"):
        lowvm.interpret(double, 1000, x, np.zeros_like(x), adtype=lowvm.bfloat16)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_compile_and_the_launch_checks_see_the_resolved_type():
    from lowvm.runtime import LaunchError, ParamSpec

    compiled = lowvm.compile(double, arch="sm_80", adtype=lowvm.bfloat16)
    assert compiled.kernel.params[1] == ParamSpec("x", "pointer", lowvm.bfloat16)
    assert "__nv_bfloat16* __restrict__ x" in compiled.source
    y = torch.zeros(1000, dtype=torch.bfloat16)
    with pytest.raises(LaunchError, match=r"'x' \(pointer bfloat16\) must be a torch.bfloat16"):
        compiled.kernel.check_args((1000, torch.zeros(1000, dtype=torch.float16), y))


@pytest.mark.parametrize("value", ["bfloat16", 16, None])
def test_a_type_constant_that_is_not_a_data_type_is_refused(value):
    with pytest.raises(lowvm.ProgramError) as e:
        double.build(adtype=value)
    message = str(e.value)
    for part in ("double: the compile-time parameter 'adtype'", "['x', 'y']",
                 "vm.dtype_of('adtype')", "a lowvm data type", repr(value)):
        assert part in message, message
    assert "test_program.py" in message  # the user's line


def test_dtype_of_must_name_a_compile_time_parameter():
    with pytest.raises(lowvm.ProgramError) as e:
        @vm.program
        def wrong(x: vm.ptr[vm.dtype_of("atype")], adtype: vm.constexpr = vm.float16):
            vm.set_grid(1)

    for part in ("wrong: the pointer 'x'", "'atype'", "not a compile-time parameter",
                 "['adtype']"):
        assert part in str(e.value), str(e.value)


def test_dtype_of_takes_a_parameter_name():
    with pytest.raises(lowvm.ProgramError, match=r"vm.dtype_of: the name of a compile-time "
                       r"parameter, such as 'adtype', got 'a type'"):
        vm.ptr[vm.dtype_of("a type")]


@dataclass(frozen=True)
class Tiling:
    rows: int = 128
    cols: int = 4


@vm.program(warps=4, listing=lambda tiling: {"rows": tiling.rows, "cols": tiling.cols})
def tiled(n: vm.int32, x: vm.ptr[vm.float32], tiling: Tiling = Tiling()):  # noqa: B008
    vm.set_grid(vm.cdiv(n, tiling.rows * tiling.cols))


def test_a_constant_may_be_an_object_listed_field_by_field():
    program = tiled.build(tiling=Tiling(cols=2))
    assert program.constants == (("rows", 128), ("cols", 2))
    assert "[rows=128, cols=2]" in str(program)
    assert tiled.build(tiling=Tiling(cols=2)) is program  # hashable: it keys the cache


def test_a_constant_annotated_with_a_class_takes_its_instances():
    with pytest.raises(lowvm.ProgramError) as e:
        tiled.build(tiling={"rows": 128, "cols": 2})
    assert ("tiled: the compile-time parameter 'tiling' takes a Tiling, got "
            "{'rows': 128, 'cols': 2} (dict)") in str(e.value)
