"""``python -m lowvm.bench.plot results.json [-o out.png]``: draw a run's results.

Two panels: decode (M <= 16), where a kernel's merit is the HBM bandwidth it reaches
streaming its weights (with the measured bandwidth drawn as the ceiling), and prefill
(M > 16), where it is TFLOP/s. This is a separate step from the run because the GPU
machine may lack matplotlib; it is imported only here, only when drawing, and its
absence is reported plainly. :func:`plot_data` (no matplotlib) prepares the numbers.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lowvm.bench.errors import BenchError
from lowvm.bench.shapes import DECODE_MAX_M

__all__ = ["Panel", "PlotData", "plot_data", "draw", "main"]


@dataclass
class Panel:
    """Grouped bars: one group per (shape, M) category, one bar per kernel."""

    title: str
    ylabel: str
    categories: list[str] = field(default_factory=list)
    values: dict[str, list[float | None]] = field(default_factory=dict)  # kernel -> bars


@dataclass
class PlotData:
    decode: Panel
    prefill: Panel
    ceiling_gbps: float | None   # measured HBM read bandwidth, drawn over decode
    title: str


def _panel(rows: list[dict[str, Any]], title: str, ylabel: str, metric: str) -> Panel:
    panel = Panel(title, ylabel)
    keys = sorted({(r["k"], r["n"], r["m"]) for r in rows})
    panel.categories = [f"{k}x{n}\nM={m}" for k, n, m in keys]
    index = {key: i for i, key in enumerate(keys)}
    kernels = sorted({r["kernel"] for r in rows}, key=lambda s: (not s.startswith("lowvm"), s))
    panel.values = {name: [None] * len(keys) for name in kernels}
    for r in rows:
        panel.values[r["kernel"]][index[(r["k"], r["n"], r["m"])]] = r[metric]
    return panel


def plot_data(doc: dict[str, Any]) -> PlotData:
    """The numbers to draw: measured rows only (failed and skipped rows have none)."""
    ok = [r for r in doc["rows"] if r["status"] == "ok"]
    decode = [r for r in ok if r["m"] <= DECODE_MAX_M]
    prefill = [r for r in ok if r["m"] > DECODE_MAX_M]
    hbm = doc.get("hbm", {})
    read = hbm.get("read_tbps") or hbm.get("floor_tbps")
    return PlotData(
        decode=_panel(decode, f"decode (M <= {DECODE_MAX_M}): weight+scale bytes / time",
                      "achieved GB/s", "gbps"),
        prefill=_panel(prefill, f"prefill (M > {DECODE_MAX_M})", "TFLOP/s", "tflops"),
        ceiling_gbps=read * 1000 if read else None,
        title=f"{doc.get('gpu', '?')}, torch {doc.get('torch', '?')}, {doc.get('date', '?')}",
    )


def _draw_panel(ax: Any, panel: Panel) -> None:
    n = max(1, len(panel.values))
    width = 0.8 / n
    for j, (kernel, values) in enumerate(panel.values.items()):
        xs = [i - 0.4 + width * (j + 0.5) for i, v in enumerate(values) if v is not None]
        ys = [v for v in values if v is not None]
        ax.bar(xs, ys, width, label=kernel)
    ax.set_xticks(range(len(panel.categories)))
    ax.set_xticklabels(panel.categories, fontsize=7)
    ax.set_title(panel.title, fontsize=10)
    ax.set_ylabel(panel.ylabel)
    if not panel.categories:
        ax.text(0.5, 0.5, "no measured rows", ha="center", transform=ax.transAxes)


def draw(data: PlotData, out: str | Path) -> Path:
    """Write the PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widest = max(len(data.decode.categories), len(data.prefill.categories), 4)
    fig, axes = plt.subplots(2, 1, figsize=(max(8.0, 1.2 * widest), 9))
    _draw_panel(axes[0], data.decode)
    if data.ceiling_gbps:
        axes[0].axhline(data.ceiling_gbps, color="black", linestyle="--", linewidth=1,
                        label=f"HBM read {data.ceiling_gbps:.0f} GB/s (measured)")
    _draw_panel(axes[1], data.prefill)
    for ax in axes:
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(data.title, fontsize=10)
    fig.tight_layout()
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    from lowvm.bench.results import load

    parser = argparse.ArgumentParser(prog="python -m lowvm.bench.plot",
                                     description="Plot a lowvm.bench results file.")
    parser.add_argument("results", help="JSON written by python -m lowvm.bench")
    parser.add_argument("-o", "--out", help="PNG path (default: the JSON's, .png)")
    opts = parser.parse_args(argv)
    try:
        doc = load(opts.results)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("error: matplotlib is not installed here; install it (pip install "
              "'lowvm[bench]') and run this step again, on any machine: the JSON holds "
              "every figure", file=sys.stderr)
        return 1
    out = opts.out or str(Path(opts.results).with_suffix(".png"))
    print(f"plot: {draw(plot_data(doc), out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
