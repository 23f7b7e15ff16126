"""The repacked weight format of the quantized GEMM: where each code of a ``bk x bn`` tile
sits, so that a thread's 16-byte loads are exactly its MMA B fragments.

:func:`weight_layouts` gives the register layouts of a tile (as loaded bytes and as
values in the MMA B order, 1..7-bit codes in :func:`stored_order`);
:func:`repack_weights` / :func:`unpack_repacked` turn plain codes into that format on the
host (numpy) and back. Every schedule reads the same format (``FORMAT_BN`` wide tiles of
``FORMAT_WARPS_N`` warps); the GPU programs of :mod:`lowvm.kernels.repack` write it too.
:class:`WeightFormat` is that format for one ``(wtype, bk)``, the object the weight
preparation and :mod:`lowvm.nn` hold.

Each of these takes an ``order`` (:data:`STORED_ORDERS`): None, the default, is the order
the kernels read; ``"plain"`` is the MMA order, in which earlier lowvm stored 3..7-bit
floats, so that their saved weights can be read back and stored again.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

import lowvm.lang as vm
from lowvm.dtypes import DType, pack, unpack
from lowvm.dtypes import dtype as as_dtype
from lowvm.errors import LayoutError
from lowvm.ir import ProgramError
from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.layouts import RegisterLayout, local, reduce, spatial, split_pairs
from lowvm.layouts.cast_recipe import pair_span
from lowvm.layouts.mma_tiling import BlockMmaLayouts, block_mma_layouts

__all__ = ["WeightLayouts", "weight_layouts", "stored_order", "schedule_layouts",
           "repack_index", "repack_weights", "unpack_repacked", "interleave_chunks",
           "deinterleave_chunks", "FORMAT_BN", "FORMAT_WARPS_N", "WeightFormat",
           "weight_format", "weight_bk", "layer_weight_format", "STORED_ORDERS"]

#: the ``order`` arguments: None, the order the kernels read (:func:`stored_order`), or
#: "plain", the MMA order (what 3..7-bit floats were stored in before they took
#: split_pairs; kept so that such checkpoints can be converted)
STORED_ORDERS = (None, "plain")


def _check_order(order: str | None) -> None:
    if order not in STORED_ORDERS:
        raise LayoutError(f"weight format: order must be one of {list(STORED_ORDERS)}; "
                          f"got {order!r}")


@dataclass(frozen=True)
class WeightLayouts:
    """Register layouts of a weight tile: as loaded bytes and as MMA B-operand values."""

    mma: BlockMmaLayouts
    bytes_per_thread: int
    rows: int  # threads with distinct bytes (warps along N x 32)
    chunk: int  # bytes per load instruction (16, 8 or 4)
    packed: RegisterLayout  # uint8 [vectors * rows, chunk]: vector v of thread t at row v*rows+t
    values: RegisterLayout  # wtype [bk, bn]: mma.b's elements in stored order (stored_order)
    packed_3d: RegisterLayout  # ``packed`` as uint8 [vectors, rows, chunk] (same local order)

    @property
    def vectors(self) -> int:
        """Load instructions per thread per tile."""
        return self.bytes_per_thread // self.chunk

    @property
    def tile_rows(self) -> int:
        """Rows of ``chunk`` bytes one tile occupies in the repacked weight."""
        return self.vectors * self.rows


def weight_layouts(wtype: DType, bm: int, bn: int, bk: int, warps_m: int, warps_n: int,
                   adtype: DType = vm.float16, order: str | None = None) -> WeightLayouts:
    """How a ``bk x bn`` tile of ``wtype`` sits in registers (see module docstring).

    The B layout of m16n8k16 is the same for float16 and bfloat16, so one repacked
    format serves both activation types.
    """
    lay = block_mma_layouts(bm, bn, bk, warps_m, warps_n, adtype)
    bits = lay.b.local_size * wtype.nbits
    if bits % 8:
        raise ProgramError(
            f"quant_gemm: a thread's {lay.b.local_size} {wtype.name} values are {bits} bits, "
            "not whole bytes; use a larger bk or bn")
    rows, nbytes = warps_n * 32, bits // 8
    chunk = next(c for c in (16, 8, 4, 2, 1) if nbytes % c == 0)
    # a thread's bytes are `vectors` chunks; chunk v of all threads is contiguous, so each
    # load instruction of a warp reads 32 consecutive chunks (fully used sectors)
    packed = local(nbytes // chunk, 1) * (reduce(spatial(warps_m, rows, 1), [0])
                                          * local(1, chunk))
    packed_3d = local(nbytes // chunk, 1, 1) * (reduce(spatial(warps_m, 1, rows, 1), [0])
                                                * local(1, 1, chunk))
    return WeightLayouts(lay, nbytes, rows, chunk, packed,
                         stored_order(lay.b, wtype, adtype, order), packed_3d)


def stored_order(values: RegisterLayout, wtype: DType, adtype: DType,
                 order: str | None = None) -> RegisterLayout:
    """The order a thread's codes are stored in: ``values`` (the MMA order), or for
    1..7-bit types its :func:`~lowvm.layouts.split_pairs` order, in which the
    bit-trick cast yields MMA register pairs directly (no ``prmt`` for 1/2/4 bits; see
    :func:`~lowvm.layouts.cast_recipe.pair_span`); ``cast(..., layout=values)`` turns one
    into the other by renaming registers. ``order="plain"`` gives ``values`` always
    (:data:`STORED_ORDERS`)."""
    if order is not None:
        _check_order(order)
        return values
    span = pair_span(wtype, adtype, values.local_size)
    return values if span is None else split_pairs(values, span)


def interleave_chunks(per_thread: Any, lw: WeightLayouts) -> Any:
    """Bytes ``[tiles * rows, bytes_per_thread]`` (each thread's registers in order) ->
    the stored order ``[tiles * vectors * rows, chunk]`` (numpy or torch)."""
    v = lw.vectors
    return per_thread.reshape(-1, lw.rows, v, lw.chunk).swapaxes(1, 2).reshape(-1, lw.chunk)


def deinterleave_chunks(stored: Any, lw: WeightLayouts) -> Any:
    """The inverse of :func:`interleave_chunks`."""
    v = lw.vectors
    return stored.reshape(-1, v, lw.rows, lw.chunk).swapaxes(1, 2).reshape(
        -1, lw.bytes_per_thread)


#: the repacked format's N tile and its warps (16 columns each): every schedule reads it
FORMAT_BN = 64
FORMAT_WARPS_N = 4


def repack_index(wtype: DType | str, n: int, schedule: GemmSchedule,
                 order: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Where a repacked K tile's values come from: ``(rows [NT, T, L], cols [T, L])``.

    Tile ``kt`` of the repacked weight is ``pack(codes[rows, kt * bk + cols])``: for each
    N tile, each thread with distinct data (T of them) and each of its L values in
    register order. One K tile at a time keeps the index arrays small.
    """
    lw = schedule_layouts(wtype, schedule, order)
    table = np.asarray(lw.values.table[: lw.rows])  # [T, L, (k, n)]
    rows = np.arange(n // schedule.bn)[:, None, None] * schedule.bn + table[None, :, :, 1]
    return rows, table[:, :, 0]


def schedule_layouts(wtype: DType | str, schedule: GemmSchedule, order: str | None = None
                     ) -> WeightLayouts:
    """:func:`weight_layouts` of a schedule."""
    s = schedule
    return weight_layouts(as_dtype(wtype), s.bm, s.bn, s.bk, s.warps_m, s.warps_n,
                          order=order)


def repack_weights(codes: np.ndarray, wtype: DType | str, schedule: GemmSchedule,
                   order: str | None = None) -> np.ndarray:
    """Codes ``[N, K]`` (integers of ``wtype``) -> repacked bytes for :func:`quant_gemm`."""
    wt = as_dtype(wtype)
    n, k = codes.shape
    rows, cols = repack_index(wt, n, schedule, order)
    stream = np.stack([codes[rows, kt * schedule.bk + cols] for kt in range(k // schedule.bk)])
    lw = schedule_layouts(wt, schedule, order)
    per_thread = pack(stream.reshape(-1), wt).reshape(-1, lw.bytes_per_thread)
    return interleave_chunks(per_thread, lw)


def unpack_repacked(packed: np.ndarray, wtype: DType | str, n: int, k: int,
                    schedule: GemmSchedule, order: str | None = None) -> np.ndarray:
    """The inverse of :func:`repack_weights`: codes ``[N, K]``."""
    wt = as_dtype(wtype)
    rows, cols = repack_index(wt, n, schedule, order)
    tiles = k // schedule.bk
    per_thread = deinterleave_chunks(packed, schedule_layouts(wt, schedule, order))
    values = unpack(per_thread.reshape(-1), wt, tiles * rows.size).reshape(tiles, *rows.shape)
    codes = np.zeros((n, k), dtype=values.dtype)
    for kt in range(tiles):
        codes[rows, kt * schedule.bk + cols] = values[kt]
    return codes


@dataclass(frozen=True)
class WeightFormat:
    """The repacked format of ``wtype`` weights with K tile ``bk``: ``bn``-wide N tiles read
    by ``warps_n`` warps, whatever schedule then reads them; ``order`` None is the one the
    kernels read (:data:`STORED_ORDERS`)."""

    wtype: DType
    bk: int
    bn: int = FORMAT_BN
    warps_n: int = FORMAT_WARPS_N
    order: str | None = None

    def __post_init__(self) -> None:
        _check_order(self.order)

    @property
    def schedule(self) -> GemmSchedule:
        """The schedule whose tiles define the format (every schedule reads its tiles)."""
        return GemmSchedule(bn=self.bn, bk=self.bk, warps_n=self.warps_n)

    @property
    def layouts(self) -> WeightLayouts:
        """Register layouts of one format tile."""
        return schedule_layouts(self.wtype, self.schedule, self.order)

    @property
    def chunk(self) -> int:
        """Bytes per row of the repacked weight (one load instruction of a thread)."""
        return self.layouts.chunk

    @property
    def tile_rows(self) -> int:
        """Rows of :attr:`chunk` bytes one ``bn x bk`` tile occupies."""
        return self.layouts.tile_rows

    @property
    def tile_bytes(self) -> int:
        """Bytes of one ``bn x bk`` tile (tiles are stored K tile major, then N tile)."""
        return self.tile_rows * self.chunk

    @property
    def key(self) -> str:
        """What names the format apart from its bytes (the seed of a fingerprint). The
        order is not in it: it shows in the bytes, and an earlier order's fingerprint is
        then the one earlier lowvm computed."""
        return f"{self.wtype.name}/bk={self.bk}/bn={self.bn}"

    def shape(self, n: int, k: int) -> tuple[int, int]:
        """Shape of the repacked ``[n, k]`` weight (``n`` a multiple of bn, ``k`` of bk)."""
        return (n // self.bn) * (k // self.bk) * self.tile_rows, self.chunk

    def repack(self, codes: np.ndarray) -> np.ndarray:
        """Codes ``[N, K]`` -> the repacked bytes (:func:`repack_weights`)."""
        return repack_weights(codes, self.wtype, self.schedule, self.order)

    def unpack(self, packed: np.ndarray, n: int, k: int) -> np.ndarray:
        """Repacked bytes -> codes ``[N, K]`` (:func:`unpack_repacked`)."""
        return unpack_repacked(packed, self.wtype, n, k, self.schedule, self.order)


@functools.cache
def _weight_format(wtype: DType, bk: int, order: str | None) -> WeightFormat:
    return WeightFormat(wtype, bk, order=order)


def weight_format(wtype: DType | str, bk: int, order: str | None = None) -> WeightFormat:
    """The :class:`WeightFormat` of ``wtype`` with K tile ``bk`` (one object per pair) in
    ``order`` (None: the kernels')."""
    _check_order(order)
    return _weight_format(as_dtype(wtype), bk, order)


def weight_bk(group: int, k: int) -> int:
    """The K tile of the repacked format: 128, or the group when it is smaller."""
    g = k if group in (-1, k) else group
    return min(128, g)


def layer_weight_format(wtype: DType | str, group: int, k: int) -> WeightFormat:
    """The :class:`WeightFormat` a weight of ``k`` inputs in groups of ``group`` is stored in."""
    return weight_format(wtype, weight_bk(group, k))
