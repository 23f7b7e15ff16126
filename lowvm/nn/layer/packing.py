"""Codes <-> the dense little-endian bit stream, and codes -> values, in torch.

The same format as :func:`lowvm.dtypes.pack` (element i at bits [i*N, (i+1)*N)), done
row-wise and vectorised so that quantizing a 4096x14336 layer takes a fraction of a second
instead of a Python loop per row.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from lowvm.dtypes import DType, decode

__all__ = ["pack_rows", "unpack_rows", "value_table"]


def pack_rows(codes: torch.Tensor, nbits: int) -> torch.Tensor:
    """``codes [R, C]`` (uint8, < 2**nbits) as ``[R, C*nbits/8]`` uint8 bit-stream rows."""
    rows, cols = codes.shape
    shifts = torch.arange(nbits, device=codes.device, dtype=torch.uint8)
    bits = (codes.to(torch.uint8).unsqueeze(-1) >> shifts) & 1  # [R, C, nbits], LSB first
    bits = bits.reshape(rows, cols * nbits // 8, 8)
    weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8, device=codes.device)
    return (bits * weights).sum(dim=-1, dtype=torch.uint8)  # no carries: distinct bits


def unpack_rows(packed: torch.Tensor, nbits: int, count: int) -> torch.Tensor:
    """The first ``count`` codes of each bit-stream row of ``packed [R, B]`` (uint8)."""
    rows = packed.shape[0]
    shifts = torch.arange(8, device=packed.device, dtype=torch.uint8)
    bits = (packed.unsqueeze(-1) >> shifts) & 1  # [R, B, 8]
    bits = bits.reshape(rows, -1)[:, : count * nbits].reshape(rows, count, nbits)
    weights = torch.tensor([1 << i for i in range(nbits)], dtype=torch.uint8,
                           device=packed.device)
    return (bits * weights).sum(dim=-1, dtype=torch.uint8)


@functools.cache
def _table(wtype: DType) -> np.ndarray:
    return decode(np.arange(2**wtype.nbits), wtype)


def value_table(wtype: DType, device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 value of every code of ``wtype`` (index = code), from lowvm.dtypes."""
    return torch.from_numpy(_table(wtype).copy()).to(device)
