"""Symbolic scalar expressions: runtime sizes, indices and loop variables.

Global layouts have sizes known only at launch (``M``, ``K``), and the VM's loops and
indices mix compile-time and runtime values. An :class:`Expr` is a small immutable tree
that folds constants as it is built, evaluates with an environment of bindings, and
prints as C. Integer division and remainder truncate toward zero, as in C/CUDA, so the
CPU interpreter and the generated kernel agree on every value.

Two evaluations: :func:`evaluate` with Python's unbounded integers, for what the host
computes (a launch's grid), and :func:`evaluate_int32` with the GPU's: every integer
operation of a kernel's index and loop arithmetic is a 32-bit one, so its result wraps
(or, checked, is reported as :class:`Int32OverflowError`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Union

from lowvm.errors import LowvmError

__all__ = [
    "Expr",
    "Const",
    "Var",
    "BinOp",
    "UnaryOp",
    "Select",
    "ExprLike",
    "as_expr",
    "evaluate",
    "free_vars",
    "is_const",
    "const_value",
    "select",
    "minimum",
    "maximum",
    "ExprError",
    "known_multiple",
    "compile_exprs",
    "evaluate_int32",
    "wrap_int32",
    "Int32OverflowError",
    "INT32_MIN",
    "INT32_MAX",
]

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


class ExprError(LowvmError, ValueError):
    """An expression that cannot be built or evaluated (unbound variable, bad operand)."""


class Int32OverflowError(ExprError):
    """A runtime integer expression whose exact value leaves int32, where the GPU's 32-bit
    arithmetic would wrap it (reported by the checked interpreter)."""


ExprLike = Union["Expr", int, float, bool]


def _c_div(a: int, b: int) -> int:
    if b == 0:
        raise ExprError("division by zero in a scalar expression")
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _c_mod(a: int, b: int) -> int:
    return a - _c_div(a, b) * b


def _div(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return _c_div(a, b)
    return a / b


_BINARY: dict[str, Callable] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _div,
    "%": lambda a, b: _c_mod(a, b) if isinstance(a, int) and isinstance(b, int) else a % b,
    "min": min,
    "max": max,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
    "&&": lambda a, b: bool(a) and bool(b),
    "||": lambda a, b: bool(a) or bool(b),
    "&": operator.and_,
    "|": operator.or_,
    "^": operator.xor,
    "<<": operator.lshift,
    ">>": operator.rshift,
}
_UNARY: dict[str, Callable] = {"-": operator.neg, "!": operator.not_, "~": operator.invert}
_COMPARISONS = {"<", "<=", ">", ">=", "==", "!=", "&&", "||"}


class Expr:
    """Base of scalar expressions. Arithmetic operators build new, folded expressions."""

    __slots__ = ()

    # arithmetic -------------------------------------------------------------------
    def __add__(self, other: ExprLike) -> Expr:
        return _binary("+", self, other)

    def __radd__(self, other: ExprLike) -> Expr:
        return _binary("+", other, self)

    def __sub__(self, other: ExprLike) -> Expr:
        return _binary("-", self, other)

    def __rsub__(self, other: ExprLike) -> Expr:
        return _binary("-", other, self)

    def __mul__(self, other: ExprLike) -> Expr:
        return _binary("*", self, other)

    def __rmul__(self, other: ExprLike) -> Expr:
        return _binary("*", other, self)

    def __floordiv__(self, other: ExprLike) -> Expr:
        return _binary("/", self, other)

    def __rfloordiv__(self, other: ExprLike) -> Expr:
        return _binary("/", other, self)

    def __mod__(self, other: ExprLike) -> Expr:
        return _binary("%", self, other)

    def __rmod__(self, other: ExprLike) -> Expr:
        return _binary("%", other, self)

    def __neg__(self) -> Expr:
        return _unary("-", self)

    def __and__(self, other: ExprLike) -> Expr:
        return _binary("&", self, other)

    def __or__(self, other: ExprLike) -> Expr:
        return _binary("|", self, other)

    def __xor__(self, other: ExprLike) -> Expr:
        return _binary("^", self, other)

    def __lshift__(self, other: ExprLike) -> Expr:
        return _binary("<<", self, other)

    def __rshift__(self, other: ExprLike) -> Expr:
        return _binary(">>", self, other)

    # comparisons build expressions; == and != stay structural (Exprs are dict keys)
    def __lt__(self, other: ExprLike) -> Expr:
        return _binary("<", self, other)

    def __le__(self, other: ExprLike) -> Expr:
        return _binary("<=", self, other)

    def __gt__(self, other: ExprLike) -> Expr:
        return _binary(">", self, other)

    def __ge__(self, other: ExprLike) -> Expr:
        return _binary(">=", self, other)

    def equals(self, other: ExprLike) -> Expr:
        """The expression ``self == other`` (``==`` itself compares trees)."""
        return _binary("==", self, other)

    def not_equals(self, other: ExprLike) -> Expr:
        """The expression ``self != other``."""
        return _binary("!=", self, other)

    def logical_and(self, other: ExprLike) -> Expr:
        """The expression ``self && other``."""
        return _binary("&&", self, other)

    def logical_or(self, other: ExprLike) -> Expr:
        """The expression ``self || other``."""
        return _binary("||", self, other)

    def __bool__(self) -> bool:
        value = const_value(self)
        if value is None:
            raise ExprError(
                f"the runtime value {self} has no truth value while the program is being "
                "built; use the VM's `if_`/`where` for runtime conditions"
            )
        return bool(value)

    def __int__(self) -> int:
        value = const_value(self)
        if value is None:
            raise ExprError(f"the runtime value {self} is not a compile-time integer")
        return int(value)

    def __index__(self) -> int:
        return self.__int__()


@dataclass(frozen=True, eq=False, repr=False)
class Const(Expr):
    """A compile-time number."""

    value: int | float | bool

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Const)
            and type(other.value) is type(self.value)
            and other.value == self.value
        )

    def __str__(self) -> str:
        if isinstance(self.value, bool):
            return "true" if self.value else "false"
        return repr(self.value)

    __repr__ = __str__

    def __hash__(self) -> int:
        return hash((Const, type(self.value), self.value))


@dataclass(frozen=True, eq=True, repr=False)
class Var(Expr):
    """A named runtime value: a kernel argument, a loop variable, a thread index."""

    name: str
    dtype: str = "int32"

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__

    def __hash__(self) -> int:
        return hash((Var, self.name, self.dtype))


@dataclass(frozen=True, eq=True, repr=False)
class BinOp(Expr):
    """``lhs op rhs`` (``op`` is ``min``/``max`` for those functions)."""

    op: str
    lhs: Expr
    rhs: Expr

    def __str__(self) -> str:
        if self.op in ("min", "max"):
            return f"{self.op}({self.lhs}, {self.rhs})"
        return f"({self.lhs} {self.op} {self.rhs})"

    __repr__ = __str__

    def __hash__(self) -> int:
        return hash((BinOp, self.op, self.lhs, self.rhs))


@dataclass(frozen=True, eq=True, repr=False)
class UnaryOp(Expr):
    """``op operand``."""

    op: str
    operand: Expr

    def __str__(self) -> str:
        return f"({self.op}{self.operand})"

    __repr__ = __str__

    def __hash__(self) -> int:
        return hash((UnaryOp, self.op, self.operand))


@dataclass(frozen=True, eq=True, repr=False)
class Select(Expr):
    """``cond ? then : other``."""

    cond: Expr
    then: Expr
    other: Expr

    def __str__(self) -> str:
        return f"({self.cond} ? {self.then} : {self.other})"

    __repr__ = __str__

    def __hash__(self) -> int:
        return hash((Select, self.cond, self.then, self.other))


def as_expr(value: ExprLike) -> Expr:
    """Wrap a Python number as a :class:`Const`; return an :class:`Expr` unchanged."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, (bool, int, float)):
        return Const(value)
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:  # numpy scalar
        return Const(value.item())
    raise ExprError(
        f"expected an integer, float, bool or lowvm expression, got {value!r} "
        f"of type {type(value).__name__}"
    )


