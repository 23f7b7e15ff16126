"""What a spec computes, in numpy, from the spec alone (never from the interpreter).

The documented semantics (``docs/language.md``, ``docs/architecture.md``), applied to
whole grids at once: every value is an array ``[GM, GN, rows, cols]`` (block row, block
column, the tile: ``[bm, bn]``, ``[bm, 1]`` or ``[1, bn]``); out-of-bounds elements of
loads are 0; each op is computed exactly (float64, int64 for integers) and rounded once
to its type (:func:`lowvm.fuzz.numerics.round_to_type`: nearest even, saturating or to
inf as the type says); integer division truncates toward zero; reductions and dots sum
exactly and round once; the loop family rounds its accumulator after every step, in
order; stores skip what lies outside the output. Runtime index arithmetic is int32: a
``wrap`` spec's inputs start ``u * v + t`` rows past the block's, that sum taken modulo
2^32 (:func:`_int32`); a ``runtime_step`` loop visits the chunks as Python's
``range`` does, down from the last one for a negative step.
"""

from __future__ import annotations

import numpy as np

import lowvm.fuzz.numerics as nm
from lowvm.dtypes import DType
from lowvm.fuzz.analysis import analyze
from lowvm.fuzz.generate import Arrays, output_geometry
from lowvm.fuzz.spec import Op, Spec

__all__ = ["reference", "ReferenceError"]


class ReferenceError(Exception):
    """The reference met a value the spec's analysis promised could not occur (a
    generator bug: the spec is reported as an error, not as a mismatch)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _int32(value: int) -> int:
    """``value`` modulo 2^32 as a signed 32-bit number: what the GPU's registers hold."""
    wrapped = value & 0xFFFFFFFF
    return wrapped - (1 << 32) if wrapped >> 31 else wrapped


def _row_shift(spec: Spec) -> int:
    if not spec.wrap:
        return 0
    u, v, t, _ = spec.ints
    return _int32(_int32(u * v) + t)


def _chunk_order(spec: Spec, chunks: int) -> range:
    """The chunks a loop visits, in order."""
    if not spec.runtime_step:
        return range(chunks)
    step = spec.ints[3]
    return range(0, chunks, step) if step > 0 else range(chunks - 1, -1, step)


def _rounded(x: np.ndarray, dt: DType, what: str) -> np.ndarray:
    """``x`` (exact) as a value of ``dt``; integers must already fit."""
    if dt.is_integer:
        x = np.asarray(x)
        if x.dtype.kind == "f":
            if not np.isfinite(x).all():
                raise ReferenceError(f"{what}: a non-finite value for {dt.name}")
            x = np.rint(x)
        if x.size and (x.min() < nm.min_value(dt) or x.max() > nm.max_value(dt)):
            raise ReferenceError(f"{what}: {dt.name} overflow")
        return x.astype(np.int64)
    y = nm.round_to_type(np.asarray(x, dtype=np.float64), dt)
    if np.isnan(y).any() or (np.isinf(y).any() and not np.isinf(x).any()):
        raise ReferenceError(f"{what}: NaN or overflow to inf in {dt.name}")
    return y


def _cast(x: np.ndarray, dt: DType) -> np.ndarray:
    """A conversion (saturating where the type does)."""
    y = nm.round_to_type(np.asarray(x, dtype=np.float64), dt)
    return y.astype(np.int64) if dt.is_integer else y


def _codes(values: np.ndarray, dt: DType) -> np.ndarray:
    """Bit patterns of exact values of an integer type (two's complement)."""
    return np.asarray(values, dtype=np.int64) & (2**dt.nbits - 1)


def _from_codes(codes: np.ndarray, dt: DType) -> np.ndarray:
    if dt.nbits <= 8:
        vals = nm.code_values(dt)[codes]
        return vals.astype(np.int64) if dt.is_integer else vals
    if dt.name == "int32":
        return codes.astype(np.uint32).view(np.int32).astype(np.int64)
    raise ReferenceError(f"bitcast to {dt.name}")


