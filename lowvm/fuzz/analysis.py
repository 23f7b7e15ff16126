"""What a spec's values can be: intervals, dyadic quanta, and where the GPU may differ.

The generator makes only valid programs; validity is a property of the values, not of
the syntax: an integer op must not overflow (the interpreter reports it as an error),
a division must not meet 0, a float op must not reach inf or NaN in a type that has
them, a float ``sum``/``dot`` must be exact in float32 (the GPU adds in another order
than the interpreter, so only an exact sum makes the two bit-identical). Each value is
tracked as a :class:`Val`: its type and tile shape, an interval holding every element
(0 included, as out-of-bounds loads read 0), and a quantum ``q`` (every element is a
multiple of ``2**q``). :func:`analyze` walks a spec and raises :class:`Invalid` at the
first op that breaks a rule; the generator asks :func:`apply_op` before it commits an op.

``taint`` marks values the GPU computes only approximately: ``exp`` (CUDA's ``expf`` is
within 2 ulp) and a float ``fma`` whose result is not exact in float32 (the GPU rounds
``fmaf`` once to float32, then to the tile's type). Only casts may follow a tainted
value; the GPU comparison then allows 2 ulp of the coarsest type it passed through
(``tol``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

import lowvm.fuzz.numerics as nm
from lowvm.dtypes import DType, float32, int32
from lowvm.fuzz.spec import BINARY, COMPARE, REDUCE, UNARY, Input, Op, Spec

__all__ = ["Val", "Invalid", "analyze", "apply_op", "input_val", "broadcast_shape",
           "F32_BITS", "dot_operand_vals"]

F32_BITS = 24  # float32's significand: a sum is exact while it needs at most 24 bits
_TAINT_OK = ("cast",)


class Invalid(Exception):
    """A spec (or a candidate op) that is not a valid program with defined results."""


@dataclass(frozen=True)
class Val:
    """One value of the chain: type, shape kind, bounds, quantum, GPU exactness."""

    dtype: DType
    shape: str
    lo: float
    hi: float
    q: int
    taint: bool = False
    tol: str | None = None  # the coarsest type since the taint (for the GPU tolerance)

    @property
    def mag(self) -> float:
        return max(abs(self.lo), abs(self.hi))


def _round(x: float, dt: DType) -> float:
    return float(nm.round_to_type(np.array([x]), dt)[0])


def _result(dt: DType, lo: float, hi: float, q: int, shape: str, what: str,
            saturate: bool = False, taint: bool = False, tol: str | None = None) -> Val:
    """The value of an op computed exactly in ``[lo, hi]`` and rounded to ``dt``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise Invalid(f"{what}: unbounded result")
    if dt.is_integer and not saturate:
        if lo < nm.min_value(dt) or hi > nm.max_value(dt):
            raise Invalid(f"{what}: [{lo}, {hi}] overflows {dt.name}")
    rlo, rhi = _round(lo, dt), _round(hi, dt)
    if not (math.isfinite(rlo) and math.isfinite(rhi)):
        raise Invalid(f"{what}: [{lo}, {hi}] overflows {dt.name} to inf")
    if dt.is_integer:
        q = max(q, 0)
    else:
        q = max(q, nm.quantum_exp(dt))
    return Val(dt, shape, rlo, rhi, q, taint, tol)


def broadcast_shape(*shapes: str) -> str:
    """The shape kind of an elementwise result: full unless all operands agree."""
    kinds = set(shapes)
    return kinds.pop() if len(kinds) == 1 else "full"


def _scalar_q(s: float) -> int:
    """The largest ``q`` with ``s`` a multiple of ``2**q``."""
    if s == 0:
        return 10**6
    mant, exp = math.frexp(abs(s))
    bits = 0
    while mant != int(mant):
        mant *= 2
        bits += 1
    return exp - bits


def input_val(inp: Input) -> Val:
    """The value of an input: its declared range widened to hold 0."""
    dt = nm.type_by_name(inp.dtype)
    return Val(dt, inp.shape, min(inp.lo, 0.0), max(inp.hi, 0.0),
               max(inp.q, nm.quantum_exp(dt)))


def _operand(vals: list[Val], op: Op, i: int) -> Val:
    if i >= len(op.args):
        raise Invalid(f"{op.op}: missing operand {i}")
    ref = op.args[i]
    if not 0 <= ref < len(vals):
        raise Invalid(f"{op.op}: value {ref} does not exist")
    return vals[ref]


def _scalar_val(op: Op, like: Val) -> Val:
    s = op.scalar
    if like.dtype.is_float and _round(float(s), like.dtype) != float(s):
        raise Invalid(f"scalar {s} is not a {like.dtype.name} value")
    if not like.dtype.is_float and isinstance(s, int) and not (
            nm.min_value(like.dtype) <= s <= nm.max_value(like.dtype)):
        raise Invalid(f"scalar {s} is outside {like.dtype.name}")
    return Val(like.dtype, like.shape, float(s), float(s), _scalar_q(float(s)))