def is_const(value: ExprLike) -> bool:
    """True when ``value`` is known at compile time."""
    return not isinstance(value, Expr) or isinstance(value, Const)


def const_value(value: ExprLike) -> int | float | bool | None:
    """The compile-time value of ``value``, or None when it depends on runtime values."""
    if isinstance(value, Const):
        return value.value
    if isinstance(value, Expr):
        return None
    return value


def _binary(op: str, lhs: ExprLike, rhs: ExprLike) -> Expr:
    a, b = as_expr(lhs), as_expr(rhs)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(_BINARY[op](a.value, b.value))
    av, bv = const_value(a), const_value(b)
    if op == "+":
        if av == 0 and not isinstance(av, bool):
            return b
        if bv == 0 and not isinstance(bv, bool):
            return a
    elif op == "-" and bv == 0:
        return a
    elif op == "*":
        if av == 0 or bv == 0:
            return Const(0)
        if av == 1:
            return b
        if bv == 1:
            return a
    elif op == "/" and bv == 1:
        return a
    elif op == "/" and _undoes_scaling(a, bv):
        # (x * c) / c is x: exact for unbounded integers and, c a power of two, for
        # floats short of overflow. The folded form is what the program means: the
        # interpreter and the kernel both evaluate it, so they agree where x * c would
        # wrap in int32. The C compiler cannot assume it (int32 could wrap), so
        # `kt * bk // group` with bk == group would cost a mask and a shift per use
        return a.lhs if _is_int(const_value(a.rhs), bv) else a.rhs
    elif op == "%" and bv == 1:
        return Const(0)
    elif op == "&&":
        if av is True:
            return b
        if bv is True:
            return a
        if av is False or bv is False:
            return Const(False)
    elif op == "||":
        if av is False:
            return b
        if bv is False:
            return a
    return BinOp(op, a, b)


