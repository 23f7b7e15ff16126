"""Elementwise arithmetic on register tiles, with broadcasting of size-1 dims.

One instruction, :class:`Elementwise`, carries an ``op`` from :data:`OPS`. Operands are
register tiles of one type (``where`` takes a ``bool`` condition first) or uniform
scalars. Each result is computed exactly in float64 (int64 for integers) and rounded to
the result type, as the GPU's instruction rounds once. Integer results that do not fit
their type are reported as errors rather than wrapped silently; integer division
truncates toward zero, as in C.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lowvm.expr import Expr, const_value
from lowvm.instructions.base import BlockState, Instruction, gather_map, register_instruction
from lowvm.instructions.values import quantize
from lowvm.ir import BOOL, RegisterTensor

__all__ = ["Elementwise", "OPS", "COMPARISONS"]


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.abs(a) // np.abs(b)
    return np.where((a >= 0) == (b >= 0), q, -q)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "i" and b.dtype.kind == "i":
        if np.any(b == 0):
            raise ZeroDivisionError("integer division by zero")
        return _int_div(a, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        return a / b


def _mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if np.any(b == 0):
        raise ZeroDivisionError("integer remainder by zero")
    return a - _int_div(a, b) * b


#: op name -> (arity, numpy function)
OPS: dict[str, tuple[int, Callable[..., np.ndarray]]] = {
    "neg": (1, np.negative),
    "abs": (1, np.abs),
    "exp": (1, np.exp),
    "sqrt": (1, np.sqrt),
    "add": (2, np.add),
    "sub": (2, np.subtract),
    "mul": (2, np.multiply),
    "div": (2, _div),
    "mod": (2, _mod),
    "max": (2, np.maximum),
    "min": (2, np.minimum),
    "lt": (2, np.less),
    "le": (2, np.less_equal),
    "gt": (2, np.greater),
    "ge": (2, np.greater_equal),
    "eq": (2, np.equal),
    "ne": (2, np.not_equal),
    "where": (3, lambda c, a, b: np.where(c != 0, a, b)),
    "fma": (3, lambda a, b, c: a * b + c),
}
COMPARISONS = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
_FLOAT_ONLY = frozenset({"exp", "sqrt"})
_INT_ONLY = frozenset({"mod"})

Operand = RegisterTensor | Expr


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class Elementwise(Instruction):
    """``out = op(*args)`` elementwise; scalar args are uniform values."""

    mnemonic = "elementwise"
    out: RegisterTensor
    op: str
    args: tuple[Operand, ...]

    def check(self) -> None:
        if self.op not in OPS:
            raise self.error(f"unknown op {self.op!r}; accepted: {sorted(OPS)}")
        arity = OPS[self.op][0]
        if len(self.args) != arity:
            raise self.error(f"{self.op} takes {arity} operands, got {len(self.args)}")
        tiles = [a for a in self.args if isinstance(a, RegisterTensor)]
        values = tiles[1:] if self.op == "where" and self.args[0] is tiles[0] else tiles
        if self.op == "where" and isinstance(self.args[0], RegisterTensor):
            if self.args[0].dtype != BOOL:
                raise self.error(
                    f"the condition %{self.args[0].name} must be bool, got "
                    f"{self.args[0].dtype.name}"
                )
        types = {t.dtype for t in values}
        if len(types) > 1:
            raise self.error(
                f"operands have different types {sorted(t.name for t in types)}; cast "
                "them to one type first"
            )
        operand_type = next(iter(types)) if types else self.out.dtype
        if self.op in _FLOAT_ONLY and not operand_type.is_float:
            raise self.error(f"{self.op} needs a float type, got {operand_type.name}")
        if self.op in _INT_ONLY and operand_type.is_float:
            raise self.error(f"{self.op} needs an integer type, got {operand_type.name}")
        if self.op in _INT_ONLY:
            floats = [a for a in self.args if not isinstance(a, RegisterTensor)
                      and isinstance(const_value(a), float)]
            if floats:  # C's % takes integers only: the GPU code could not compile
                raise self.error(f"{self.op} needs integer operands, got the float scalar "
                                 f"{floats[0]}; accepted: integer tiles and integer scalars")
        expected = BOOL if self.op in COMPARISONS else operand_type
        if self.out.dtype != expected:
            raise self.error(f"result type must be {expected.name}, got {self.out.dtype.name}")
        for t in tiles:
            if t.rank != self.out.rank or any(
                s not in (1, o) for s, o in zip(t.shape, self.out.shape)
            ):
                raise self.error(
                    f"shape mismatch: %{t.name} has shape {list(t.shape)}, which does not "
                    f"broadcast to {list(self.out.shape)}"
                )
            if t.layout is not None and self.out.layout is not None:  # else: inference
                gather_map(self.out, t, f"{self.op} at {self.loc}" if self.loc else self.op)

    def interpret(self, st: BlockState) -> None:
        inputs = []
        for a in self.args:
            if isinstance(a, RegisterTensor):
                data = st.get(a)
                if a.shape != self.out.shape or a.layout != self.out.layout:
                    data = np.take_along_axis(data, gather_map(self.out, a, self.op), axis=1)
                inputs.append(data)
            else:
                value = st.eval(a)
                inputs.append(np.asarray(value, dtype=np.float64 if isinstance(value, float)
                                         else np.int64))
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                result = OPS[self.op][1](*inputs)
        except ZeroDivisionError as exc:
            raise st.runtime_error(self, str(exc)) from None
        lay = self.out.layout
        result = np.broadcast_to(result, (lay.num_threads, lay.local_size))
        st.set(self.out, quantize(result, self.out.dtype, saturate=False), inst=self)

    def format_args(self) -> str:
        return ", ".join(f"%{a.name}" if isinstance(a, RegisterTensor) else str(a)
                         for a in self.args)

    def __str__(self) -> str:
        return f"%{self.out.name}: {self.out.type_str()} = {self.op} {self.format_args()}"
