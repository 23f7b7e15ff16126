"""torch's int4 "tinygemm" kernel as a baseline: quantise, pack, call, dequantise.

Conventions (torch >= 2.5, as torch's own ``test__int4_mm`` in test/test_linalg.py uses
them, bf16 activations):

* codes ``q[n, k]`` are unsigned 0..15; one bf16 ``scale`` and ``zero`` per (group,
  column), stored as ``scales_and_zeros[k // group, n, :] = (scale, zero)``;
  ``dequant(W)[n, k] = (q[n, k] - 8) * scale + zero`` (asymmetric: ``zero`` is the
  group's minimum plus ``8 * scale``);
* on CUDA, ``torch.ops.aten._convert_weight_to_int4pack(w, inner_k_tiles)`` takes
  ``w`` uint8 ``[N, K/2]`` with ``w[n, j] = q[n, 2j] << 4 | q[n, 2j + 1]``; on the CPU,
  ``_convert_weight_to_int4pack_for_cpu`` takes the int32 codes ``[N, K]``;
* ``torch.ops.aten._weight_int4pack_mm(x, packed, group, scales_and_zeros)`` returns
  ``x @ dequant(W)^T`` in ``x``'s dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lowvm.bench.errors import BenchError

__all__ = [
    "TINYGEMM_GROUPS",
    "TinygemmWeight",
    "inner_k_tiles",
    "quantize",
    "dequantize",
    "pack_nibbles",
    "prepare",
    "run",
]

TINYGEMM_GROUPS = (32, 64, 128, 256)


@dataclass
class TinygemmWeight:
    """Codes, scales/zeros and the packed operand of one weight."""

    codes: Any              # int32 [N, K], 0..15
    scales_and_zeros: Any   # bf16 [K / group, N, 2]
    packed: Any             # what _weight_int4pack_mm takes
    group: int
    device: str


def inner_k_tiles(k: int) -> int:
    """The largest of 8, 4, 2 with ``K % (16 * tiles) == 0``: how many 16-wide K tiles
    the packed layout interleaves."""
    for tiles in (8, 4, 2):
        if k % (16 * tiles) == 0:
            return tiles
    raise BenchError(f"tinygemm: K={k} must be a multiple of 32")


def _check(k: int, n: int, group: int) -> None:
    if group not in TINYGEMM_GROUPS:
        raise BenchError(f"tinygemm: group={group} is not supported; it takes "
                         f"{', '.join(map(str, TINYGEMM_GROUPS))}")
    if k % group:
        raise BenchError(f"tinygemm: group={group} must divide K={k}")
    if n % 8:
        raise BenchError(f"tinygemm: N={n} must be a multiple of 8")
    inner_k_tiles(k)


def quantize(weight: Any, group: int) -> tuple[Any, Any]:
    """Asymmetric 4-bit round-to-nearest per group of ``weight [N, K]``:
    ``(codes int32 [N, K], scales_and_zeros bf16 [K/group, N, 2])``."""
    import torch

    n, k = weight.shape
    _check(k, n, group)
    w = weight.to(torch.float32).reshape(n, k // group, group)
    lo = w.amin(dim=2, keepdim=True)
    hi = w.amax(dim=2, keepdim=True)
    scale = ((hi - lo).clamp(min=1e-6) / 15).to(torch.bfloat16)
    zero = (lo + scale.float() * 8).to(torch.bfloat16)
    codes = ((w - lo) / scale.float()).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    sz = torch.cat([scale, zero], dim=2)           # [N, K/group, 2]
    return codes, sz.transpose(0, 1).contiguous()  # [K/group, N, 2]


def dequantize(codes: Any, scales_and_zeros: Any, group: int) -> Any:
    """``(q - 8) * scale + zero`` in float64, ``[N, K]``."""
    import torch

    scale = scales_and_zeros[..., 0].to(torch.float64).t()  # [N, K/group]
    zero = scales_and_zeros[..., 1].to(torch.float64).t()
    expand = lambda t: t.repeat_interleave(group, dim=1)  # noqa: E731
    return (codes.to(torch.float64) - 8) * expand(scale) + expand(zero)


def pack_nibbles(codes: Any) -> Any:
    """The CUDA packer's input: uint8 ``[N, K/2]``, even k in the high nibble."""
    import torch

    return ((codes[:, 0::2] << 4) | codes[:, 1::2]).to(torch.uint8)


def prepare(weight: Any, group: int = 128) -> TinygemmWeight:
    """Quantise ``weight [N, K]`` and pack it for its device (CUDA or CPU)."""
    import torch

    codes, sz = quantize(weight, group)
    tiles = inner_k_tiles(weight.shape[1])
    if weight.device.type == "cuda":
        packed = torch.ops.aten._convert_weight_to_int4pack(pack_nibbles(codes), tiles)
    else:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, tiles)
    return TinygemmWeight(codes, sz, packed, group, weight.device.type)


def run(w: TinygemmWeight, x: Any) -> Any:
    """``x [M, K] bf16 @ dequant(W)^T`` -> ``[M, N]`` bf16."""
    import torch

    if w.device == "cuda":
        return torch.ops.aten._weight_int4pack_mm(x, w.packed, w.group, w.scales_and_zeros)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, w.packed, w.group,
                                                      w.scales_and_zeros)
