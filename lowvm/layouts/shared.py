"""Shared-memory layouts: where each element of a shared tile lives, in elements.

A shared layout is an index function ``index -> offset``: strides (row-major,
column-major or any) followed by an optional XOR swizzle of the offset. The swizzle is
what lets ``ldmatrix`` read eight 16-byte rows from one column of a row-major tile
without bank conflicts: the 16-byte chunk number inside each 128-byte row segment is
XORed with the row number modulo 8, so the eight rows land in eight different bank
groups.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lowvm.dtypes import DType
from lowvm.dtypes import dtype as as_dtype
from lowvm.errors import LayoutError

__all__ = [
    "Swizzle",
    "SharedLayout",
    "shared_row_major",
    "shared_column_major",
    "shared_strided",
    "swizzle_128b",
    "staged_layout",
    "TMA_SWIZZLES",
    "tma_layout",
    "tma_swizzle_bytes",
]

#: the swizzle spans (bytes) of Hopper's tensor copies: 0 (none), 32, 64, 128
TMA_SWIZZLES = (0, 32, 64, 128)


@dataclass(frozen=True)
class Swizzle:
    """XOR ``bits`` bits of the offset, taken ``shift`` bits above ``base``, into ``base``.

    ``offset ^ ((offset >> shift) & (((1 << bits) - 1) << base))``: with ``base`` =
    log2(elements per 16 bytes) it permutes 16-byte chunks and never splits one.
    """

    bits: int
    base: int
    shift: int

    def __post_init__(self) -> None:
        if self.bits < 0 or self.base < 0 or self.shift < self.bits:
            raise LayoutError(
                f"Swizzle: need bits >= 0, base >= 0 and shift >= bits, got bits="
                f"{self.bits}, base={self.base}, shift={self.shift}"
            )

    def __call__(self, offset):
        mask = ((1 << self.bits) - 1) << self.base
        return offset ^ ((offset >> self.shift) & mask)


@dataclass(frozen=True)
class SharedLayout:
    """``offset(index) = swizzle(sum(index[d] * strides[d]))``, in elements."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    swizzle: Swizzle | None = None

    def __post_init__(self) -> None:
        shape = tuple(int(s) for s in self.shape)
        if not shape or any(s < 1 for s in shape):
            raise LayoutError(f"SharedLayout: shape must be positive sizes, got {self.shape}")
        if len(self.strides) != len(shape):
            raise LayoutError(
                f"SharedLayout: {len(self.strides)} strides for a rank-{len(shape)} shape"
            )
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def cosize(self) -> int:
        """Elements of storage the layout spans (largest offset + 1, before swizzle)."""
        return 1 + sum((s - 1) * st for s, st in zip(self.shape, self.strides))

    def offset(self, index: Sequence[int]) -> int:
        """The element offset of ``index``."""
        if len(index) != self.rank or any(not 0 <= i < s for i, s in zip(index, self.shape)):
            raise LayoutError(f"offset: index {tuple(index)} is outside the shape {self.shape}")
        linear = sum(int(i) * st for i, st in zip(index, self.strides))
        return self.swizzle(linear) if self.swizzle else linear

    def offsets(self) -> np.ndarray:
        """Every element's offset, as an int64 array of the tile's shape."""
        grids = np.indices(self.shape, dtype=np.int64)
        linear = sum(g * st for g, st in zip(grids, self.strides))
        return self.swizzle(linear) if self.swizzle else linear

    def is_bijective(self) -> bool:
        """True when no two elements share an offset and none falls outside ``cosize``."""
        offs = self.offsets().ravel()
        return len(np.unique(offs)) == offs.size and offs.max() < max(self.cosize, offs.size)


def _positive(shape: Sequence[int], what: str) -> tuple[int, ...]:
    out = []
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1:
            raise LayoutError(f"{what}: sizes must be positive integers, got {tuple(shape)}")
        out.append(int(s))
    if not out:
        raise LayoutError(f"{what}: shape must have at least one dimension")
    return tuple(out)


def shared_row_major(*shape: int) -> SharedLayout:
    """Contiguous, last dimension fastest."""
    dims = _positive(shape, "shared_row_major")
    strides = [math.prod(dims[d + 1 :]) for d in range(len(dims))]
    return SharedLayout(dims, tuple(strides))


def shared_column_major(*shape: int) -> SharedLayout:
    """Contiguous, first dimension fastest."""
    dims = _positive(shape, "shared_column_major")
    strides = [math.prod(dims[:d]) for d in range(len(dims))]
    return SharedLayout(dims, tuple(strides))


def shared_strided(shape: Sequence[int], strides: Sequence[int]) -> SharedLayout:
    """Any strides (e.g. a padded row pitch)."""
    return SharedLayout(_positive(shape, "shared_strided"), tuple(strides))


