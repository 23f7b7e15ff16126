"""Figures recorded earlier (Marlin, Tilus, GemLite, ...), printed beside a run's own.

The anchor file is JSON lines: a header object (``gpu``, ``date``, ``method``,
``hbm_read_tbps``), then one ``{"kernel", "k", "n", "m", "median_us"}`` per line. These
were not measured in the run, so every anchor is labelled "recorded <date>" wherever it
is shown or stored.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from lowvm.bench.errors import BenchError

__all__ = ["Anchor", "AnchorSet", "default_anchor_path", "load_anchors"]

_CANDIDATES = ("benchmarks/anchors-h100.jsonl",)


@dataclass(frozen=True)
class Anchor:
    """One recorded figure."""

    kernel: str
    k: int
    n: int
    m: int
    median_us: float


@dataclass(frozen=True)
class AnchorSet:
    """The anchors of one file, with the date and GPU they were recorded on."""

    gpu: str
    date: str
    anchors: tuple[Anchor, ...]
    source: str

    @property
    def label(self) -> str:
        """What every displayed anchor is marked with."""
        return f"recorded {self.date}"

    def matching(self, k: int, n: int, m: int) -> list[Anchor]:
        """The anchors of this shape and M, in file order."""
        return [a for a in self.anchors if (a.k, a.n, a.m) == (k, n, m)]


def default_anchor_path(root: str | os.PathLike[str] = ".") -> Path | None:
    """The first anchor file found from ``root``: the repository's copy."""
    for rel in _CANDIDATES:
        p = Path(root) / rel
        if p.is_file():
            return p
    return None


def load_anchors(path: str | os.PathLike[str]) -> AnchorSet:
    """Parse an anchor file; :class:`BenchError` names the file and line on bad input."""
    p = Path(path)
    if not p.is_file():
        raise BenchError(f"--anchors: no anchor file at {str(p)!r}")
    gpu, date, anchors = "", "", []
    for lineno, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BenchError(f"--anchors: {p}:{lineno} is not JSON ({exc})") from None
        if "kernel" not in obj:
            gpu, date = str(obj.get("gpu", gpu)), str(obj.get("date", date))
            continue
        try:
            anchors.append(Anchor(str(obj["kernel"]), int(obj["k"]), int(obj["n"]),
                                  int(obj["m"]), float(obj["median_us"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise BenchError(f"--anchors: {p}:{lineno} lacks kernel/k/n/m/median_us "
                             f"({exc!r})") from None
    if not date:
        raise BenchError(f"--anchors: {p} has no header line with the recording date")
    return AnchorSet(gpu, date, tuple(anchors), str(p))