def _undoes_scaling(a: Expr, c) -> bool:
    """Whether ``a`` is ``x * c`` or ``c * x`` for a positive power-of-two integer ``c``."""
    if isinstance(c, bool) or not isinstance(c, int) or c <= 0 or c & (c - 1):
        return False
    return (isinstance(a, BinOp) and a.op == "*"
            and any(_is_int(const_value(side), c) for side in (a.lhs, a.rhs)))


def _is_int(value, c: int) -> bool:
    """``value`` is the integer ``c`` (not a bool or a float equal to it)."""
    return isinstance(value, int) and not isinstance(value, bool) and value == c


def _unary(op: str, operand: ExprLike) -> Expr:
    a = as_expr(operand)
    if isinstance(a, Const):
        return Const(_UNARY[op](a.value))
    return UnaryOp(op, a)


def select(cond: ExprLike, then: ExprLike, other: ExprLike) -> Expr:
    """``cond ? then : other``, folded when ``cond`` is known."""
    c = as_expr(cond)
    if isinstance(c, Const):
        return as_expr(then) if c.value else as_expr(other)
    return Select(c, as_expr(then), as_expr(other))


def minimum(a: ExprLike, b: ExprLike) -> Expr:
    """``min(a, b)``."""
    return _binary("min", a, b)


def maximum(a: ExprLike, b: ExprLike) -> Expr:
    """``max(a, b)``."""
    return _binary("max", a, b)


