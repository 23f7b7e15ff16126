"""The terminal table of a run, and the recorded anchors beside it.

Rows are grouped by shape and M so every kernel of a problem sits together; anchors
from an earlier recording go in a separate table under a heading that says when they
were recorded, so nobody reads them as measured in this run.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from lowvm.bench.anchors import AnchorSet

__all__ = ["format_table", "format_rows", "format_anchors", "format_hbm", "format_outcome"]


def format_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Columns aligned: text left, everything else right."""
    body = [[("" if c is None else str(c)) for c in r] for r in rows]
    cells = [list(header)] + body
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    numeric = [all(_is_number(r[i]) for r in body if r[i]) and any(r[i] for r in body)
               for i in range(len(header))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(r, widths, numeric)).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), sep] + [line(r) for r in body])


def _is_number(text: str) -> bool:
    try:
        float(text.rstrip("%"))
    except ValueError:
        return False
    return True


def _fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def format_rows(rows: Sequence[dict[str, Any]]) -> str:
    """The run's rows (as in the JSON) as a table, sorted by shape, M, then kernel."""
    ordered = sorted(rows, key=lambda r: (r["k"], r["n"], r["m"], r["family"] != "lowvm",
                                          r["kernel"], r.get("schedule", "") != "chosen",
                                          r.get("schedule", ""), r.get("method", "")))
    header = ["K x N", "M", "kernel", "method", "median us", "TFLOP/s", "GB/s",
              "% HBM floor", "floor us", "rel err", "status"]
    body = []
    for r in ordered:
        status = r["status"] if r["status"] == "ok" else f"{r['status']}: {r['note']}"
        if r["status"] == "ok" and r.get("note"):
            status += f" ({r['note']})"
        kernel = r["kernel"] + (f" [{r['schedule']}]" if r.get("schedule") else "")
        body.append([f"{r['k']}x{r['n']}", r["m"], kernel, r.get("method", ""),
                     _fmt(r["median_us"], ".1f"),
                     _fmt(r["tflops"], ".1f"), _fmt(r["gbps"], ".0f"),
                     _fmt(r["pct_floor"], ".1f"), _fmt(r["floor_us"], ".1f"),
                     _fmt(r["rel_err"], ".1e"), status])
    return format_table(header, body)


def format_anchors(anchors: AnchorSet, problems: Iterable[tuple[int, int, int]]) -> str:
    """The anchors of the (K, N, M) problems of this run, labelled with their date."""
    header = ["K x N", "M", "kernel", "median us"]
    body = []
    for k, n, m in sorted(set(problems)):
        for a in anchors.matching(k, n, m):
            body.append([f"{k}x{n}", m, a.kernel, f"{a.median_us:.1f}"])
    title = (f"Anchors {anchors.label} on {anchors.gpu or 'an unnamed GPU'} "
             f"(NOT measured in this run; from {anchors.source}):")
    if not body:
        return title + "\n(none for these shapes and M)"
    return title + "\n" + format_table(header, body)


def format_hbm(hbm: dict[str, Any]) -> str:
    """One line: the bandwidths measured in this run and the one the floor uses."""
    parts = []
    if hbm.get("copy_tbps") is not None:
        parts.append(f"copy {hbm['copy_tbps']:.2f} TB/s (read+write)")
    if hbm.get("read_tbps") is not None:
        parts.append(f"read {hbm['read_tbps']:.2f} TB/s (reduction)")
    measured = ", ".join(parts) if parts else "not measured"
    return (f"HBM bandwidth measured in this run: {measured}; floor uses "
            f"{hbm['floor_tbps']:.2f} TB/s ({hbm.get('floor_source', '')})")


def format_outcome(doc: dict[str, Any]) -> str:
    """A command scenario's result: passed or not, then its rows' fields as a table."""
    lines = [f"{doc.get('scenario')}: {'passed' if doc.get('ok') else 'FAILED'}"]
    for key in ("totals", "note"):
        if doc.get(key):
            lines.append(f"{key}: {doc[key]}")
    rows = doc.get("rows") or []
    if rows:
        header = list(dict.fromkeys(k for r in rows for k in r
                                    if not isinstance(r[k], (dict, list))))
        lines.append(format_table(header, [[_cell(r.get(k)) for k in header] for r in rows]))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)
