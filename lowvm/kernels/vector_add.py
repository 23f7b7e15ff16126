"""``c = a + b`` for float32 vectors of any length: the smallest complete VM program."""

from __future__ import annotations

import lowvm.lang as vm


@vm.program(warps=4)
def vector_add(n: vm.int32, a: vm.ptr[vm.float32], b: vm.ptr[vm.float32],
               c: vm.ptr[vm.float32], block: int = 512):
    """Each block adds ``block`` elements; the tail block's extra lanes are masked."""
    vm.static_assert(block % 128 == 0, "block must be a multiple of the 128 threads")
    vm.set_grid(vm.cdiv(n, block))
    ga, gb, gc = (vm.global_view(p, [n]) for p in (a, b, c))
    start = [vm.block_index() * block]
    layout = vm.spatial(128).local(block // 128)
    x = vm.load_global(ga, start, [block], layout)
    y = vm.load_global(gb, start, [block], layout)
    vm.store_global(gc, x + y, start)
