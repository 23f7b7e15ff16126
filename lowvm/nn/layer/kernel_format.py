"""The GPU kernel's repacked weight format, in torch: the fast torch path of the kernel
library's :class:`~lowvm.kernels.weight_format.WeightFormat` (the one format object;
geometry, tile sizes and the fingerprint's seed come from it).

:class:`~lowvm.nn.layer.quant_linear.QuantLinear` keeps its codes only in the layout
``quant_gemm`` reads (:func:`lowvm.kernels.quant_gemm.repack_weights`), on every device.
That layout belongs to the kernel library and changes with it, so nothing here restates
it. The first use of a ``(type, bk)`` runs the library's own numpy repacker on probe
weights of one ``bn x bk`` tile (all zeros, one code bit set everywhere, the bits of each
code's index) and reads off, for every bit of the tile's bytes, which bit of which code it
holds (and a constant it is XORed with). That map is checked against the library on a
pseudo-random weight of 2 x 2 tiles, in both directions; layers are then converted by
torch gathers on their own device, a tile block at a time. Should the library's format
ever not be such a per-bit map with tiles stored one after another (K tile major, then
N tile, as :func:`~lowvm.kernels.quant_gemm.repack_index` documents), the check fails and
conversion goes through the library's numpy functions instead: slower, still exact.

:attr:`KernelFormat.fingerprint` hashes the library's output on all those probes, so any
change of the format changes it; saved layers record it (see ``quant_linear``).

Earlier layouts the library can still produce (its ``order`` argument,
:data:`~lowvm.kernels.weight_format.STORED_ORDERS`: 3..7-bit floats were stored in the
plain MMA order before they took split_pairs) get fingerprints the same way, equal to the
ones earlier lowvm recorded. :func:`earlier_kernel_format` finds the one a saved record
names, so that a checkpoint in it is converted (unpacked in that layout, repacked in the
current one) instead of refused; :class:`LayoutConvertedWarning` says so.
"""

from __future__ import annotations

import functools
import hashlib
import math

import numpy as np
import torch

from lowvm.dtypes import DType
from lowvm.dtypes import dtype as as_dtype
from lowvm.kernels.weight_format import STORED_ORDERS, layer_weight_format, weight_format
from lowvm.nn.errors import QuantizationError

__all__ = ["KernelFormat", "kernel_format", "layer_kernel_format", "earlier_kernel_format",
           "LayoutConvertedWarning"]

_BITS_PER_BLOCK = 1 << 24  # bound on the uint8 bit tensor of one conversion step


def _bits(packed: np.ndarray) -> np.ndarray:
    """The bytes of ``packed`` (memory order) as bits, bit b of byte i at ``8 i + b``."""
    return np.unpackbits(np.ascontiguousarray(packed).reshape(-1), bitorder="little")


def _probe_codes(n: int, k: int, nbits: int) -> np.ndarray:
    """Deterministic pseudo-random codes (a fixed integer hash: the same on every host)."""
    x = np.arange(n * k, dtype=np.uint64) + np.uint64(0x632BE59BD9B4E019)
    for shift, mult in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = (x ^ (x >> np.uint64(shift))) * np.uint64(mult)
    x ^= x >> np.uint64(31)
    return ((x >> np.uint64(32)) & np.uint64((1 << nbits) - 1)).astype(np.uint8).reshape(n, k)


