"""Tiled ``c = a @ b`` in float16 with float32 accumulation, staged through shared memory.

Each block computes a ``bm x bn`` tile of ``c``. Per step of ``bk`` along K, the A and B
tiles are copied global -> shared asynchronously, then read into the MMA operand layouts
and multiplied on the tensor cores (``dot``). Sizes need not be multiples of the tile:
copies zero-fill outside the matrices and the final store is masked.
"""

from __future__ import annotations

import lowvm.lang as vm
from lowvm.layouts.mma_tiling import block_mma_layouts


@vm.program
def matmul_f16(m: vm.int32, n: vm.int32, k: vm.int32, a: vm.ptr[vm.float16],
               b: vm.ptr[vm.float16], c: vm.ptr[vm.float16], bm: int = 64, bn: int = 64,
               bk: int = 32, warps_m: int = 2, warps_n: int = 2, stages: int | None = None):
    """``c[m, n] = a[m, k] @ b[k, n]`` (row-major, float16 in and out)."""
    vm.set_warps(warps_m * warps_n)
    vm.set_grid(vm.cdiv(n, bn), vm.cdiv(m, bm))
    lay = block_mma_layouts(bm, bn, bk, warps_m, warps_n, vm.float16)
    ga, gb, gc = vm.global_view(a, [m, k]), vm.global_view(b, [k, n]), vm.global_view(c, [m, n])
    row0, col0 = vm.block_index(1) * bm, vm.block_index(0) * bn
    sa = vm.shared_tensor(vm.float16, [bm, bk])
    sb = vm.shared_tensor(vm.float16, [bk, bn])
    acc = vm.register_tensor(vm.float32, [bm, bn], lay.c, init=0.0)
    for kk in vm.range(vm.cdiv(k, bk), stages=stages):
        vm.copy_async(sa, ga, [row0, kk * bk])
        vm.copy_async(sb, gb, [kk * bk, col0])
        vm.commit_group()
        vm.wait_group(0)
        vm.sync()
        tile_a = vm.load_shared(sa, lay.a)
        tile_b = vm.load_shared(sb, lay.b)
        vm.dot(tile_a, tile_b, acc, out=acc)
        vm.sync()
    vm.store_global(gc, vm.cast(acc, vm.float16), [row0, col0])
    vm.free_shared(sa)
    vm.free_shared(sb)
