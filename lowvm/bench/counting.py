"""Bytes and FLOPs of one ``y[M, N] = x[M, K] @ W[N, K]^T``, and the HBM floor.

Count before timing. At decode (M <= 16) the kernel cannot beat the time to
stream its weights and scales once from HBM, so every row reports that floor and the
share of it the kernel reached. Activations and output are counted separately
(``io_bytes``): they are what a prefill kernel moves besides the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowvm.bench.errors import BenchError

__all__ = [
    "NOMINAL_HBM_TBPS",
    "WeightFormat",
    "fp_format",
    "quant_format",
    "flops",
    "io_bytes",
    "floor_us",
    "achieved_gbps",
    "achieved_tflops",
    "percent_of_floor",
]

#: H100 80GB HBM3 read bandwidth measured on 2026-11-22, used when the run
#: did not measure its own.
NOMINAL_HBM_TBPS = 3.04


@dataclass(frozen=True)
class WeightFormat:
    """How a kernel stores ``W``: bits per weight, and per-group metadata.

    ``meta_bytes_per_group`` is the bytes per (group, output column): 2 for one fp16
    scale, 4 for tinygemm's bf16 scale and zero. Dense formats have ``group = 0``.
    """

    bits: int
    group: int = 0
    meta_bytes_per_group: int = 0

    def weight_bytes(self, k: int, n: int) -> int:
        """Bytes of the packed weights alone (a partial last byte of a row counts whole)."""
        return n * -(-k * self.bits // 8)

    def scale_bytes(self, k: int, n: int) -> int:
        """Bytes of the scales (and zeros) of every group."""
        if not self.group:
            return 0
        return -(-k // self.group) * n * self.meta_bytes_per_group

    def total_bytes(self, k: int, n: int) -> int:
        """Weight plus scale bytes: what a decode kernel must read at least once."""
        return self.weight_bytes(k, n) + self.scale_bytes(k, n)


def fp_format(bits: int = 16) -> WeightFormat:
    """A dense floating-point weight (fp16/bf16: 16 bits, no scales)."""
    return WeightFormat(bits)


def quant_format(bits: int, group: int, meta_bytes_per_group: int = 2) -> WeightFormat:
    """A ``bits``-wide weight with one fp16 scale per ``group`` inputs (lowvm's layout)."""
    if not 1 <= bits <= 8:
        raise BenchError(f"bits={bits}: quantized weights have 1 to 8 bits")
    if group <= 0:
        raise BenchError(f"group={group}: the group size must be a positive integer")
    return WeightFormat(bits, group, meta_bytes_per_group)


def flops(m: int, n: int, k: int) -> int:
    """Multiply-adds counted as two FLOPs each."""
    return 2 * m * n * k


def io_bytes(m: int, n: int, k: int, act_bytes: int = 2) -> int:
    """Bytes of the activations read and the output written."""
    return act_bytes * (m * k + m * n)


def floor_us(weight_bytes: int, hbm_tbps: float) -> float:
    """Microseconds to read ``weight_bytes`` once at ``hbm_tbps`` terabytes per second."""
    if hbm_tbps <= 0:
        raise BenchError(f"hbm_tbps={hbm_tbps}: the bandwidth must be positive")
    return weight_bytes / (hbm_tbps * 1e12) * 1e6


def achieved_gbps(weight_bytes: int, time_us: float) -> float:
    """Weight+scale bytes over the measured time, in GB/s (the decode figure of merit)."""
    return weight_bytes / (time_us * 1e-6) / 1e9


def achieved_tflops(m: int, n: int, k: int, time_us: float) -> float:
    """FLOPs over the measured time, in TFLOP/s (the prefill figure of merit)."""
    return flops(m, n, k) / (time_us * 1e-6) / 1e12


def percent_of_floor(weight_bytes: int, time_us: float, hbm_tbps: float) -> float:
    """``100 * floor / time``: 100 % means the weights streamed at full HBM bandwidth."""
    return 100.0 * floor_us(weight_bytes, hbm_tbps) / time_us