def _binary_bounds(name: str, a: Val, b: Val, integer: bool) -> tuple[float, float, int]:
    """Exact bounds of ``a op b`` and the quantum of the exact result."""
    q = min(a.q, b.q)
    if name == "add":
        return a.lo + b.lo, a.hi + b.hi, q
    if name == "sub":
        return a.lo - b.hi, a.hi - b.lo, q
    if name == "mul":
        p = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
        return min(p), max(p), a.q + b.q
    if name == "max":
        return max(a.lo, b.lo), max(a.hi, b.hi), q
    if name == "min":
        return min(a.lo, b.lo), min(a.hi, b.hi), q
    if name in ("div", "mod"):
        if b.lo <= 0 <= b.hi:
            raise Invalid(f"{name}: the divisor's range [{b.lo}, {b.hi}] holds 0")
        if name == "mod":
            if not integer:
                raise Invalid("mod needs an integer type")
            m = min(a.mag, max(abs(b.lo), abs(b.hi)) - 1)
            return (-m if a.lo < 0 else 0.0), (m if a.hi > 0 else 0.0), 0
        p = [a.lo / b.lo, a.lo / b.hi, a.hi / b.lo, a.hi / b.hi]
        if integer:
            return float(math.trunc(min(p))), float(math.trunc(max(p))), 0
        return min(p), max(p), -10**6
    raise Invalid(f"unknown binary op {name}")


def apply_op(vals: list[Val], op: Op, block: tuple[int, int]) -> Val:
    """The value ``op`` computes from ``vals`` (the values before it), or :class:`Invalid`.

    ``block`` is the tile ``(bm, bn)`` (the extents a reduction runs over).
    """
    what = op.op
    a = _operand(vals, op, 0)
    if a.taint and op.op not in _TAINT_OK:
        raise Invalid(f"{what}: only casts may follow an approximate (GPU) value")
    if op.op == "cast":
        dt = nm.type_by_name(op.dtype)
        tol = a.tol
        if a.taint and tol is not None:
            tol = dt.name if _coarser(dt, nm.type_by_name(tol)) else tol
        return _result(dt, a.lo, a.hi, a.q, a.shape, what, saturate=True, taint=a.taint,
                       tol=tol)
    if op.op == "bitcast":
        dt = nm.type_by_name(op.dtype)
        if dt.nbits != a.dtype.nbits:
            raise Invalid(f"bitcast: {a.dtype.name} and {dt.name} differ in width")
        if a.dtype.is_float:  # the sign of a float zero (min/max of -0 and 0) is unspecified
            raise Invalid("bitcast: only integer codes are reinterpreted")
        if dt.is_float and (dt.nbits > 8 or dt.name in ("float8_e4m3", "float8_e5m2")):
            raise Invalid(f"bitcast: codes of {dt.name} include inf/NaN")
        return Val(dt, a.shape, nm.min_value(dt), nm.max_value(dt),
                   nm.quantum_exp(dt) if dt.is_float else 0)
    if op.op in UNARY:
        integer = not a.dtype.is_float
        if op.op == "neg":
            return _result(a.dtype, -a.hi, -a.lo, a.q, a.shape, what)
        if op.op == "abs":
            lo = 0.0 if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi))
            return _result(a.dtype, lo, a.mag, a.q, a.shape, what)
        if integer:
            raise Invalid(f"{op.op} needs a float type")
        if op.op == "sqrt":
            if a.lo < 0:
                raise Invalid("sqrt: the operand may be negative")
            return _result(a.dtype, math.sqrt(a.lo), math.sqrt(a.hi), -10**6, a.shape, what)
        if a.hi > 80:
            raise Invalid("exp: the operand may exceed 80")
        return _result(a.dtype, math.exp(a.lo), math.exp(a.hi), -10**6, a.shape, what,
                       taint=True, tol=a.dtype.name)
    if op.op in BINARY:
        b = _scalar_val(op, a) if op.scalar is not None else _operand(vals, op, 1)
        if b.taint:
            raise Invalid(f"{what}: only casts may follow an approximate (GPU) value")
        if b.dtype != a.dtype:
            raise Invalid(f"{what}: operand types {a.dtype.name} and {b.dtype.name} differ")
        if isinstance(op.scalar, float) and op.op == "mod":
            raise Invalid("mod: a float scalar")
        integer = not a.dtype.is_float and not isinstance(op.scalar, float)
        lo, hi, q = _binary_bounds(op.op, a, b, integer)
        if isinstance(op.scalar, float) and not a.dtype.is_float:
            q = 0  # an int tile times a float scalar: rounded to an integer
            lo, hi = math.floor(lo), math.ceil(hi)
        return _result(a.dtype, lo, hi, q, broadcast_shape(a.shape, b.shape), what)
    if op.op == "select":
        if op.cmp not in COMPARE:
            raise Invalid(f"select: unknown comparison {op.cmp}")
        if op.scalar is not None:
            x, y = _operand(vals, op, 1), _operand(vals, op, 2)
            other = _scalar_val(op, a)
        else:
            other, x, y = _operand(vals, op, 1), _operand(vals, op, 2), _operand(vals, op, 3)
        if other.dtype != a.dtype or x.dtype != y.dtype:
            raise Invalid("select: compared or selected types differ")
        if any(v.taint for v in (other, x, y)):
            raise Invalid("select: only casts may follow an approximate (GPU) value")
        shape = broadcast_shape(a.shape, other.shape, x.shape, y.shape)
        return _result(x.dtype, min(x.lo, y.lo), max(x.hi, y.hi), min(x.q, y.q), shape, what)
    if op.op == "fma":
        b, c = _operand(vals, op, 1), _operand(vals, op, 2)
        if len({a.dtype, b.dtype, c.dtype}) > 1:
            raise Invalid("fma: operand types differ")
        if b.taint or c.taint:
            raise Invalid("fma: only casts may follow an approximate (GPU) value")
        lo, hi, q = _binary_bounds("mul", a, b, not a.dtype.is_float)
        q = min(q, c.q)
        lo, hi = lo + c.lo, hi + c.hi
        exact = not a.dtype.is_float or max(abs(lo), abs(hi)) < 2.0 ** (q + F32_BITS)
        return _result(a.dtype, lo, hi, q, broadcast_shape(a.shape, b.shape, c.shape), what,
                       taint=not exact, tol=None if exact else a.dtype.name)
    if op.op == "reduce":
        if a.shape != "full":
            raise Invalid("reduce: only full tiles are reduced")
        if op.reduce not in REDUCE or op.dim not in (0, 1):
            raise Invalid(f"reduce: bad op {op.reduce} or dim {op.dim}")
        shape = "col" if op.dim == 0 else "row"
        if op.reduce != "sum":
            return Val(a.dtype, shape, a.lo, a.hi, a.q)
        n = block[op.dim]
        lo, hi = n * min(a.lo, 0.0), n * max(a.hi, 0.0)
        if a.dtype.is_float and max(abs(lo), abs(hi)) >= 2.0 ** (a.q + F32_BITS):
            raise Invalid("reduce sum: not exact in float32 (the GPU's order differs)")
        return _result(a.dtype, lo, hi, a.q, shape, what)
    raise Invalid(f"unknown op {op.op}")


