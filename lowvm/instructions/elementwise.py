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
from typing import TYPE_CHECKING

import numpy as np

from lowvm.expr import Expr, const_value
from lowvm.instructions.base import Instruction, gather_map, register_instruction
from lowvm.interpreter.values import quantize
from lowvm.ir import BOOL, ProgramError, RegisterTensor

if TYPE_CHECKING:
    from lowvm.codegen.context import CudaContext
    from lowvm.interpreter.state import BlockState

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

    def emit_cuda(self, cg: CudaContext) -> None:
        from lowvm.codegen.packed_math import emit_packed_elementwise

        if emit_packed_elementwise(self, cg):
            return
        cg.line(f"// {self}")
        is_float = any(
            (isinstance(a, RegisterTensor) and a.dtype.is_float)
            or (not isinstance(a, RegisterTensor) and isinstance(const_value(a), float))
            for a in self.args
        )
        cg.line("#pragma unroll")
        with cg.block(f"for (int l = 0; l < {self.out.layout.local_size}; ++l)"):
            values = []
            for a in self.args:
                if isinstance(a, RegisterTensor):
                    values.append(cg.get(a, _local_of(cg, self.out, a)))
                else:
                    values.append(cg.expr(a))
            expr = _c_op(self.op, values, is_float)
            result_float = is_float and self.op not in COMPARISONS
            cg.line(cg.set(self.out, "l", expr, result_float))


# ---------------------------------------------------------------------------------------
# CUDA emission


def _local_of(cg: CudaContext, out: RegisterTensor, operand: RegisterTensor) -> str:
    """The operand's local (a C expression in ``l``) feeding the result's local ``l``."""
    if operand.shape == out.shape and operand.layout == out.layout:
        return "l"
    table = gather_map(out, operand, "elementwise")
    if not (table == table[0]).all():
        raise ProgramError(
            f"lowering: the operand %{operand.name} reaches the result through different "
            "registers in different threads; give it the result's layout"
        )
    name = cg.fresh(f"map_{operand.name}")
    cg.line(f"const int {name}[{table.shape[1]}] = {{{', '.join(map(str, table[0]))}}};")
    return f"{name}[l]"


def _c_op(op: str, v: list[str], is_float: bool) -> str:
    f = is_float
    table = {
        "neg": lambda: f"-({v[0]})",
        "abs": lambda: f"fabsf({v[0]})" if f else f"abs({v[0]})",
        "exp": lambda: f"expf({v[0]})",
        "sqrt": lambda: f"sqrtf({v[0]})",
        "add": lambda: f"({v[0]}) + ({v[1]})",
        "sub": lambda: f"({v[0]}) - ({v[1]})",
        "mul": lambda: f"({v[0]}) * ({v[1]})",
        "div": lambda: f"({v[0]}) / ({v[1]})",
        "mod": lambda: f"({v[0]}) % ({v[1]})",
        "max": lambda: f"fmaxf({v[0]}, {v[1]})" if f else f"max({v[0]}, {v[1]})",
        "min": lambda: f"fminf({v[0]}, {v[1]})" if f else f"min({v[0]}, {v[1]})",
        "lt": lambda: f"({v[0]}) < ({v[1]})",
        "le": lambda: f"({v[0]}) <= ({v[1]})",
        "gt": lambda: f"({v[0]}) > ({v[1]})",
        "ge": lambda: f"({v[0]}) >= ({v[1]})",
        "eq": lambda: f"({v[0]}) == ({v[1]})",
        "ne": lambda: f"({v[0]}) != ({v[1]})",
        "where": lambda: f"({v[0]}) ? ({v[1]}) : ({v[2]})",
        "fma": lambda: f"fmaf({v[0]}, {v[1]}, {v[2]})" if f else f"({v[0]}) * ({v[1]}) + ({v[2]})",
    }
    return table[op]()