def evaluate(expr: ExprLike, env: Mapping[str, int | float | bool] | None = None):
    """The value of ``expr`` with variables bound by ``env`` (C semantics for / and %)."""
    env = env or {}
    e = as_expr(expr)
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Var):
        if e.name not in env:
            raise ExprError(f"the variable {e.name!r} has no value; bound: {sorted(env)}")
        return env[e.name]
    if isinstance(e, BinOp):
        return _BINARY[e.op](evaluate(e.lhs, env), evaluate(e.rhs, env))
    if isinstance(e, UnaryOp):
        return _UNARY[e.op](evaluate(e.operand, env))
    if isinstance(e, Select):
        return evaluate(e.then, env) if evaluate(e.cond, env) else evaluate(e.other, env)
    raise ExprError(f"cannot evaluate {e!r}")


def wrap_int32(value: int) -> int:
    """``value`` modulo 2^32, as a two's complement int32 (what a 32-bit register holds)."""
    return (value - INT32_MIN) % 2**32 + INT32_MIN


def _plain_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def evaluate_int32(expr: ExprLike, env: Mapping[str, int | float | bool] | None = None,
                   checked: bool = False):
    """The value of ``expr`` as the GPU computes it: every integer ``+ - * / % << >>`` and
    negation in int32, its result wrapped to 32 bits; with ``checked``, a result the
    wrap changes raises :class:`Int32OverflowError` instead.

    ``/`` and ``%`` truncate (C); a shift by a count outside [0, 31] gives what the
    32-bit shift instructions give (``<<``: 0, ``>>``: the sign) and is reported when
    ``checked``; ``&&``, ``||`` and selects evaluate only the side C evaluates. An integer
    constant beyond int32 is refused in both modes (the C compiler would compute its
    subexpression in 64 bits). Float operands keep Python's float arithmetic.
    """
    env = env or {}
    e = as_expr(expr)
    if isinstance(e, Const):
        if _plain_int(e.value) and not INT32_MIN <= e.value <= INT32_MAX:
            raise ExprError(f"the integer constant {e.value} in a runtime expression does "
                            f"not fit int32 [{INT32_MIN}, {INT32_MAX}], the type of the "
                            "GPU's index and loop arithmetic")
        return e.value
    if isinstance(e, Var):
        if e.name not in env:
            raise ExprError(f"the variable {e.name!r} has no value; bound: {sorted(env)}")
        return env[e.name]
    if isinstance(e, BinOp):
        a = evaluate_int32(e.lhs, env, checked)
        if e.op == "&&" and not a:
            return False
        if e.op == "||" and a:
            return True
        b = evaluate_int32(e.rhs, env, checked)
        if _plain_int(a) and _plain_int(b):
            return _int32_binary(e, a, b, checked)
        return _BINARY[e.op](a, b)
    if isinstance(e, UnaryOp):
        a = evaluate_int32(e.operand, env, checked)
        if e.op == "-" and _plain_int(a):
            return _int32_result(e, -a, checked, f"-({a})")
        return _UNARY[e.op](a)
    if isinstance(e, Select):
        cond = evaluate_int32(e.cond, env, checked)
        return evaluate_int32(e.then if cond else e.other, env, checked)
    raise ExprError(f"cannot evaluate {e!r}")


def _int32_binary(e: BinOp, a: int, b: int, checked: bool) -> int | bool:
    op = e.op
    if op in ("+", "-", "*"):
        return _int32_result(e, _BINARY[op](a, b), checked, f"{a} {op} {b}")
    if op in ("/", "%"):
        if b == 0:
            raise ExprError(f"division by zero in the runtime expression {e}: {a} {op} 0")
        exact = _c_div(a, b) if op == "/" else _c_mod(a, b)
        return _int32_result(e, exact, checked, f"{a} {op} {b}")
    if op in ("<<", ">>"):
        if not 0 <= b <= 31:
            if checked:
                raise Int32OverflowError(
                    f"int32 overflow in {e}: a shift by {b}; accepted: shift counts 0 to 31")
            return 0 if op == "<<" else a >> 31
        if op == ">>":
            return a >> b
        return _int32_result(e, a << b, checked, f"{a} << {b}")
    return _BINARY[op](a, b)


