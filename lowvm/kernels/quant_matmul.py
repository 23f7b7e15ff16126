"""A first quantized matmul: ``y = x @ dequant(W)^T`` with group-wise scales.

``W`` is ``[N, K]`` of a 1..8-bit type stored as the dense bit stream of each row
(``K * bits / 8`` bytes per row, :func:`lowvm.dtypes.pack`); ``scales`` is
``[K / group, N]``, so ``dequant(W)[n, k] = W[n, k] * scales[k // group, n]``.

Per step of ``bk`` along K, each thread loads a run of packed *bytes* of one weight row
and ``view``s them as the low-bit type — no per-element unpacking — then casts to
float16 and applies its row's scale. The dequantised tile goes through shared memory
into the MMA B layout; ``x`` is staged by ``copy_async``. (Repacking the weights so
that the bytes land in the MMA layout directly is the kernel library's job.)
"""

from __future__ import annotations

import numpy as np

import lowvm.lang as vm
from lowvm.dtypes import DType, decode, pack, unpack
from lowvm.dtypes import dtype as as_dtype
from lowvm.layouts import permute, reduce
from lowvm.layouts.mma_tiling import block_mma_layouts

_THREADS_PER_ROW = 2


@vm.program
def quant_matmul(m: vm.int32, n: vm.int32, k: vm.int32, x: vm.ptr[vm.float16],
                 w: vm.ptr[vm.uint8], scales: vm.ptr[vm.float16], y: vm.ptr[vm.float16],
                 wtype: vm.constexpr = vm.int4, group: int = 64, bm: int = 32, bn: int = 64,
                 bk: int = 64, warps_m: int = 2, warps_n: int = 2, stages: int | None = None):
    """``y[m, n] = x[m, k] @ dequant(w)^T``; ``k`` a multiple of ``bk``, ``bk | group``."""
    bits = wtype.nbits
    threads = 32 * warps_m * warps_n
    vm.static_assert(group % bk == 0, f"bk={bk} must divide the group size {group}")
    vm.static_assert(threads == bn * _THREADS_PER_ROW,
                     f"the block's {threads} threads must be {_THREADS_PER_ROW} per row of bn")
    vm.static_assert((bk * bits) % (8 * _THREADS_PER_ROW) == 0,
                     f"bk={bk} of {bits}-bit values must split into whole bytes per thread")
    vm.set_warps(warps_m * warps_n)
    vm.set_grid(vm.cdiv(n, bn), vm.cdiv(m, bm))
    lay = block_mma_layouts(bm, bn, bk, warps_m, warps_n, vm.float16)

    row_bytes = k * bits // 8
    gx = vm.global_view(x, [m, k])
    gw = vm.global_view(w, [n, row_bytes])
    gs = vm.global_view(scales, [n, k // group], strides=[1, n])  # scales^T: [N, K/group]
    gy = vm.global_view(y, [m, n])
    row0, col0 = vm.block_index(1) * bm, vm.block_index(0) * bn

    bytes_per_thread = bk * bits // 8 // _THREADS_PER_ROW
    byte_layout = vm.spatial(bn, _THREADS_PER_ROW).local(1, bytes_per_thread)
    value_layout = vm.spatial(bn, _THREADS_PER_ROW).local(1, bk // _THREADS_PER_ROW)
    scale_layout = reduce(value_layout, [1], keepdims=True)

    sx = vm.shared_tensor(vm.float16, [bm, bk])
    sw = vm.shared_tensor(vm.float16, [bn, bk])
    acc = vm.register_tensor(vm.float32, [bm, bn], lay.c, init=0.0)
    for kk in vm.range(k // bk, stages=stages):
        vm.copy_async(sx, gx, [row0, kk * bk])
        vm.commit_group()
        packed = vm.load_global(gw, [col0, kk * bytes_per_thread * _THREADS_PER_ROW],
                                [bn, bytes_per_thread * _THREADS_PER_ROW], byte_layout)
        q = vm.view(packed, wtype, value_layout)
        scale = vm.load_global(gs, [col0, kk * bk // group], [bn, 1], scale_layout)
        vm.store_shared(sw, vm.cast(q, vm.float16) * scale)
        vm.wait_group(0)
        vm.sync()
        tile_x = vm.load_shared(sx, lay.a)
        tile_w = vm.transpose(vm.load_shared(sw, permute(lay.b, [1, 0])))
        vm.dot(tile_x, tile_w, acc, out=acc)
        vm.sync()
    vm.store_global(gy, vm.cast(acc, vm.float16), [row0, col0])
    vm.free_shared(sx)
    vm.free_shared(sw)



# ---------------------------------------------------------------------------------------
# host-side reference: quantise, pack, dequantise (numpy, float64)


def quantize_weights(weight: np.ndarray, wtype: DType | str, group: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest group-wise quantisation of ``weight [N, K]``.

    Returns ``(packed [N, K*bits/8] uint8, scales [K/group, N] float16)`` with each
    group's scale = absmax / the type's largest value (largest magnitude for uints).
    """
    from lowvm.kernels.quantize import quantize_to_codes

    wt = as_dtype(wtype)
    codes, scales = quantize_to_codes(weight, wt, group)
    return np.stack([pack(row, wt) for row in codes]), scales


def dequantize_weights(packed: np.ndarray, scales: np.ndarray, wtype: DType | str,
                       group: int, k: int) -> np.ndarray:
    """``dequant(W)[n, k] = W[n, k] * scales[k // group, n]`` in float64."""
    wt = as_dtype(wtype)
    values = np.stack([decode(unpack(row, wt, k), wt) for row in packed]).astype(np.float64)
    return values * np.repeat(scales.T.astype(np.float64), group, axis=1)