def _coarser(a: DType, b: DType) -> bool:
    """``a``'s ulp is coarser than ``b``'s at a given magnitude."""
    return nm.mantissa_bits(a) < nm.mantissa_bits(b) or (a.is_integer and not b.is_integer)


def dot_operand_vals(spec: Spec) -> tuple[Val, Val]:
    """The values ``vm.dot`` multiplies: ``a``, and ``b`` (after the cast of a packed b)."""
    assert spec.a is not None and spec.b is not None
    a, b = input_val(spec.a), input_val(spec.b)
    if spec.b_packed:
        b = _result(a.dtype, b.lo, b.hi, b.q, "full", "cast of b", saturate=True)
    elif b.dtype != a.dtype:
        raise Invalid("dot: a and b types differ")
    return a, b


def _acc_val(spec: Spec) -> Val:
    a, b = dot_operand_vals(spec)
    if a.dtype.name not in ("float16", "bfloat16", "int8", "uint8"):
        raise Invalid(f"dot: {a.dtype.name} operands are not supported")
    k = spec.steps * spec.bk
    bound = k * a.mag * b.mag
    acc = float32 if a.dtype.is_float else int32
    q = a.q + b.q
    if acc.is_float and bound >= 2.0 ** (q + F32_BITS):
        raise Invalid("dot: the sums are not exact in float32 (the GPU's order differs)")
    if not acc.is_float and bound > 2**31 - 1:
        raise Invalid("dot: the int32 sums may overflow")
    return Val(acc, "full", -bound, bound, q)


def _accumulated(spec: Spec, v: Val) -> Val:
    """The loop family's accumulator after ``steps`` iterations of ``v``."""
    if spec.accumulate != "add":
        return dataclasses.replace(v, lo=min(v.lo, 0.0), hi=max(v.hi, 0.0))
    if v.taint:
        raise Invalid("accumulate: only casts may follow an approximate (GPU) value")
    lo, hi = spec.steps * min(v.lo, 0.0), spec.steps * max(v.hi, 0.0)
    if v.dtype.is_float:  # each step rounds: leave a margin of one ulp per step
        ulp = float(nm.ulp(np.array([max(abs(lo), abs(hi))]), v.dtype)[0])
        lo, hi = lo - spec.steps * ulp, hi + spec.steps * ulp
    return _result(v.dtype, lo, hi, v.q, v.shape, "accumulate")


def analyze(spec: Spec) -> list[Val]:
    """Every value of ``spec`` (the final one: the stored, output-typed value), or
    :class:`Invalid` naming the first broken rule."""
    vals: list[Val] = []
    if spec.family == "dot":
        vals.append(_acc_val(spec))
    vals.extend(input_val(i) for i in spec.inputs)
    for op in spec.ops:
        vals.append(apply_op(vals, op, spec.tile))
    if not vals:
        raise Invalid("no values")
    last = vals[-1]
    if spec.family == "loop":
        last = _accumulated(spec, last)
    out = apply_op([last], Op("cast", (0,), dtype=spec.out_dtype), spec.tile)
    vals.append(out)
    return vals
