"""Text pictures of layouts: the grid a person would draw.

A register layout shows each element as ``thread:local`` (the lowest owning thread when
the element is replicated, which the title says); a shared or global layout shows each
element's offset. Tiles of rank > 2 are shown as a sequence of 2-D slices.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import numpy as np

from lowvm.errors import LayoutError
from lowvm.layouts.global_layout import GlobalLayout
from lowvm.layouts.register import RegisterLayout
from lowvm.layouts.shared import SharedLayout

__all__ = ["visualize"]


def _grid(cells: np.ndarray) -> str:
    """Align a 2-D array of strings into rows with a column header."""
    rows, cols = cells.shape
    width = max(max((len(c) for c in cells.ravel()), default=1), len(str(cols - 1)))
    row_label = len(str(rows - 1))
    header = " " * (row_label + 2) + " ".join(f"{c:>{width}}" for c in range(cols))
    lines = [header]
    for r in range(rows):
        lines.append(
            f"{r:>{row_label}}: " + " ".join(f"{cells[r, c]:>{width}}" for c in range(cols))
        )
    return "\n".join(lines)


def _slices(cells: np.ndarray) -> str:
    if cells.ndim == 1:
        return _grid(cells[None, :])
    if cells.ndim == 2:
        return _grid(cells)
    parts = []
    for lead in itertools.product(*(range(s) for s in cells.shape[:-2])):
        label = ", ".join(str(i) for i in lead)
        parts.append(f"[{label}, :, :]\n{_grid(cells[lead])}")
    return "\n".join(parts)


def _register(layout: RegisterLayout) -> str:
    cells = np.empty(layout.shape, dtype=object)
    table = layout.table
    # visit threads from high to low so the lowest owner wins
    for t in reversed(range(layout.num_threads)):
        for loc in range(layout.local_size):
            cells[tuple(table[t, loc])] = f"{t}:{loc}"
    title = (
        f"{layout}: shape {list(layout.shape)}, {layout.num_threads} threads, "
        f"{layout.local_size} per thread"
    )
    if layout.replication > 1:
        title += f"; each element held by {layout.replication} threads (lowest shown)"
    return title + "\n" + _slices(cells)


def _offsets(title: str, offsets: np.ndarray) -> str:
    cells = np.vectorize(str, otypes=[object])(offsets)
    return title + "\n" + _slices(cells)


def visualize(
    layout: RegisterLayout | SharedLayout | GlobalLayout,
    env: Mapping[str, int] | None = None,
) -> str:
    """The layout as a text grid: ``thread:local`` cells, or offsets for memory layouts.

    ``env`` binds the runtime sizes of a global layout.
    """
    if isinstance(layout, RegisterLayout):
        return _register(layout)
    if isinstance(layout, SharedLayout):
        swz = f", swizzle {layout.swizzle}" if layout.swizzle else ""
        return _offsets(
            f"shared {list(layout.shape)} strides {list(layout.strides)}{swz}: offsets",
            layout.offsets(),
        )
    if isinstance(layout, GlobalLayout):
        return _offsets(f"{layout}: offsets", layout.offsets(env or {}))
    raise LayoutError(
        f"visualize: expected a RegisterLayout, SharedLayout or GlobalLayout, got "
        f"{type(layout).__name__}"
    )