def swizzle_128b(rows: int, cols: int, dtype: DType | str) -> SharedLayout:
    """A row-major ``rows x cols`` tile with the 128-byte XOR swizzle, for ``ldmatrix``.

    Each row must be a power-of-two number of elements spanning at least 128 bytes;
    the 16-byte chunk index within each 128-byte segment is XORed with ``row % 8``.
    """
    dt = as_dtype(dtype)
    rows, cols = _positive((rows, cols), "swizzle_128b")
    if dt.nbits < 8 or 128 % (dt.nbits // 8) != 0:
        raise LayoutError(
            f"swizzle_128b: dtype must be a whole number of bytes dividing 16, got {dt.name}"
        )
    elem_bytes = dt.nbits // 8
    row_bytes = cols * elem_bytes
    if cols & (cols - 1) or row_bytes < 128:
        raise LayoutError(
            f"swizzle_128b: cols must be a power of two spanning >= 128 bytes, got "
            f"cols={cols} of {dt.name} ({row_bytes} bytes)"
        )
    base = int(math.log2(16 // elem_bytes))
    shift = int(math.log2(cols)) - base
    return SharedLayout((rows, cols), (cols, 1), Swizzle(bits=3, base=base, shift=shift))


def staged_layout(layout: SharedLayout, stages: int, elem_bits: int) -> SharedLayout:
    """``layout`` with a leading ``[stages]`` dim; each stage lays its tile out as before.

    The stage stride is a multiple of 16 bytes (vector and ``cp.async`` alignment) and of
    the swizzle's period (adding it commutes with the XOR), so stage ``s`` of the new
    layout is ``s * stride + layout``.
    """
    span = max(layout.cosize, int(layout.offsets().max()) + 1)
    unit = max(1, 128 // elem_bits)  # elements per 16 bytes
    sw = layout.swizzle
    if sw is not None:
        unit = math.lcm(unit, 1 << (sw.base + sw.shift + sw.bits))
    stride = -(-span // unit) * unit
    return SharedLayout((stages, *layout.shape), (stride, *layout.strides), sw)
def _tma_swizzle(span: int, elem_bytes: int) -> Swizzle | None:
    """The swizzle a tensor copy of swizzle span ``span`` bytes applies, in elements of
    ``elem_bytes``: 16-byte chunk ``c`` of each ``span``-byte row is stored at chunk
    ``c ^ (row % (span / 16))``, the row counted in 128-byte units of the tile."""
    if span == 0:
        return None
    bits = {32: 1, 64: 2, 128: 3}[span]
    return Swizzle(bits=bits, base=int(math.log2(16 // elem_bytes)), shift=3)


def tma_layout(shape: Sequence[int], dtype: DType | str, swizzle: int = 128) -> SharedLayout:
    """The row-major ``shape`` tile as a tensor copy (``vm.copy_tma``) writes it, with the
    copy's ``swizzle`` span in bytes (0, 32, 64 or 128).

    Why: the copy engine places each box row-major and XORs 16-byte chunks within each
    span-byte row segment by the 128-byte row number, so ``ldmatrix`` and ``wgmma`` read
    the tile without bank conflicts. With a swizzle, a row of the tile is exactly the
    span (its innermost dim spans ``swizzle`` bytes); ``swizzle=128`` over 16-bit
    elements is :func:`swizzle_128b`'s layout of 64-column rows.
    """
    dt = as_dtype(dtype)
    dims = _positive(shape, "tma_layout")
    if swizzle not in TMA_SWIZZLES:
        raise LayoutError(f"tma_layout: swizzle must be one of {TMA_SWIZZLES} bytes, got "
                          f"{swizzle!r}")
    if dt.nbits % 8 or dt.nbits > 64:
        raise LayoutError(f"tma_layout: the element type must be 1, 2, 4 or 8 bytes, got "
                          f"{dt.name}")
    elem = dt.nbits // 8
    if swizzle and dims[-1] * elem != swizzle:
        raise LayoutError(
            f"tma_layout: with swizzle={swizzle} the innermost dim must span exactly "
            f"{swizzle} bytes ({swizzle // elem} {dt.name}), got {dims[-1]}")
    strides = [math.prod(dims[d + 1:]) for d in range(len(dims))]
    return SharedLayout(dims, tuple(strides), _tma_swizzle(swizzle, elem))


def tma_swizzle_bytes(layout: SharedLayout, dtype: DType, box: Sequence[int]) -> int | None:
    """The swizzle span (0, 32, 64 or 128 bytes) a tensor copy of a row-major ``box``
    (the trailing dims of ``layout``) uses to produce ``layout``, or None where no copy
    can: the box must be ``layout``'s trailing dims stored row-major, each leading index
    selecting a whole box, under one of the copy's swizzles."""
    if dtype.nbits % 8:
        return None
    elem = dtype.nbits // 8
    rank = len(box)
    if rank > layout.rank or tuple(box) != layout.shape[layout.rank - rank:]:
        return None
    inner = [math.prod(box[d + 1:]) for d in range(rank)]
    if list(layout.strides[layout.rank - rank:]) != inner:
        return None
    size = math.prod(box)
    if any(st % size for st in layout.strides[:layout.rank - rank]):
        return None
    for span in TMA_SWIZZLES:
        if span and box[-1] * elem != span:
            continue
        want = _tma_swizzle(span, elem)
        if layout.swizzle == want:
            if span and any(st * elem % 1024 for st in layout.strides[:layout.rank - rank]):
                return None  # each box must start on a whole swizzle pattern (1024 bytes)
            return span
    return None
