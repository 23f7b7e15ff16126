"""The offline weight repacking as VM programs: plain packed rows <-> ``quant_gemm``'s format.

``repack_weights`` / ``unpack_repacked`` (numpy, in :mod:`lowvm.kernels.quant_gemm`) are
the reference; these programs do the same on the GPU, and the interpreter checks them
against it. Repacking only moves ``N``-bit codes, so every ``N``-bit type (int, uint or
eXmY) is handled as ``uintN``: each block takes one ``bk x 64`` weight tile, views its
plain bytes as codes, widens them to bytes in shared memory (``[64, bk]``, one row per
output channel), then every thread reads back the codes it will hold in the MMA B
layout, in the stored order (:func:`~lowvm.kernels.quant_gemm.stored_order`), narrows
them to ``N`` bits and stores its 16-byte chunks. The inverse runs the same path
backwards.

Shapes: ``w_plain`` is ``[n, k * N / 8]`` bytes (each row a little-endian bit stream of
codes along K, as ``lowvm.dtypes.pack`` and checkpoints store them), ``n`` a multiple of
64, ``k`` of ``bk``; ``bk`` is the format's K tile (``min(128, group)``).
"""

from __future__ import annotations

import lowvm.lang as vm
from lowvm.dtypes import DType, dtype
from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.kernels.weight_format import schedule_layouts
from lowvm.layouts import permute

__all__ = ["repack_program", "unpack_program"]

_BN, _THREADS = 64, 128


def _tiles(wtype: DType, bk: int):
    """(codes type, stored-format layouts, plain-row layout of one tile)."""
    codes = dtype(f"uint{wtype.nbits}")
    lw = schedule_layouts(wtype, GemmSchedule(bk=bk))  # the order depends on wtype's cast
    vm.static_assert(bk * wtype.nbits % 16 == 0,
                     f"bk={bk} {wtype.nbits}-bit codes do not split into two whole-byte "
                     "halves per row")
    # plain rows: thread (n, h) holds half h of row n's bk codes (whole bytes)
    plain = vm.spatial(_BN, 2).local(1, bk // 2)
    return codes, lw, plain


@vm.program(warps=4)
def repack_program(n: vm.int32, k: vm.int32, w_plain: vm.ptr[vm.uint8],
                   w_out: vm.ptr[vm.uint8], wtype: vm.constexpr = vm.int4, bk: int = 128):
    """``w_out`` = ``repack_weights(codes, wtype, GemmSchedule(bk=bk))`` of the codes
    packed in ``w_plain``; one block per (64-column, bk) tile."""
    codes, lw, plain = _tiles(wtype, bk)
    nbytes = bk * wtype.nbits // 8
    n_tiles = n // _BN
    vm.set_grid(n_tiles, k // bk)
    nt, kt = vm.block_index(0), vm.block_index(1)
    src = vm.global_view(w_plain, [n, k * wtype.nbits // 8])
    raw = vm.load_global(src, [nt * _BN, kt * nbytes], [_BN, nbytes],
                         vm.spatial(_BN, 2).local(1, nbytes // 2))
    wide = vm.cast(vm.view(raw, codes, plain), vm.uint8)  # [64 n, bk k], one byte a code
    st = vm.shared_tensor(vm.uint8, [_BN, bk])
    vm.store_shared(st, wide, [0, 0])
    vm.sync()
    mine = vm.load_shared(st, permute(lw.values, [1, 0]), [0, 0], [_BN, bk])
    narrow = vm.cast(vm.transpose(mine), codes)  # [bk, 64] in the stored order
    dst = vm.global_view(w_out, [(k // bk) * n_tiles * lw.tile_rows, lw.chunk])
    vm.store_global(dst, vm.view(narrow, vm.uint8, lw.packed),
                    [(kt * n_tiles + nt) * lw.tile_rows, 0])
    vm.free_shared(st)


@vm.program(warps=4)
def unpack_program(n: vm.int32, k: vm.int32, w_packed: vm.ptr[vm.uint8],
                   w_plain: vm.ptr[vm.uint8], wtype: vm.constexpr = vm.int4,
                   bk: int = 128):
    """The inverse of :func:`repack_program` (``unpack_repacked``, then plain rows)."""
    codes, lw, plain = _tiles(wtype, bk)
    nbytes = bk * wtype.nbits // 8
    n_tiles = n // _BN
    vm.set_grid(n_tiles, k // bk)
    nt, kt = vm.block_index(0), vm.block_index(1)
    src = vm.global_view(w_packed, [(k // bk) * n_tiles * lw.tile_rows, lw.chunk])
    raw = vm.load_global(src, [(kt * n_tiles + nt) * lw.tile_rows, 0],
                         [lw.tile_rows, lw.chunk], lw.packed)
    wide = vm.cast(vm.view(raw, codes, lw.values), vm.uint8)  # [bk, 64]
    st = vm.shared_tensor(vm.uint8, [_BN, bk])
    vm.store_shared(st, vm.transpose(wide), [0, 0])
    vm.sync()
    mine = vm.load_shared(st, plain, [0, 0], [_BN, bk])
    dst = vm.global_view(w_plain, [n, k * wtype.nbits // 8])
    vm.store_global(dst, vm.view(vm.cast(mine, codes), vm.uint8,
                                 vm.spatial(_BN, 2).local(1, nbytes // 2)),
                    [nt * _BN, kt * nbytes])
    vm.free_shared(st)
