"""The README's main job: a short tour of lowvm's types and layouts.

Run with ``python -m lowvm.demo``. It prints a few low-bit data types with their
ranges and codes, packs a vector of int3 values into bytes, and draws the
``mma.sync.m16n8k16`` accumulator layout as a grid of ``thread:local`` cells.
"""

from __future__ import annotations

import numpy as np

import lowvm.dtypes as dtypes
from lowvm.dtypes import decode, encode, pack, unpack
from lowvm.layouts import mma_layouts, swizzle_128b, visualize
from lowvm.version import __version__


def main() -> None:
    """Print the tour."""
    print("lowvm", __version__)
    print("\n== data types ==")
    for dt in (dtypes.int3, dtypes.uint4, dtypes.float4_e2m1, dtypes.float6_e3m2,
               dtypes.float8_e4m3):
        codes = np.arange(2**dt.nbits, dtype=np.uint8)
        values = np.unique(decode(codes, dt))
        print(
            f"{dt.name:>13}: {dt.nbits} bits, range [{dt.min_value:g}, {dt.max_value:g}], "
            f"{len(values)} distinct values"
        )
    x = np.array([1.3, -2.0, 3.7, -4.2, 0.4], dtype=np.float32)
    codes = encode(x, dtypes.int3)
    packed = pack(codes, dtypes.int3)
    print(f"\nencode({x.tolist()}, int3) -> codes {codes.tolist()}")
    print(f"packed into {packed.nbytes} bytes: {[f'{b:08b}' for b in packed.tolist()]}")
    print(f"unpacked and decoded: {decode(unpack(packed, dtypes.int3, len(x)), dtypes.int3)}")

    print("\n== the m16n8k16 accumulator (C) layout ==")
    print(visualize(mma_layouts("m16n8k16", dtypes.float16).c))
    print("\n== the m16n8k16 A operand layout ==")
    print(visualize(mma_layouts("m16n8k16", dtypes.float16).a))
    print("\n== 128-byte swizzle, 8 rows x 64 float16: the 16-byte chunk each element lands in ==")
    print(visualize(swizzle_128b(8, 64, dtypes.float16)).splitlines()[0])
    chunks = swizzle_128b(8, 64, dtypes.float16).offsets()[:, ::8] % 64 // 8
    for row, c in enumerate(chunks):
        print(f"row {row}: chunks {c.tolist()}")


if __name__ == "__main__":
    main()
