"""Shared-memory offsets of a per-thread access pattern, proven to be a base plus a constant.

An ``ldmatrix`` or ``cp.async`` lowering issues several accesses per thread (one per
``ldmatrix`` call, one per 16-byte chunk). Written out one by one, each access's swizzled
offset is a fresh expression of ``tid``: ~3 instructions per ``ldmatrix`` and ~19 per
``cp.async`` chunk in the decode loop's SASS (``python -m lowvm.bench.sass_profile``), as
many as the weight conversion itself. Most of them differ from one thread-dependent *base* offset by
a compile-time constant, added (rows a multiple of the swizzle period apart) or XORed
(columns inside one swizzled row): then the base is computed once, outside the main
loop, and each access costs at most one instruction.

Whether that holds is decided here by evaluating the access for **every thread** in
Python (numpy, the same layout functions the interpreter uses): a relation that holds
for every thread is emitted; anything else keeps the per-access expression. Nothing is
assumed about the swizzle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lowvm.layouts import SharedLayout

__all__ = ["Relation", "relation", "swizzled_offsets"]


@dataclass(frozen=True)
class Relation:
    """``offset = (base ^ xor) + add``: XOR for columns inside one swizzled row, the add
    for whole swizzle periods (rows) apart, which the compiler folds into the address."""

    xor: int = 0
    add: int = 0

    def apply(self, base: str) -> str:
        """The C expression of the related offset, given the base's."""
        expr = f"(({base}) ^ {self.xor})" if self.xor else f"({base})"
        return f"{expr} + {self.add}" if self.add else expr


def swizzled_offsets(layout: SharedLayout, index: Sequence[np.ndarray]) -> np.ndarray:
    """Element offsets of ``index`` (one int array per dim) in ``layout``, swizzle applied,
    the way ``CudaContext.shared_offset`` computes them in CUDA (no bounds check)."""
    linear = np.zeros(np.broadcast(*index).shape, dtype=np.int64)
    for i, stride in zip(index, layout.strides):
        linear = linear + np.asarray(i, dtype=np.int64) * stride
    return layout.swizzle(linear) if layout.swizzle else linear


def relation(base: np.ndarray, offsets: np.ndarray) -> Relation | None:
    """How ``offsets`` follow from ``base``, thread by thread, if one constant pair does it:
    the low bits of the first thread's offsets give the XOR, the rest the add."""
    if base.shape != offsets.shape or base.size == 0:
        return None
    b0, o0 = int(base.flat[0]), int(offsets.flat[0])
    for bits in range(0, 32):
        low = (1 << bits) - 1
        xor = (o0 & low) ^ (b0 & low)
        add = (o0 & ~low) - (b0 & ~low)
        if np.all(((base ^ xor) + add) == offsets):
            return Relation(xor, add)
    return None