def _binary(name: str, a: np.ndarray, b: np.ndarray, integer: bool) -> np.ndarray:
    if name == "add":
        return a + b
    if name == "sub":
        return a - b
    if name == "mul":
        return a * b
    if name == "max":
        return np.maximum(a, b)
    if name == "min":
        return np.minimum(a, b)
    if name in ("div", "mod"):
        if np.any(b == 0):
            raise ReferenceError(f"{name} by zero")
        if integer:
            q = np.abs(a) // np.abs(b)
            q = np.where((a < 0) != (b < 0), -q, q)
            return q if name == "div" else a - q * b
        return a / b
    raise ReferenceError(f"unknown op {name}")


_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "eq": np.equal, "ne": np.not_equal}


def _scalar(value: float | int) -> np.ndarray:
    return np.asarray(value, dtype=np.float64 if isinstance(value, float) else np.int64)


def _op(op: Op, values: list[np.ndarray], types: list[DType], out: DType) -> np.ndarray:
    args = [values[i] for i in op.args]
    what = f"{op.op} of values {list(op.args)}"
    if op.op == "cast":
        return _cast(args[0], out)
    if op.op == "bitcast":
        return _from_codes(_codes(args[0], types[op.args[0]]), out)
    if op.op == "neg":
        return _rounded(np.negative(args[0]), out, what)
    if op.op == "abs":
        return _rounded(np.abs(args[0]), out, what)
    if op.op == "exp":
        return _rounded(np.exp(args[0]), out, what)
    if op.op == "sqrt":
        return _rounded(np.sqrt(args[0]), out, what)
    if op.op in ("add", "sub", "mul", "div", "mod", "max", "min"):
        b = _scalar(op.scalar) if op.scalar is not None else args[1]
        integer = out.is_integer and not isinstance(op.scalar, float)
        return _rounded(_binary(op.op, args[0], b, integer), out, what)
    if op.op == "select":
        if op.scalar is not None:
            cond = _CMP[op.cmp](args[0], _scalar(op.scalar))
            x, y = args[1], args[2]
        else:
            cond = _CMP[op.cmp](args[0], args[1])
            x, y = args[2], args[3]
        return _rounded(np.where(cond, x, y), out, what)
    if op.op == "fma":
        return _rounded(args[0] * args[1] + args[2], out, what)
    if op.op == "reduce":
        axis = 2 + op.dim
        fn = {"sum": np.sum, "max": np.max, "min": np.min}[op.reduce]
        return _rounded(fn(args[0], axis=axis, keepdims=True), out, what)
    raise ReferenceError(f"unknown op {op.op}")


