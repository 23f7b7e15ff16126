"""Compiling CUDA C++ to cubins: nvcc builds, ptxas resource reports, errors, the disk cache.

These run without a GPU (nvcc only needs the toolkit); tests that need nvcc are skipped,
with a reason, where it is not installed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import lowvm.runtime.compiler as compiler_mod
from lowvm.runtime import (
    CompileOptionError,
    RuntimeCompileError,
    cache_dir,
    cached_cubin,
    compile_cubin,
    find_nvcc,
    nvrtc_version,
    parse_ptxas_report,
    resource_usage,
)
from lowvm.runtime.cache import cache_key

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA toolkit) not installed")

HALF_KERNEL = r"""
#include <cuda_fp16.h>

extern "C" __global__ void add_half(__half* out, const __half* a, const __half* b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = __hadd(a[i], __hmul(b[i], __float2half(2.0f)));
    }
}
"""

# A local array indexed at run time cannot live in registers; with 256 floats live across
# the loop, ptxas must spill.
SPILL_KERNEL = r"""
extern "C" __global__ void __launch_bounds__(1024)
spills(float* out, const int* idx, int n) {
    float acc[256];
    #pragma unroll
    for (int i = 0; i < 256; ++i) acc[i] = out[i * n + threadIdx.x];
    for (int j = 0; j < n; ++j) acc[idx[j] & 255] += 1.0f;
    float s = 0.0f;
    #pragma unroll
    for (int i = 0; i < 256; ++i) s += acc[i] * acc[(i * 7) & 255];
    out[threadIdx.x] = s;
}
"""

BAD_KERNEL = """extern "C" __global__ void broken(float* out) {
    int x = 1;
    out[0] = x +* ;
    out[1] = 2.0f;
}
"""


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_compiles_half_kernel_to_elf(arch: str) -> None:
    cubin = compile_cubin(HALF_KERNEL, arch, compiler="nvcc")
    assert cubin.startswith(b"\x7fELF")
    assert b"add_half" in cubin  # extern "C": the symbol is unmangled


@needs_nvcc
def test_auto_compiler_produces_a_cubin() -> None:
    # NVRTC where it loads, else nvcc: either way an ELF cubin.
    assert compile_cubin(HALF_KERNEL, "sm_90a").startswith(b"\x7fELF")


@needs_nvcc
def test_resource_usage_small_kernel_does_not_spill() -> None:
    usage = resource_usage(HALF_KERNEL, "sm_80")
    assert set(usage) == {"add_half"}
    k = usage["add_half"]
    assert 0 < k["registers"] <= 64
    assert k["spill_store_bytes"] == 0 and k["spill_load_bytes"] == 0
    assert k["stack_bytes"] == 0 and k["shared_bytes"] == 0


@needs_nvcc
def test_resource_usage_reports_spills() -> None:
    k = resource_usage(SPILL_KERNEL, "sm_80")["spills"]
    assert k["spill_store_bytes"] > 0 and k["spill_load_bytes"] > 0
    assert k["stack_bytes"] > 0


def test_parse_ptxas_report() -> None:
    report = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'smem_k' for 'sm_80'
ptxas info    : Function properties for smem_k
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 4096 bytes smem, 360 bytes cmem[0]
ptxas info    : Compile time = 0.937 ms
ptxas info    : Compiling entry function '_Z3fooPf' for 'sm_80'
ptxas info    : Function properties for _Z3fooPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 6 registers, used 0 barriers, 356 bytes cmem[0]
"""
    usage = parse_ptxas_report(report)
    assert usage["smem_k"] == {
        "registers": 10,
        "spill_store_bytes": 4,
        "spill_load_bytes": 12,
        "stack_bytes": 8,
        "shared_bytes": 4096,
        "barriers": 1,
        "constant_bytes": 360,
        "cumulative_stack_bytes": 0,
    }
    assert usage["_Z3fooPf"]["registers"] == 6
    assert usage["_Z3fooPf"]["shared_bytes"] == 0


@needs_nvcc
def test_syntax_error_names_the_offending_line() -> None:
    with pytest.raises(RuntimeCompileError) as info:
        compile_cubin(BAD_KERNEL, "sm_80", compiler="nvcc")
    message = str(info.value)
    assert "out[0] = x +* ;" in message  # the offending line, numbered
    assert "> 3 |" in message
    assert "lowvm_kernel.cu(3)" in message  # the compiler log
    assert "nvcc" in message and "NVRTC" in message  # toolchain versions


@pytest.mark.parametrize("arch", ["compute_80", "80", "sm80", "", None])
def test_bad_arch_is_rejected(arch: object) -> None:
    with pytest.raises(CompileOptionError, match="arch must name a real GPU architecture"):
        compile_cubin(HALF_KERNEL, arch, compiler="nvcc")  # type: ignore[arg-type]


