"""The vectorization pass: widest legal access per thread, runtime guards where needed."""

from __future__ import annotations

import lowvm
import lowvm.lang as vm
from lowvm.kernels.quant_matmul import quant_matmul
from lowvm.layouts import SharedLayout, Swizzle, local, spatial, swizzle_128b
from lowvm.passes import run_passes
from lowvm.passes.vectorize import VectorAccess, register_run, shared_run


def _impls(program, mnemonic):
    return [i.impl for i in run_passes(program).instructions() if i.mnemonic == mnemonic]


def test_register_runs_follow_the_layout():
    assert register_run(spatial(4, 8).local(1, 8), 2) == 8      # 8 halves = 16 bytes
    assert register_run(spatial(4, 8).local(1, 16), 1) == 16     # 16 bytes of uint8
    assert register_run(spatial(4, 8).local(1, 16), 2) == 8      # capped at 16 bytes
    assert register_run(local(8, 1).spatial(4, 8), 2) == 1       # runs go down a column
    assert register_run(spatial(4, 8).local(1, 6), 2) == 2       # 6 = 3 aligned pairs


def test_weight_loads_are_16_bytes_with_a_runtime_guard():
    loads = _impls(quant_matmul.build(wtype=lowvm.int4, group=64), "load_global")
    weights = loads[0]
    assert isinstance(weights, VectorAccess) and weights.nbytes == 16
    # the row stride k*4/8 is a runtime value: the vector path is guarded by it
    assert weights.condition and "k" in str(weights.condition[0])


def test_shared_runs_respect_the_swizzle():
    @vm.program(warps=1)
    def stage(a: vm.ptr[vm.float16], swizzled: int = 1):
        vm.set_grid(1)
        layouts = [None, swizzle_128b(8, 64, vm.float16),
                   # XORs 8-byte units: a 16-byte run no longer lands contiguously
                   SharedLayout((8, 64), (64, 1), Swizzle(bits=3, base=2, shift=4))]
        sa = vm.shared_tensor(vm.float16, [8, 64], layouts[swizzled])
        t = vm.load_global(vm.global_view(a, [8, 64]), [0, 0], [8, 64],
                           vm.spatial(8, 4).local(1, 16))
        vm.store_shared(sa, t)
        vm.sync()
        vm.store_global(vm.global_view(a, [8, 64]), vm.load_shared(sa, t.layout), [0, 0])

    for swizzled, nbytes in ((0, 16), (1, 16), (2, 8)):
        prog = stage.build(swizzled=swizzled)
        stores = _impls(prog, "store_shared")
        assert isinstance(stores[0], VectorAccess) and stores[0].nbytes == nbytes, swizzled
        assert stores[0].condition == ()  # shared memory is proven at compile time
        sx = [i for i in prog.instructions() if i.mnemonic == "store_shared"][0]
        assert shared_run(sx.dst, sx.offsets, sx.src.layout) == nbytes // 2


def test_float32_atomic_runs_are_vector_reductions_on_sm90():
    from lowvm.driver import generate_cuda
    from tests.instructions.test_semantics import tile_sums

    plans = _impls(tile_sums.build(), "atomic_add")
    assert isinstance(plans[0], VectorAccess) and plans[0].nbytes == 16
    # cols and col0 are runtime values: the vector path is guarded by them
    assert {str(c) for c in plans[0].condition} >= {"((cols % 4) == 0)", "((col0 % 4) == 0)"}
    src = generate_cuda(tile_sums.build()).source
    vector = src.index("red.global.add.v4.f32")
    assert src.rindex("#if __CUDA_ARCH__ >= 900", 0, vector) > src.index("if (((")
    assert src.count("atomicAdd(") == 4 + 1  # sm_80's four adds per run, the generic path


def test_int32_atomics_stay_per_element():
    @vm.program(warps=1)
    def counts(c: vm.ptr[vm.int32]):
        vm.set_grid(2)
        t = vm.register_tensor(vm.int32, [128], vm.spatial(32).local(4), init=1)
        vm.atomic_add(vm.global_view(c, [128]), t, [0])

    assert _impls(counts.build(), "atomic_add") == [None]
