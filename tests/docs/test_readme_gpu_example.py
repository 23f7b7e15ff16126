"""The README's GPU example generates and compiles (and runs where a GPU exists)."""

from __future__ import annotations

import shutil

import pytest

import lowvm
from lowvm.kernels.vector_add import vector_add


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_compile_without_gpu_for_a_named_arch():
    kernel = lowvm.compile(vector_add, arch="sm_80", compiler="nvcc", block=512)
    assert kernel.cubin[:4] == b"\x7fELF"
    assert "// %" in kernel.source and "load_global" in kernel.source
    assert kernel.grid((1000, None, None, None)) == (2, 1, 1)
