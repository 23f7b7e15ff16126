"""Float32 to any 1..8-bit type, packed, and back: ``cast`` and ``view`` at work.

``pack_lowbit`` rounds float32 values to ``wtype`` and writes them as the dense
little-endian bit stream of :func:`lowvm.dtypes.pack`: each thread holds 8 consecutive
values, i.e. exactly ``wtype.nbits`` bytes, and a ``view`` turns those values into bytes
without moving data between threads. ``unpack_lowbit`` is the inverse.
"""

from __future__ import annotations

import lowvm.lang as vm

_THREADS = 128
_PER_THREAD = 8  # 8 values of N bits are N whole bytes


@vm.program(warps=_THREADS // 32)
def pack_lowbit(n: vm.int32, x: vm.ptr[vm.float32], packed: vm.ptr[vm.uint8],
                wtype: vm.constexpr = vm.int4):
    """``packed = pack(encode(x, wtype))``; ``n`` must be a multiple of 8."""
    bits = wtype.nbits
    block = _THREADS * _PER_THREAD
    vm.set_grid(vm.cdiv(n, block))
    gx = vm.global_view(x, [n])
    gp = vm.global_view(packed, [n * bits // 8])
    b = vm.block_index()
    values = vm.load_global(gx, [b * block], [block], vm.spatial(_THREADS).local(_PER_THREAD))
    low = vm.cast(values, wtype)
    as_bytes = vm.view(low, vm.uint8, vm.spatial(_THREADS).local(bits))
    vm.store_global(gp, as_bytes, [b * block * bits // 8])


@vm.program(warps=_THREADS // 32)
def unpack_lowbit(n: vm.int32, packed: vm.ptr[vm.uint8], y: vm.ptr[vm.float32],
                  wtype: vm.constexpr = vm.int4):
    """``y = decode(unpack(packed, wtype, n))``; ``n`` must be a multiple of 8."""
    bits = wtype.nbits
    block = _THREADS * _PER_THREAD
    vm.set_grid(vm.cdiv(n, block))
    gp = vm.global_view(packed, [n * bits // 8])
    gy = vm.global_view(y, [n])
    b = vm.block_index()
    raw = vm.load_global(gp, [b * block * bits // 8], [_THREADS * bits],
                         vm.spatial(_THREADS).local(bits))
    low = vm.view(raw, wtype, vm.spatial(_THREADS).local(_PER_THREAD))
    vm.store_global(gy, vm.cast(low, vm.float32), [b * block])


@vm.program(warps=_THREADS // 32)
def cast_roundtrip(n: vm.int32, x: vm.ptr[vm.float32], y: vm.ptr[vm.float32],
                   wtype: vm.constexpr = vm.int4):
    """``y = float32(wtype(x))`` for any length ``n``."""
    block = _THREADS * _PER_THREAD
    vm.set_grid(vm.cdiv(n, block))
    gx, gy = vm.global_view(x, [n]), vm.global_view(y, [n])
    start = [vm.block_index() * block]
    values = vm.load_global(gx, start, [block], vm.spatial(_THREADS).local(_PER_THREAD))
    vm.store_global(gy, vm.cast(vm.cast(values, wtype), vm.float32), start)