def test_bad_compiler_is_rejected() -> None:
    with pytest.raises(CompileOptionError, match="compiler must be one of"):
        compile_cubin(HALF_KERNEL, "sm_80", compiler="clang")


def test_bad_options_are_rejected() -> None:
    with pytest.raises(CompileOptionError, match="extra_options"):
        compile_cubin(HALF_KERNEL, "sm_80", compiler="nvcc", extra_options="-lineinfo")


@pytest.mark.skipif(nvrtc_version() is not None, reason="NVRTC is installed here")
def test_nvrtc_missing_is_named() -> None:
    with pytest.raises(RuntimeCompileError) as info:
        compile_cubin(HALF_KERNEL, "sm_80", compiler="nvrtc")
    message = str(info.value)
    assert "NVRTC" in message and "libnvrtc" in message
    assert "compiler='nvcc'" in message  # says what would work instead


def test_no_compiler_at_all_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiler_mod, "find_nvcc", lambda: None)
    monkeypatch.setattr(compiler_mod, "_nvrtc_probe", lambda: (None, "no libnvrtc here"))
    with pytest.raises(RuntimeCompileError, match="needs nvcc.*no libnvrtc here"):
        compile_cubin(HALF_KERNEL, "sm_80")


# -- the disk cache -------------------------------------------------------------------


class _CountingCompiler:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, source: str, arch: str, **kwargs: object) -> bytes:
        self.calls += 1
        return b"\x7fELF" + f"{arch}:{len(source)}:{self.calls}".encode()


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> _CountingCompiler:
    counter = _CountingCompiler()
    monkeypatch.setattr(compiler_mod, "compile_cubin", counter)
    monkeypatch.setattr(compiler_mod, "compiler_identity", lambda c="auto": ("nvcc", "99.9"))
    monkeypatch.setenv("LOWVM_CACHE_DIR", str(tmp_path / "cache"))
    return counter


def test_cache_hit_skips_the_compiler(counting: _CountingCompiler, tmp_path: Path) -> None:
    first = cached_cubin(HALF_KERNEL, "sm_80", "nvcc")
    second = cached_cubin(HALF_KERNEL, "sm_80", "nvcc")
    assert first == second and counting.calls == 1
    entries = list((tmp_path / "cache").rglob("*.cubin"))
    assert len(entries) == 1  # under LOWVM_CACHE_DIR
    assert not list((tmp_path / "cache").rglob("*.tmp"))  # no temporary file left behind
    cached_cubin(HALF_KERNEL, "sm_90", "nvcc")  # another arch is another entry
    cached_cubin(HALF_KERNEL + "\n", "sm_80", "nvcc")  # another source too
    assert counting.calls == 3


def test_corrupt_cache_entry_is_recompiled(counting: _CountingCompiler, tmp_path: Path) -> None:
    cubin = cached_cubin(HALF_KERNEL, "sm_80", "nvcc")
    (entry,) = (tmp_path / "cache").rglob("*.cubin")
    entry.write_bytes(entry.read_bytes()[:-3])  # truncated
    again = cached_cubin(HALF_KERNEL, "sm_80", "nvcc")
    assert counting.calls == 2 and again != cubin  # recompiled (the counter differs)
    assert cached_cubin(HALF_KERNEL, "sm_80", "nvcc") == again and counting.calls == 2


def test_cache_key_covers_compiler_version_and_options() -> None:
    base = cache_key("src", "sm_80", "nvcc", "13.0.88")
    assert cache_key("src", "sm_80", "nvcc", "13.0.88") == base
    assert cache_key("src", "sm_80", "nvcc", "13.1.0") != base
    assert cache_key("src", "sm_80", "nvrtc", "13.0.88") != base
    assert cache_key("src", "sm_80", "nvcc", "13.0.88", ("-lineinfo",)) != base


def test_cache_dir_follows_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LOWVM_CACHE_DIR", str(tmp_path / "explicit"))
    assert cache_dir() == tmp_path / "explicit"
    monkeypatch.delenv("LOWVM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "lowvm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path(os.path.expanduser("~/.cache/lowvm"))


@needs_nvcc
def test_cache_with_real_compiler(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LOWVM_CACHE_DIR", str(tmp_path))
    first = cached_cubin(HALF_KERNEL, "sm_80", "nvcc")
    assert first == compile_cubin(HALF_KERNEL, "sm_80", compiler="nvcc")
    calls: list[str] = []
    real = compiler_mod.compile_cubin
    monkeypatch.setattr(
        compiler_mod, "compile_cubin", lambda *a, **k: calls.append("x") or real(*a, **k)
    )
    assert cached_cubin(HALF_KERNEL, "sm_80", "nvcc") == first and calls == []
