"""Global layouts: strided views over a pointer, sizes known only at launch.

A kernel sees ``x`` as an ``M x K`` row-major matrix where ``M`` is a runtime argument.
A :class:`GlobalLayout` keeps shape and strides as symbolic :mod:`lowvm.expr`
expressions, gives the offset of an index as an expression (what the generated code
computes) and evaluates with concrete bindings (what the interpreter does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from lowvm.errors import LayoutError
from lowvm.expr import Expr, ExprLike, as_expr, evaluate, free_vars

__all__ = ["GlobalLayout", "global_row_major", "global_column_major", "global_strided"]


@dataclass(frozen=True)
class GlobalLayout:
    """``offset(index) = sum(index[d] * strides[d])`` with symbolic sizes and strides."""

    shape: tuple[Expr, ...]
    strides: tuple[Expr, ...]

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.strides) or not self.shape:
            raise LayoutError(
                f"GlobalLayout: need as many strides as dims (>= 1), got shape "
                f"{self.shape} and strides {self.strides}"
            )
        object.__setattr__(self, "shape", tuple(as_expr(s) for s in self.shape))
        object.__setattr__(self, "strides", tuple(as_expr(s) for s in self.strides))

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    def offset(self, index: Sequence[ExprLike]) -> Expr:
        """The element offset of ``index`` as an expression."""
        if len(index) != self.rank:
            raise LayoutError(f"offset: {len(index)} indices for a rank-{self.rank} layout")
        total: Expr = as_expr(0)
        for i, st in zip(index, self.strides):
            total = total + as_expr(i) * st
        return total

    def bind(self, env: Mapping[str, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Concrete ``(shape, strides)`` for the runtime values in ``env``."""
        return (
            tuple(int(evaluate(s, env)) for s in self.shape),
            tuple(int(evaluate(s, env)) for s in self.strides),
        )

    def offsets(self, env: Mapping[str, int]) -> np.ndarray:
        """Every element's offset for concrete sizes, an int64 array of that shape."""
        shape, strides = self.bind(env)
        grids = np.indices(shape, dtype=np.int64)
        return sum((g * st for g, st in zip(grids, strides)), np.zeros(shape, np.int64))

    def free_vars(self) -> frozenset:
        """The runtime variables the layout depends on."""
        out: frozenset = frozenset()
        for e in self.shape + self.strides:
            out |= free_vars(e)
        return out

    def __str__(self) -> str:
        shape = ", ".join(str(s) for s in self.shape)
        strides = ", ".join(str(s) for s in self.strides)
        return f"global[{shape}] strides [{strides}]"


def global_row_major(*shape: ExprLike) -> GlobalLayout:
    """Contiguous, last dimension fastest; sizes may be runtime expressions."""
    dims = tuple(as_expr(s) for s in shape)
    strides: list[Expr] = []
    acc: Expr = as_expr(1)
    for s in reversed(dims):
        strides.append(acc)
        acc = acc * s
    return GlobalLayout(dims, tuple(reversed(strides)))


def global_column_major(*shape: ExprLike) -> GlobalLayout:
    """Contiguous, first dimension fastest."""
    dims = tuple(as_expr(s) for s in shape)
    strides: list[Expr] = []
    acc: Expr = as_expr(1)
    for s in dims:
        strides.append(acc)
        acc = acc * s
    return GlobalLayout(dims, tuple(strides))


def global_strided(shape: Sequence[ExprLike], strides: Sequence[ExprLike]) -> GlobalLayout:
    """Any shape and strides (a slice, a padded pitch, a transposed view)."""
    return GlobalLayout(tuple(as_expr(s) for s in shape), tuple(as_expr(s) for s in strides))
