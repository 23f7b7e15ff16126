"""``python -m lowvm.bench compare <fresh.json> [<reference.json>] [--tolerance 0.07]``.

Without a reference, the newest results file of the fresh one's scenario and GPU under
``--root`` (``benchmarks/results/<date>/<scenario>/<gpu>.json``, the fresh file itself
left out) is the reference: the committed figures of that GPU.

A regression guard: every GEMM cell measured in both files (same scenario, kernel,
schedule, method, K, N, M) is compared, and the command exits 1 when any is more than
``tolerance`` slower in the fresh file (or when the files share no cell, which would
compare nothing). For command scenarios, a fresh failure where the reference passed is
a regression too. A slower cell whose fastest tenth of runs (p10) is not slower is still
a failure, labelled as such: its runs spread (e.g. half at each of two times), which a
re-run tells apart from a kernel that got slower.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lowvm.bench.errors import BenchError
from lowvm.bench.results import DEFAULT_ROOT, GEMM_KINDS, load, result_path
from lowvm.bench.table import format_table

__all__ = ["DEFAULT_TOLERANCE", "Cell", "cell_key", "compare_docs", "newest_reference",
           "main"]

DEFAULT_TOLERANCE = 0.07


@dataclass(frozen=True)
class Cell:
    """One cell measured in both files."""

    key: tuple[Any, ...]
    fresh_us: float
    reference_us: float
    fresh_p10_us: float | None = None
    reference_p10_us: float | None = None

    @property
    def ratio(self) -> float:
        return self.fresh_us / self.reference_us

    def slower(self, tolerance: float) -> bool:
        return self.ratio > 1 + tolerance

    def verdict(self, tolerance: float) -> str:
        """"" within tolerance; "SLOWER"; or, where only the median moved, "SLOWER
        (median; p10 +x%)"."""
        if not self.slower(tolerance):
            return ""
        if self.fresh_p10_us and self.reference_p10_us:
            p10 = self.fresh_p10_us / self.reference_p10_us
            if p10 <= 1 + tolerance:
                return f"SLOWER (median; p10 {100 * (p10 - 1):+.1f}%: runs spread, re-run)"
        return "SLOWER"


def cell_key(row: dict[str, Any]) -> tuple[Any, ...]:
    """What identifies a row across runs."""
    return (row.get("kernel"), row.get("schedule", ""), row.get("method", ""),
            row.get("k"), row.get("n"), row.get("m"))


def _cells(doc: dict[str, Any]) -> dict[tuple[Any, ...], tuple[float, float | None]]:
    """(median, p10) microseconds of each measured cell."""
    return {cell_key(r): (r["median_us"], r.get("p10_us")) for r in doc["rows"]
            if r.get("status") == "ok" and r.get("median_us")}


def compare_docs(fresh: dict[str, Any], reference: dict[str, Any]) -> list[Cell]:
    """The cells both GEMM documents measured, in the reference's order."""
    if fresh.get("scenario") != reference.get("scenario"):
        raise BenchError(f"compare: the files ran different scenarios "
                         f"({fresh.get('scenario')!r} and {reference.get('scenario')!r})")
    new, old = _cells(fresh), _cells(reference)
    return [Cell(key, new[key][0], old[key][0], new[key][1], old[key][1])
            for key in old if key in new]


def newest_reference(fresh: dict[str, Any], fresh_path: str | os.PathLike[str],
                     root: str | os.PathLike[str] = DEFAULT_ROOT) -> Path:
    """The newest ``<root>/<date>/<scenario>/<gpu>.json`` of ``fresh``'s scenario and GPU
    other than ``fresh_path`` (dates sort as text: ``YYYY-MM-DD``)."""
    _, folder, name = result_path(fresh, root).relative_to(root).parts
    own = Path(fresh_path).resolve()
    found = sorted((p for p in Path(root).glob(f"*/{folder}/{name}") if p.resolve() != own),
                   key=lambda p: p.parent.parent.name)
    if not found:
        raise BenchError(f"compare: no reference for scenario {fresh.get('scenario')!r} on "
                         f"{fresh.get('gpu')!r} under {root} (looked for "
                         f"<date>/{folder}/{name}); pass the reference file")
    return found[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lowvm.bench compare",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("fresh", help="results of the run to check")
    parser.add_argument("reference", nargs="?",
                        help="results it must not be slower than (default: the newest "
                        "results file of the same scenario and GPU under --root)")
    parser.add_argument("--root", default=str(DEFAULT_ROOT),
                        help=f"results root searched for the reference (default {DEFAULT_ROOT})")
    parser.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                        help=f"allowed slowdown, a fraction (default {DEFAULT_TOLERANCE})")
    opts = parser.parse_args(argv)
    if not 0 <= opts.tolerance < 10:
        parser.error(f"--tolerance {opts.tolerance}: give a fraction such as 0.07")
    try:
        fresh = load(opts.fresh)
        ref_path = opts.reference or newest_reference(fresh, opts.fresh, opts.root)
        reference = load(ref_path)
        print(f"reference: {ref_path}")
        if fresh.get("kind", "gemm") not in GEMM_KINDS:
            regressed = reference.get("ok") and not fresh.get("ok")
            print(f"{fresh.get('scenario')}: fresh {'passed' if fresh.get('ok') else 'failed'}"
                  f", reference {'passed' if reference.get('ok') else 'failed'}")
            return 1 if regressed else 0
        cells = compare_docs(fresh, reference)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not cells:
        print("error: the files share no measured cell; nothing was compared",
              file=sys.stderr)
        return 1
    slow = [c for c in cells if c.slower(opts.tolerance)]
    body = [[*map(str, c.key), f"{c.reference_us:.1f}", f"{c.fresh_us:.1f}",
             f"{100 * (c.ratio - 1):+.1f}%", c.verdict(opts.tolerance)] for c in cells]
    print(format_table(["kernel", "schedule", "method", "K", "N", "M", "reference us",
                        "fresh us", "change", ""], body))
    print(f"\n{len(cells)} cells compared, {len(slow)} more than "
          f"{100 * opts.tolerance:g}% slower")
    return 1 if slow else 0