def _blocks(values: np.ndarray, shape: str, tile: tuple[int, int], grid: tuple[int, int],
            integer: bool, delta: int = 0) -> np.ndarray:
    """A global array ``[R, C]`` as ``[GM, GN, rows, cols]`` blocks, zero padded; each
    block's rows read ``delta`` rows further on (0 where that leaves the array)."""
    bm, bn = tile
    gm, gn = grid
    rows = gm * bm if shape != "col" else 1
    cols = gn * bn if shape != "row" else 1
    padded = np.zeros((rows, cols), dtype=np.int64 if integer else np.float64)
    r, c = values.shape
    lo, hi = max(0, -delta), min(rows, r - delta)  # rows whose source row is inside
    if lo < hi:
        padded[lo:hi, : min(c, cols)] = values[lo + delta:hi + delta, :cols]
    tr, tc = (rows // gm if shape != "col" else 1), (cols // gn if shape != "row" else 1)
    blocks = padded.reshape(gm if shape != "col" else 1, tr, gn if shape != "row" else 1, tc)
    return np.broadcast_to(blocks.transpose(0, 2, 1, 3), (gm, gn, tr, tc))


def _chain(spec: Spec, first: list[np.ndarray]) -> np.ndarray:
    """Run the ops of ``spec`` on the values ``first`` (accumulator and inputs)."""
    vals = analyze(spec)
    types = [v.dtype for v in vals]
    values = list(first)
    for i, op in enumerate(spec.ops):
        index = len(first) + i
        values.append(_op(op, values, types, types[index]))
    return values[-1]


def _unblock(blocks: np.ndarray, rows: int, cols: int) -> np.ndarray:
    gm, gn, tr, tc = blocks.shape
    return blocks.transpose(0, 2, 1, 3).reshape(gm * tr, gn * tc)[:rows, :cols]


def reference(spec: Spec, arrays: Arrays) -> np.ndarray:
    """The output values (float64 ``[rows, cols]``, :func:`output_geometry`) of ``spec``
    run on ``arrays``; :class:`ReferenceError` if the spec breaks its own analysis."""
    vals = analyze(spec)
    out_type = vals[-1].dtype
    m, n, k = spec.extent
    bm, bn = spec.tile
    inputs = spec.inputs
    in_values = arrays.values
    if spec.family == "dot":
        in_values = arrays.values[2:]
    ints = [nm.type_by_name(i.dtype).is_integer for i in inputs]
    delta = _row_shift(spec)

    if spec.family == "tile":
        grid = (_cdiv(m, bm), _cdiv(n, bn))
        first = [_blocks(v, i.shape, spec.tile, grid, integer, delta)
                 for v, i, integer in zip(in_values, inputs, ints)]
        last = _chain(spec, first)
    elif spec.family == "loop":
        grid = (_cdiv(m, bm), _cdiv(k, bn))
        first = [_blocks(v, i.shape, spec.tile, grid, integer, delta)
                 for v, i, integer in zip(in_values, inputs, ints)]
        per_step = _chain(spec, first)
        acc_type = vals[-2].dtype
        acc = np.zeros((grid[0], 1, *per_step.shape[2:]),
                       dtype=np.int64 if acc_type.is_integer else np.float64)
        for step in _chunk_order(spec, grid[1]):
            v = per_step[:, step : step + 1]
            if spec.accumulate == "add":
                acc = _rounded(acc + v, acc_type, "accumulate")
            else:
                fn = np.maximum if spec.accumulate == "max" else np.minimum
                acc = _rounded(fn(acc, v), acc_type, "accumulate")
        last = acc
    else:
        last = _dot_chain(spec, arrays, in_values, ints)

    final = _cast(last, out_type)
    rows, cols = output_geometry(spec)
    return _unblock(np.asarray(final, dtype=np.float64), rows, cols)


def _dot_chain(spec: Spec, arrays: Arrays, in_values: list[np.ndarray], ints: list[bool]
               ) -> np.ndarray:
    m, n, k = spec.extent
    bm, bn = spec.tile
    adt = nm.type_by_name(spec.a.dtype)
    gm, gn, gk = _cdiv(m, bm), _cdiv(n, bn), _cdiv(k, spec.bk)
    a = np.zeros((gm * bm, gk * spec.bk))
    a[:m, :k] = arrays.values[0]
    b = np.zeros((gk * spec.bk, gn * bn))
    if spec.b_packed:
        b[:k, :n] = _cast(arrays.values[1], adt).T  # dequantised to a's type, transposed
    else:
        b[:k, :n] = arrays.values[1]
    acc = a @ b  # exact: the analysis keeps every sum within float32's 24 bits
    if adt.is_float:
        if np.abs(acc).max(initial=0) >= 2.0**53:  # pragma: no cover - bounded by analysis
            raise ReferenceError("dot sums beyond float64's exact range")
    else:
        acc = np.rint(acc).astype(np.int64)
    first = [acc.reshape(gm, bm, gn, bn).transpose(0, 2, 1, 3)]
    first += [_blocks(v, i.shape, spec.tile, (gm, gn), integer)
              for v, i, integer in zip(in_values, spec.inputs, ints)]
    out = _chain(spec, first)
    return np.broadcast_to(out, out.shape)

