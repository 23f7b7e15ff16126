"""Schedules of the quantized GEMM and the space searched for each path.

A schedule fixes how one thread block works: a ``bm x bn`` output tile, ``bk`` inputs
per K step, ``warps_m x warps_n`` warps of ``mma.sync`` m16n8k16 atoms, ``stages``
buffers in the copy pipeline and ``split_k`` blocks sharing one tile's K range (their
partial sums reduced afterwards). The spaces differ per path because the problems do:
decode (M <= 16) streams weights with one MMA row of tiles and needs split-K to fill
132 SMs; prefill (M > 256) wants large tiles for tensor-core reuse; in between, both.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, fields
from typing import Any

from lowvm.tune.errors import TuneError

__all__ = ["Schedule", "Problem", "PATHS", "path_for_m", "schedule_space", "feasible"]

MMA_M, MMA_N, MMA_K = 16, 8, 16


@dataclass(frozen=True, order=True)
class Schedule:
    """Compile-time constants of one kernel variant (see module doc)."""

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int = 2
    split_k: int = 1

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise TuneError(f"Schedule.{f.name}={value!r}: must be a positive integer")
        if self.bm % (MMA_M * self.warps_m):
            raise TuneError(f"Schedule: bm={self.bm} must be a multiple of "
                            f"{MMA_M} x warps_m={self.warps_m}")
        if self.bn % (MMA_N * self.warps_n):
            raise TuneError(f"Schedule: bn={self.bn} must be a multiple of "
                            f"{MMA_N} x warps_n={self.warps_n}")
        if self.bk % MMA_K:
            raise TuneError(f"Schedule: bk={self.bk} must be a multiple of {MMA_K}")
        if self.warps > 32:
            raise TuneError(f"Schedule: {self.warps} warps exceed a block's 1024 threads")

    @property
    def warps(self) -> int:
        return self.warps_m * self.warps_n

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def constants(self) -> dict[str, int]:
        """The compile-time constants a VM program template takes (``build(**c)``)."""
        return asdict(self)

    @classmethod
    def from_constants(cls, constants: dict[str, Any]) -> Schedule:
        """Inverse of :meth:`constants` (e.g. from the cache); unknown keys are errors."""
        names = {f.name for f in fields(cls)}
        unknown = set(constants) - names
        if unknown:
            raise TuneError(f"Schedule: unknown constants {sorted(unknown)}; a schedule "
                            f"has {sorted(names)}")
        try:
            return cls(**constants)
        except TypeError as exc:
            raise TuneError(f"Schedule: {constants!r} is incomplete ({exc})") from None

    def __str__(self) -> str:
        return (f"{self.bm}x{self.bn}x{self.bk} w{self.warps_m}x{self.warps_n} "
                f"s{self.stages} k{self.split_k}")


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


#: Paths and the M each serves (inclusive upper bounds).
PATHS: dict[str, int] = {"decode": 16, "small": 256, "prefill": 1 << 62}


def path_for_m(m: int) -> str:
    """The path a token count ``m`` takes."""
    if m < 1:
        raise TuneError(f"m={m}: the token count must be positive")
    return next(name for name, top in PATHS.items() if m <= top)


_SPACES: dict[str, dict[str, tuple[Any, ...]]] = {
    "decode": dict(bm=(16,), bn=(32, 64, 128, 256), bk=(64, 128, 256),
                   warps=((1, 1), (1, 2), (1, 4), (1, 8)), stages=(2, 3, 4),
                   split_k=(1, 2, 4, 8, 16)),
    "small": dict(bm=(16, 32, 64), bn=(64, 128, 256), bk=(32, 64, 128),
                  warps=((1, 2), (1, 4), (2, 2), (2, 4)), stages=(2, 3, 4),
                  split_k=(1, 2, 4)),
    "prefill": dict(bm=(64, 128, 256), bn=(64, 128, 256), bk=(32, 64),
                    warps=((2, 2), (2, 4), (4, 2), (4, 4)), stages=(2, 3, 4),
                    split_k=(1,)),
}


def schedule_space(path: str) -> list[Schedule]:
    """Every well-formed schedule of ``path`` ("decode", "small" or "prefill")."""
    if path not in _SPACES:
        raise TuneError(f"path={path!r}: choose one of {', '.join(_SPACES)}")
    space = _SPACES[path]
    out = []
    for bm, bn, bk, (wm, wn), st, sk in itertools.product(
            space["bm"], space["bn"], space["bk"], space["warps"], space["stages"],
            space["split_k"]):
        if bm % (MMA_M * wm) or bn % (MMA_N * wn):
            continue
        out.append(Schedule(bm, bn, bk, wm, wn, st, sk))
    return out


def feasible(s: Schedule, p: Problem) -> bool:
    """Whether ``s`` tiles ``p`` exactly along K: whole K steps in each split, and each
    step inside one scale group or covering whole groups."""
    if p.k % (s.bk * s.split_k):
        return False
    if p.group % s.bk and s.bk % p.group:
        return False
    return True
