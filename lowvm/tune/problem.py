"""The problem a schedule is tuned for: the GEMM's sizes, weight width and group."""

from __future__ import annotations

from dataclasses import dataclass

from lowvm.tune.errors import TuneError

__all__ = ["Problem"]


@dataclass(frozen=True)
class Problem:
    """``y[M, N] = x[M, K] @ dequant(W[N, K])^T`` with ``bits``-wide weights, one scale
    (``scale_bytes`` wide) per ``group`` inputs, ``act_bytes``-wide activations."""

    m: int
    n: int
    k: int
    bits: int
    group: int
    scale_bytes: int = 2
    act_bytes: int = 2

    def __post_init__(self) -> None:
        for name in ("m", "n", "k", "group", "scale_bytes", "act_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise TuneError(f"Problem.{name}={value!r}: must be a positive integer")
        if not 1 <= self.bits <= 16:
            raise TuneError(f"Problem.bits={self.bits}: weights have 1..16 bits")
        if self.k % self.group:
            raise TuneError(f"Problem: group={self.group} must divide K={self.k}")

    @property
    def weight_bytes(self) -> int:
        """Packed weights plus scales: what every full pass over W reads."""
        return self.n * self.k * self.bits // 8 + (self.k // self.group) * self.n * \
            self.scale_bytes