def _int32_result(e: Expr, exact: int, checked: bool, what: str) -> int:
    """``exact`` wrapped to int32; reported instead when ``checked`` and it does not fit."""
    if INT32_MIN <= exact <= INT32_MAX:
        return exact
    wrapped = wrap_int32(exact)
    if checked:
        raise Int32OverflowError(
            f"int32 overflow in {e}: {what} = {exact}, outside [{INT32_MIN}, {INT32_MAX}] "
            f"(the GPU's 32-bit arithmetic gives {wrapped})")
    return wrapped


def free_vars(expr: ExprLike) -> frozenset[Var]:
    """Every :class:`Var` that ``expr`` mentions."""
    e = as_expr(expr)
    if isinstance(e, Var):
        return frozenset({e})
    if isinstance(e, BinOp):
        return free_vars(e.lhs) | free_vars(e.rhs)
    if isinstance(e, UnaryOp):
        return free_vars(e.operand)
    if isinstance(e, Select):
        return free_vars(e.cond) | free_vars(e.then) | free_vars(e.other)
    return frozenset()


def known_multiple(expr: ExprLike) -> int:
    """The largest number ``expr`` is provably a multiple of (0 for the constant 0).

    What vectorization needs: ``kk * 64 + row0`` with ``row0 = b * 32`` is a multiple of
    32 whatever ``kk`` and ``b`` are, so a 16-byte access starting there is aligned.
    """
    import math

    e = as_expr(expr)
    if isinstance(e, Const):
        return abs(int(e.value)) if not isinstance(e.value, float) else 1
    if isinstance(e, BinOp):
        a, b = known_multiple(e.lhs), known_multiple(e.rhs)
        if e.op in ("+", "-"):
            return math.gcd(a, b)
        if e.op == "*":
            return a * b
        if e.op == "<<" and isinstance(e.rhs, Const):
            return a << int(e.rhs.value)
        if e.op == "/" and isinstance(e.rhs, Const) and e.rhs.value and a % e.rhs.value == 0:
            return a // abs(int(e.rhs.value))
        if e.op in ("min", "max"):
            return math.gcd(a, b)
    if isinstance(e, UnaryOp) and e.op == "-":
        return known_multiple(e.operand)
    if isinstance(e, Select):
        return math.gcd(known_multiple(e.then), known_multiple(e.other))
    return 1


_INFIX = {"+", "-", "*", "<", "<=", ">", ">=", "==", "!=", "&", "|", "^", "<<", ">>"}


def _python(e: Expr) -> str:
    if isinstance(e, Const):
        return repr(e.value)
    if isinstance(e, Var):
        return e.name
    if isinstance(e, BinOp):
        a, b = _python(e.lhs), _python(e.rhs)
        return f"({a} {e.op} {b})" if e.op in _INFIX else f"_B[{e.op!r}]({a}, {b})"
    if isinstance(e, UnaryOp):
        return f"_U[{e.op!r}]({_python(e.operand)})"
    if isinstance(e, Select):
        return f"({_python(e.then)} if {_python(e.cond)} else {_python(e.other)})"
    raise ExprError(f"cannot compile {e!r}")


def compile_exprs(exprs: tuple[ExprLike, ...], names: tuple[str, ...]) -> Callable[..., tuple]:
    """A Python function of ``names`` returning every expression's value, as ints.

    What :func:`evaluate` computes (C semantics for ``/`` and ``%``), without walking the
    tree on each call: a launch evaluates its grid this way in well under a microsecond.
    """
    body = ", ".join(f"int({_python(as_expr(e))})" for e in exprs)
    source = f"def _f({', '.join(names)}):\n    return ({body}{',' if len(exprs) == 1 else ''})"
    scope: dict = {"_B": _BINARY, "_U": _UNARY}
    exec(compile(source, "<lowvm expr>", "exec"), scope)  # noqa: S102 - our own generated code
    return scope["_f"]
