"""Instruction selection: mma.sync, ldmatrix (.trans) and cp.async chosen from layouts."""

from __future__ import annotations

import numpy as np

import lowvm
import lowvm.lang as vm
from lowvm.kernels.matmul_f16 import matmul_f16
from lowvm.kernels.quant_matmul import quant_matmul
from lowvm.layouts import mma_layouts, spatial
from lowvm.layouts.mma_tiling import block_mma_layouts
from lowvm.passes import run_passes
from lowvm.passes.instruction_selection import (
    CpAsyncPlan,
    LdmatrixPlan,
    MmaPlan,
    atom_outer,
)


def _by(program, mnemonic):
    return [i for i in run_passes(program).instructions() if i.mnemonic == mnemonic]


def test_dot_becomes_one_mma_per_atom_and_k_step():
    (dot,) = _by(matmul_f16.build(), "dot")
    assert isinstance(dot.impl, MmaPlan) and dot.impl.atom.name == "m16n8k16"
    # 64x64x32 on 2x2 warps: per warp 2x4 accumulator atoms x 2 k-steps
    assert len(dot.impl.steps) == 2 * 4 * 2
    assert len(set(dot.impl.steps)) == len(dot.impl.steps)


def test_atom_outer_recognises_compositions_only():
    lay = block_mma_layouts(32, 32, 32, 2, 2, lowvm.float16)
    atom = mma_layouts("m16n8k16", lowvm.float16)
    outer = atom_outer(lay.c, atom.c, (16, 8))
    assert outer is not None and outer.shape == (4, 2, 2)
    assert np.array_equal(outer[0, 0], [0, 0])
    assert atom_outer(spatial(16, 8).local(2, 2), atom.c, (16, 8)) is None


def test_ldmatrix_plain_for_a_and_transposed_for_row_major_b():
    loads = _by(matmul_f16.build(), "load_shared")
    plans = [i.impl for i in loads]
    assert all(isinstance(p, LdmatrixPlan) for p in plans)
    assert [p.trans for p in plans] == [False, True]     # A [M, K]; B [K, N] row-major
    assert all(n == 4 for p in plans for _, n in p.calls)


def test_copies_become_cp_async_and_the_rest_stays_generic():
    copies = _by(quant_matmul.build(wtype=lowvm.int4, group=64), "copy_async")
    assert isinstance(copies[0].impl, CpAsyncPlan) and copies[0].impl.access.nbytes == 16

    @vm.program(warps=4)
    def plain_dot(c: vm.ptr[vm.float32]):
        vm.set_grid(1)
        a = vm.register_tensor(vm.float16, [16, 16], vm.spatial(16, 8).local(1, 2), init=1.0)
        b = vm.register_tensor(vm.float16, [16, 8], vm.spatial(16, 8), init=1.0)
        acc = vm.register_tensor(vm.float32, [16, 8], vm.spatial(16, 8), init=0.0)
        vm.dot(a, b, acc, out=acc)
        vm.store_global(vm.global_view(c, [16, 8]), acc, [0, 0])

    (dot,) = _by(plain_dot.build(), "dot")
    assert dot.impl is None  # not an MMA composition: the generic lowering keeps it
