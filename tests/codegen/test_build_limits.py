"""What a kernel may not ask of its GPU is refused before any compiler runs: a register
tile beyond a thread's registers, more shared memory than the target arch allows, an
integer constant the kernel's int32 arithmetic cannot hold. ``generate_cuda`` takes
templates as ``compile`` and ``interpret`` do."""

import time

import numpy as np
import pytest

import lowvm
import lowvm.lang as vm
import lowvm.runtime.cache as cache
from lowvm.codegen.cuda import MAX_REGISTERS_PER_THREAD
from lowvm.kernels.vector_add import vector_add
from lowvm.runtime.arch_limits import shared_bytes_limit


def _line(mark: str) -> int:
    with open(__file__) as f:
        found = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# <- {mark}")]
    assert len(found) == 1
    return found[0]


@pytest.fixture
def no_compiler(monkeypatch):
    """Fail the test if a compiler is asked for a cubin."""
    def refuse(*args, **kwargs):
        raise AssertionError("the compiler ran")
    monkeypatch.setattr(cache._compiler, "compile_cubin", refuse)


@vm.program(warps=1)
def big_tile(x: vm.ptr[vm.float32], n: int = 1024):
    vm.set_grid(1)
    g = vm.global_view(x, [n, n])
    t = vm.load_global(g, [0, 0], [n, n], vm.spatial(1, 32).local(n, n // 32))  # <- tile
    vm.store_global(g, t, [0, 0])


def test_a_register_tile_beyond_a_threads_registers_is_refused_at_once(no_compiler):
    start = time.perf_counter()
    with pytest.raises(lowvm.ProgramError) as e:
        lowvm.compile(big_tile, arch="sm_80")
    assert time.perf_counter() - start < 30
    message = str(e.value)
    assert f"test_build_limits.py:{_line('tile')}" in message
    assert "float32[1024, 1024]" in message and "32768 elements (32768 32-bit registers)" in message
    assert f"at most {MAX_REGISTERS_PER_THREAD} registers" in message


@pytest.mark.parametrize("per_thread, dtype, fits", [
    (255, vm.float32, True), (256, vm.float32, False), (510, vm.float16, True),
    (512, vm.float16, False), (2040, vm.int4, True), (2048, vm.int4, False)])
def test_the_register_bound_counts_bits(per_thread, dtype, fits):
    @vm.program(warps=1)
    def prog(x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        vm.register_tensor(dtype, [32 * per_thread], vm.spatial(32).local(per_thread))

    program = prog.build()
    if fits:
        lowvm.generate_cuda(program)
    else:
        with pytest.raises(lowvm.ProgramError, match="a thread has at most 255 registers"):
            lowvm.generate_cuda(program)


@vm.program(warps=4, max_shared_bytes=227 * 1024)
def big_shared(x: vm.ptr[vm.float32], kib: int = 200):
    vm.set_grid(1)
    s = vm.shared_tensor(vm.float32, [kib, 256])
    vm.copy_async(s, vm.global_view(x, [kib, 256]), [0, 0])
    vm.commit_group()
    vm.wait_group(0)
    vm.free_shared(s)


def test_shared_memory_beyond_the_arch_is_refused_when_compiled(no_compiler):
    with pytest.raises(lowvm.ProgramError) as e:
        lowvm.compile(big_shared, arch="sm_80")
    assert "uses 204800 bytes of shared memory per block; sm_80 allows at most 166912 " \
           "(163 KiB)" in str(e.value)
    with pytest.raises(lowvm.ProgramError, match="sm_86 allows at most 101376 \\(99 KiB\\)"):
        lowvm.compile(big_shared, arch="sm_86")


def test_shared_memory_within_the_arch_compiles(monkeypatch, tmp_path):
    asked = []
    monkeypatch.setattr(cache._compiler, "compile_cubin",
                        lambda source, arch, **kw: asked.append(arch) or b"\x7fELF" + bytes(60))
    monkeypatch.setenv("LOWVM_CACHE_DIR", str(tmp_path))
    kernel = lowvm.compile(big_shared, arch="sm_90")
    assert asked == ["sm_90"] and kernel.cuda.shared_bytes == 204800


def test_the_arch_table():
    assert shared_bytes_limit("sm_90a") == shared_bytes_limit("sm_90") == 227 * 1024
    assert shared_bytes_limit("sm_80") == 163 * 1024
    assert shared_bytes_limit("sm_120") == 99 * 1024
    assert shared_bytes_limit("sm_999") is None  # unknown: the launch checks


def test_an_integer_constant_beyond_int32_is_refused_in_the_kernel():
    @vm.program(warps=1)
    def prog(n: vm.int32, x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        g = vm.global_view(x, [n])
        vm.store_global(g, vm.load_global(g, [n + 65536 * 65536], [32], vm.spatial(32)), [0])

    with pytest.raises(lowvm.ProgramError, match="constant 4294967296 .* does not fit int32"):
        lowvm.generate_cuda(prog)
    with pytest.raises(lowvm.InterpretError, match="does not fit int32"):
        lowvm.interpret(prog, 1, np.zeros(32, np.float32))


def test_generate_cuda_takes_a_template():
    from_template = lowvm.generate_cuda(vector_add, block=256)
    assert from_template.source == lowvm.generate_cuda(vector_add.build(block=256)).source
    with pytest.raises(lowvm.ProgramError, match="already built; constants \\['block'\\]"):
        lowvm.generate_cuda(vector_add.build(), block=256)
    with pytest.raises(lowvm.ProgramError, match="expected a lowvm Program or a @vm.program "
                                                 "function, got str"):
        lowvm.generate_cuda("vector_add")