class KernelFormat:
    """Codes ``[N, K]`` <-> the repacked bytes of one ``(wtype, bk)``, in torch: the fast
    path of :attr:`format` (the library's :class:`WeightFormat`, which holds the geometry).

    ``fast``: the per-bit map was derived and checked (torch gathers on the tensors'
    device); otherwise the library's numpy repacker runs on the host. ``order``: the
    library's stored order (None: the one its kernels read).
    """

    def __init__(self, wtype: DType, bk: int, order: str | None = None) -> None:
        self.wtype, self.bk, self.order = wtype, bk, order
        self.format = weight_format(wtype, bk, order)
        self.schedule = self.format.schedule
        self.bn = self.format.bn
        self.chunk = self.format.chunk
        self.tile_bytes = self.format.tile_bytes
        nbits = wtype.nbits
        digest = hashlib.blake2b(self.format.key.encode(), digest_size=8)

        def repack(codes: np.ndarray) -> np.ndarray:
            out = np.ascontiguousarray(self.format.repack(codes))
            digest.update(repr(out.shape).encode())
            digest.update(out.tobytes())
            return out

        tile = self.bn * self.bk  # codes per tile, index p = n_local * bk + k_local
        zero = repack(np.zeros((self.bn, self.bk), np.uint8))
        const = _bits(zero)
        bit_hits = [(_bits(repack(np.full((self.bn, self.bk), 1 << b, np.uint8))) ^ const)
                    for b in range(nbits)]
        index = np.arange(tile).reshape(self.bn, self.bk)
        ones = (1 << nbits) - 1
        index_bits = [(_bits(repack(np.where((index >> j) & 1, ones, 0).astype(np.uint8)))
                       ^ const) for j in range(max(1, math.ceil(math.log2(tile))))]
        probe = _probe_codes(2 * self.bn, 2 * self.bk, nbits)
        expected = repack(probe)
        self.fingerprint = digest.hexdigest()

        self._tables: dict[torch.device, tuple[torch.Tensor, ...]] = {}
        self.fast = (zero.shape == self.format.shape(self.bn, self.bk)
                     and self._derive(const, bit_hits, index_bits, tile))
        if self.fast:
            self.fast = self._agrees(probe, expected)

    def _derive(self, const: np.ndarray, bit_hits: list[np.ndarray],
                index_bits: list[np.ndarray], tile: int) -> bool:
        """Read the per-bit map off the probes; False when it is not a bijection."""
        nbits = self.wtype.nbits
        hits = np.stack(bit_hits)  # [nbits, S]
        size = const.size
        if size != tile * nbits or not np.array_equal(hits.sum(axis=0), np.ones(size)):
            return False
        src_bit = hits.argmax(axis=0)
        src_code = sum(bits.astype(np.int64) << j for j, bits in enumerate(index_bits))
        flat = src_code * nbits + src_bit
        if src_code.max() >= tile or not np.array_equal(np.sort(flat), np.arange(size)):
            return False
        inverse = np.empty(size, np.int64)
        inverse[flat] = np.arange(size)
        self._src_code = src_code
        self._src_bit = src_bit.astype(np.uint8)
        self._const = const if const.any() else None
        self._inverse = inverse
        return True

    def _agrees(self, probe: np.ndarray, expected: np.ndarray) -> bool:
        """The derived map gives the library's bytes for ``probe`` and inverts them."""
        n, k = probe.shape
        if expected.shape != self.shape(n, k):
            return False
        mine = self._repack_fast(torch.from_numpy(probe))
        back = self._unpack_fast(torch.from_numpy(expected), n, k)
        return (np.array_equal(mine.numpy(), expected)
                and np.array_equal(back.numpy(), probe)
                and np.array_equal(self.format.unpack(expected, n, k), probe))

    def _device_tables(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        if device not in self._tables:
            const = (torch.zeros(0, dtype=torch.uint8) if self._const is None
                     else torch.from_numpy(self._const.copy()))
            self._tables[device] = tuple(t.to(device) for t in (
                torch.from_numpy(self._src_code), torch.from_numpy(self._src_bit), const,
                torch.from_numpy(self._inverse)))
        return self._tables[device]

    def shape(self, n: int, k: int) -> tuple[int, int]:
        """Shape of the repacked ``[N, K]`` weight (what ``repack_weights`` returns)."""
        self._check(n, k)
        return self.format.shape(n, k)

    def _check(self, n: int, k: int) -> None:
        if n % self.bn or k % self.bk:
            raise QuantizationError(f"the kernel's {self.wtype.name} weight format takes N a "
                                    f"multiple of {self.bn} and K of bk={self.bk}; got "
                                    f"N={n}, K={k}")

    def repack(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[N, K]`` (uint8, < 2**bits) -> repacked bytes, on the codes' device."""
        n, k = codes.shape
        self._check(n, k)
        if not self.fast:
            out = self.format.repack(codes.cpu().numpy())
            return torch.from_numpy(np.ascontiguousarray(out)).to(codes.device)
        return self._repack_fast(codes)

    def unpack(self, packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
        """The inverse of :meth:`repack`: codes ``[N, K]`` uint8 on the bytes' device."""
        if tuple(packed.shape) != self.shape(n, k):
            raise QuantizationError(f"a repacked {self.wtype.name} [{n}, {k}] weight has shape"
                                    f" {self.shape(n, k)}; got {tuple(packed.shape)}")
        if not self.fast:
            codes = self.format.unpack(packed.cpu().numpy(), n, k)
            return torch.from_numpy(codes.astype(np.uint8)).to(packed.device)
        return self._unpack_fast(packed, n, k)

    def _block(self) -> int:
        return max(1, _BITS_PER_BLOCK // (self.tile_bytes * 8))

    def _repack_fast(self, codes: torch.Tensor) -> torch.Tensor:
        n, k = codes.shape
        src_code, src_bit, const, _ = self._device_tables(codes.device)
        tiles = (codes.to(torch.uint8).reshape(n // self.bn, self.bn, k // self.bk, self.bk)
                 .permute(2, 0, 1, 3).reshape(-1, self.bn * self.bk))  # [KT * NT, tile]
        weights = (1 << torch.arange(8, device=codes.device)).to(torch.uint8)
        parts = []
        for block in tiles.split(self._block()):
            bits = (block.index_select(1, src_code) >> src_bit) & 1
            if const.numel():
                bits ^= const
            parts.append((bits.view(block.shape[0], -1, 8) * weights).sum(-1, dtype=torch.uint8))
        return torch.cat(parts).reshape(self.shape(n, k))

    def _unpack_fast(self, packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
        _, _, const, inverse = self._device_tables(packed.device)
        nbits = self.wtype.nbits
        shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
        weights = (1 << torch.arange(nbits, device=packed.device)).to(torch.uint8)
        parts = []
        for block in packed.reshape(-1, self.tile_bytes).split(self._block()):
            bits = ((block.unsqueeze(-1) >> shifts) & 1).reshape(block.shape[0], -1)
            if const.numel():
                bits ^= const
            code_bits = bits.index_select(1, inverse).view(block.shape[0], -1, nbits)
            parts.append((code_bits * weights).sum(-1, dtype=torch.uint8))
        tiles = torch.cat(parts).view(k // self.bk, n // self.bn, self.bn, self.bk)
        return tiles.permute(1, 2, 0, 3).reshape(n, k)


def kernel_format(wtype: DType | str, bk: int, order: str | None = None) -> KernelFormat:
    """The format of ``wtype`` weights with K tile ``bk`` (:func:`lowvm.kernels.
    weight_format.weight_bk` of the group size and K), derived once per process; ``order``
    None is the one the kernels read."""
    return _cached(as_dtype(wtype), bk, order)


class LayoutConvertedWarning(UserWarning):
    """A checkpoint's weights were saved in an earlier kernel layout and were converted
    while loading; saving the model again stores the current layout."""


def earlier_kernel_format(wtype: DType | str, bk: int, fingerprint: str | None
                          ) -> KernelFormat | None:
    """The earlier layout of ``wtype`` with K tile ``bk`` whose fingerprint is
    ``fingerprint``, or None (the current layout's, or one this lowvm cannot derive).

    Only orders the library still produces are tried, so a match is exact: the
    fingerprint hashes that layout's bytes on every probe weight."""
    current = kernel_format(wtype, bk)
    if fingerprint is None or fingerprint == current.fingerprint:
        return None
    for order in STORED_ORDERS:
        if order is not None:
            fmt = kernel_format(wtype, bk, order)
            if fmt.fingerprint == fingerprint:
                return fmt
    return None


def layer_kernel_format(wtype: DType | str, group: int, k: int) -> KernelFormat:
    """:func:`kernel_format` of a weight of ``k`` inputs in groups of ``group``
    (:func:`~lowvm.kernels.weight_format.layer_weight_format`)."""
    fmt = layer_weight_format(wtype, group, k)
    return _cached(fmt.wtype, fmt.bk, None)


@functools.cache
def _cached(wtype: DType, bk: int, order: str | None) -> KernelFormat:
    """Built on the CPU whatever default device is in force: the first format of a process
    may be asked for while transformers builds a model on the meta device (loading a
    checkpoint), where probe tensors would hold no data."""
    with torch.device("cpu"):
        return KernelFormat(wtype, bk, order)
