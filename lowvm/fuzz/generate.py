"""Seeded random valid VM programs (as :class:`~lowvm.fuzz.spec.Spec`) and their inputs.

Validity is built in, not filtered afterwards: every choice is drawn from the choices
that keep the program valid at that point (a layout whose threads match the warps, a
packed type whose values fill whole bytes per thread, a shared layout its tile admits,
an op whose result :func:`lowvm.fuzz.analysis.apply_op` accepts: no integer overflow, no
division by a range holding 0, float sums exact in float32, ...). An op the analysis
refuses is replaced by another draw, never emitted.

``generate(seed, index, share)``: program ``index`` of a run. Its *structure* (what the
CUDA source depends on) comes from ``(seed, index // share)`` and its *data* (extents,
input values) from ``(seed, index)``, so ``share`` consecutive programs reuse one
compiled kernel with different data. Both are deterministic across processes and runs.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

import lowvm.fuzz.numerics as nm
from lowvm.dtypes import DType
from lowvm.expr import wrap_int32
from lowvm.fuzz.analysis import Invalid, Val, analyze, apply_op, input_val
from lowvm.fuzz.build import is_packed, storage_type
from lowvm.fuzz.spec import BINARY, COMPARE, REDUCE, Input, Layout, Op, Spec

__all__ = ["generate", "generate_structure", "with_data", "validate", "make_arrays", "Arrays",
           "output_geometry", "POISON", "MAX_SHARED"]

MAX_SHARED = 32 * 1024  # the generator's budget of shared bytes per block
POISON = -77.0  # every output buffer starts as this value (uint8: 177); packed: 0xA5 bytes
POISON_BYTE = 0xA5
_WIDE_FLOATS = ("float16", "bfloat16", "float32")
_FLOAT_SCALARS = (0.5, 1.0, 2.0, -1.0, 0.25, 1.5, 3.0, -0.5, 4.0, 0.75)
_INT_SCALARS = (1, 2, 3, -1, -2, 5, 7, 16)
_INT_FLOAT_SCALARS = (0.5, 1.5, 0.25, -0.5, 2.5)


def generate(seed: int, index: int, share: int = 1) -> Spec:
    """Program ``index`` of the run with ``seed`` (see the module docstring)."""
    structure = generate_structure(random.Random(f"lowvm-fuzz:{seed}:{index // share}"))
    return with_data(structure, random.Random(f"lowvm-fuzz-data:{seed}:{index}"))


# -------------------------------------------------------------------------------------
# structure


def _pick_type(rng: random.Random, packed_ok=lambda dt: True, wide: float = 0.45) -> DType:
    for _ in range(50):
        if rng.random() < wide:
            dt = nm.type_by_name(rng.choice(("float16", "bfloat16", "float32", "int32")))
        else:
            dt = rng.choice(nm.low_types())
        if not is_packed(dt) or packed_ok(dt):
            return dt
    return nm.type_by_name("float32")


def _pick_dist(rng: random.Random, dt: DType) -> tuple[float, float, int]:
    """``(lo, hi, q)``: the values an input of ``dt`` holds."""
    if dt.is_integer:
        if dt.nbits > 8:
            mag = 2.0 ** rng.choice((3, 7, 12, 20, 30))
            return (0.0 if rng.random() < 0.3 else -mag), mag, 0
        lo, hi = nm.min_value(dt), nm.max_value(dt)
        if rng.random() < 0.4:
            lo, hi = float(rng.randint(int(lo), 0)), float(rng.randint(0, int(hi)))
        return lo, hi, 0
    qmin = nm.quantum_exp(dt)
    if dt.nbits <= 8:
        values = nm.finite_values(dt)
        hi = float(values[-1])
        if rng.random() < 0.4:
            hi = float(rng.choice([v for v in values if v > 0]))
        lo = 0.0 if rng.random() < 0.25 else -hi
        q = qmin if rng.random() < 0.7 else rng.randint(qmin, 0)
        return lo, hi, q
    e = rng.randint(-2, 8)
    hi = 2.0**e
    lo = 0.0 if rng.random() < 0.25 else -hi
    q = qmin if rng.random() < 0.5 else max(qmin, e - rng.randint(3, nm.mantissa_bits(dt) + 4))
    return lo, hi, q


def _smem_choices(rows: int, cols: int, st: DType) -> list[str]:
    kinds = ["row", "pad", "pad1"]
    nbytes = st.nbits // 8
    if nbytes in (1, 2, 4) and cols & (cols - 1) == 0 and cols * nbytes >= 128:
        kinds.append("swizzle")
    return kinds


def _pick_layout(rng: random.Random, warps: int) -> Layout:
    threads = 32 * warps
    while True:
        tc = rng.choice([t for t in (1, 2, 4, 8, 16, 32, 64) if t <= threads])
        tr = threads // tc
        inner = (rng.choice((1, 1, 2)), rng.choice((1, 2, 4, 8, 8)))
        outer = (rng.choice((1, 1, 2)), rng.choice((1, 1, 2)))
        lay = Layout(outer, (tr, tc), inner, column=rng.random() < 0.15)
        bm, bn = lay.shape
        if math.prod(outer) * math.prod(inner) <= 16 and bm <= 128 and bn <= 256:
            return lay


def _pick_tile(rng: random.Random, warps: int) -> tuple[int, int]:
    threads = 32 * warps
    while True:
        bm, bn = rng.choice((1, 2, 4, 8, 16, 32, 64)), rng.choice((8, 16, 32, 64, 128))
        if threads <= bm * bn <= 16 * threads:
            return bm, bn


def _packed_ok(layout: Layout | None, bn: int):
    """Which packed types a tile admits: whole bytes per thread (explicit layout) or
    per row (inferred)."""
    def ok(dt: DType) -> bool:
        g = nm.granule(dt)
        return (layout.inner[1] % g == 0) if layout is not None else bn % g == 0
    return ok


def _pick_input(rng: random.Random, tile: tuple[int, int], layout: Layout | None,
                allow_shapes: bool, allow_shared: bool, wide: float = 0.45) -> Input:
    dt = _pick_type(rng, _packed_ok(layout, tile[1]), wide)
    shape = "full"
    if allow_shapes and dt.nbits >= 8 and rng.random() < 0.25:
        shape = rng.choice(("row", "col"))
    path, smem = "global", "row"
    if allow_shared and shape == "full" and rng.random() < 0.5:
        path = rng.choice(("shared", "async"))
        st = storage_type(dt)
        cols = tile[1] * dt.nbits // 8 if is_packed(dt) else tile[1]
        smem = rng.choice(_smem_choices(tile[0], cols, st))
    lo, hi, q = _pick_dist(rng, dt)
    return Input(dt.name, shape, path, smem, lo, hi, q)


def _scalars_for(dt: DType, nonzero: bool) -> list[Any]:
    if dt.is_float:
        out = [s for s in _FLOAT_SCALARS
               if float(nm.round_to_type(np.array([s]), dt)[0]) == s]
    else:
        out = [s for s in _INT_SCALARS if nm.min_value(dt) <= s <= nm.max_value(dt)]
        out += list(_INT_FLOAT_SCALARS)
    return [s for s in out if not (nonzero and s == 0)]


def _pick_value(rng: random.Random, vals: list[Val], pred=lambda v: True) -> int | None:
    cands = [i for i, v in enumerate(vals) if pred(v)]
    if not cands:
        return None
    if len(vals) - 1 in cands and rng.random() < 0.5:
        return len(vals) - 1
    return rng.choice(cands)


def _candidate_op(rng: random.Random, vals: list[Val]) -> Op | None:
    kind = rng.choices(("cast", "unary", "binary", "scalar", "select", "fma", "reduce",
                        "bitcast"), weights=(20, 12, 20, 15, 8, 5, 10, 4))[0]
    a = _pick_value(rng, vals)
    if a is None:
        return None
    av = vals[a]
    same = lambda v: v.dtype == av.dtype  # noqa: E731
    if kind == "cast":
        target = _pick_type(rng, wide=0.5)
        return Op("cast", (a,), dtype=target.name)
    if kind == "bitcast":
        peers = [t for t in (*nm.low_types(), *nm.wide_types())
                 if t.nbits == av.dtype.nbits and t != av.dtype]
        return Op("bitcast", (a,), dtype=rng.choice(peers).name) if peers else None
    if kind == "unary":
        return Op(rng.choice(("neg", "abs", "exp", "sqrt", "abs")), (a,))
    if kind in ("binary", "scalar"):
        name = rng.choice(BINARY)
        if kind == "scalar":
            scalars = _scalars_for(av.dtype, name in ("div", "mod"))
            return Op(name, (a,), scalar=rng.choice(scalars)) if scalars else None
        b = _pick_value(rng, vals, same)
        return Op(name, (a, b))
    if kind == "select":
        cmp = rng.choice(COMPARE)
        x = _pick_value(rng, vals)
        y = _pick_value(rng, vals, lambda v: v.dtype == vals[x].dtype)
        if rng.random() < 0.5:
            scalars = _scalars_for(av.dtype, False)
            if scalars:
                return Op("select", (a, x, y), scalar=rng.choice(scalars), cmp=cmp)
        b = _pick_value(rng, vals, same)
        return Op("select", (a, b, x, y), cmp=cmp)
    if kind == "fma":
        b, c = _pick_value(rng, vals, same), _pick_value(rng, vals, same)
        return Op("fma", (a, b, c))
    full = _pick_value(rng, vals, lambda v: v.shape == "full")
    if full is None:
        return None
    return Op("reduce", (full,), reduce=rng.choice(REDUCE), dim=rng.randint(0, 1))


def _grow_ops(rng: random.Random, vals: list[Val], tile: tuple[int, int], count: int
              ) -> list[Op]:
    """Up to ``count`` ops, each one the analysis accepts."""
    ops: list[Op] = []
    for _ in range(count):
        for _attempt in range(40):
            op = _candidate_op(rng, vals)
            if op is None:
                continue
            try:
                val = apply_op(vals, op, tile)
            except Invalid:
                continue
            ops.append(op)
            vals.append(val)
            break
    return ops


def _finish(rng: random.Random, spec: Spec) -> Spec:
    """Pick the output type, path and row pitch; the spec must analyze."""
    final = analyze(dataclasses.replace(spec, out_dtype="float32"))[-2]
    bn = spec.tile[1]
    for _ in range(30):
        dt = final.dtype if rng.random() < 0.4 else _pick_type(rng, wide=0.5)
        if is_packed(dt) and dt.nbits < 8:
            if final.shape != "full":
                continue
            if spec.family == "dot" and nm.granule(dt) > 2:
                continue  # the MMA accumulator layout holds 2-element runs per thread
            if spec.layout is not None and spec.layout.inner[1] % nm.granule(dt):
                continue
            if bn % nm.granule(dt):
                continue
        candidate = dataclasses.replace(spec, out_dtype=dt.name)
        try:
            analyze(candidate)
        except Invalid:
            continue
        spec = candidate
        break
    else:
        spec = dataclasses.replace(spec, out_dtype="float32")
    shape = analyze(spec)[-1].shape
    if shape == "full" and rng.random() < 0.2:
        spec = dataclasses.replace(spec, out_path="shared")
    if rng.random() < 0.3:
        spec = dataclasses.replace(spec, out_pad=rng.choice((1, 3, 8, 16)))
    return spec


def _shared_bytes(spec: Spec) -> int:
    total = 0
    for inp in spec.inputs:
        if inp.path != "global":
            dt = nm.type_by_name(inp.dtype)
            total += spec.tile[0] * spec.tile[1] * dt.nbits // 8 * (
                spec.stages or 1 if inp.path == "async" else 1)
    return total + spec.tile[0] * spec.tile[1] * 4


def _tile_like(rng: random.Random, family: str) -> Spec:
    warps = rng.choice((1, 2, 4, 4))
    layout = _pick_layout(rng, warps) if rng.random() < 0.6 else None
    tile = layout.shape if layout is not None else _pick_tile(rng, warps)
    count = rng.choice((1, 1, 2, 2, 3))
    inputs = [_pick_input(rng, tile, layout, allow_shapes=i > 0, allow_shared=True)
              for i in range(count)]
    vals = [input_val(i) for i in inputs]
    ops = _grow_ops(rng, vals, tile, rng.randint(1, 6))
    spec = Spec(family, warps, tile, tuple(inputs), tuple(ops), "float32", layout=layout)
    if family == "loop":
        spec = dataclasses.replace(spec, steps=rng.randint(1, 4),
                                   accumulate=rng.choice(("add", "add", "max", "min")))
        if any(i.path == "async" for i in inputs):
            spec = dataclasses.replace(spec, stages=rng.choice((None, 1, 2, 3, 4)))
        for _ in range(6):  # the accumulator must stay in range: drop the last op
            try:
                analyze(spec)
                break
            except Invalid:
                spec = dataclasses.replace(spec, ops=spec.ops[:-1], accumulate="max")
    while _shared_bytes(spec) > MAX_SHARED and spec.stages:
        spec = dataclasses.replace(spec, stages=spec.stages - 1 or None)
    if _shared_bytes(spec) > MAX_SHARED:
        spec = dataclasses.replace(spec, inputs=tuple(dataclasses.replace(i, path="global")
                                                      for i in spec.inputs), stages=None)
    return _finish(rng, spec)


def _dot(rng: random.Random) -> Spec:
    adt = nm.type_by_name(rng.choices(("float16", "bfloat16", "int8", "uint8"),
                                      weights=(40, 30, 20, 10))[0])
    warps = rng.choice((1, 2, 4))
    wm = rng.choice([w for w in (1, 2, 4) if warps % w == 0])
    wn = warps // wm
    k_atom = 32 if adt.nbits == 8 else 16
    bm = 16 * wm * rng.choice((1, 2))
    bn = 8 * wn * rng.choice((1, 2, 4))
    bk = k_atom * rng.choice((1, 2))
    explicit = rng.random() < 0.6
    threads = 32 * warps
    b_packed = rng.random() < 0.4

    def packed_ok(dt: DType) -> bool:
        tpr = threads // bn
        return (threads % bn == 0 and bk % tpr == 0 and (bk // tpr) % nm.granule(dt) == 0)

    steps = rng.randint(1, 4)
    for _ in range(40):
        a = Input(adt.name, path=rng.choice(("global", "async")), smem="row")
        a = dataclasses.replace(a, smem=rng.choice(_smem_choices(bm, bk, adt)))
        a = dataclasses.replace(a, **dict(zip(("lo", "hi", "q"), _dot_dist(rng, adt))))
        if b_packed:
            cands = [t for t in nm.low_types() if t.nbits < 8 or is_packed(t)]
            if not adt.is_float:
                cands = [t for t in cands if t.is_integer]
            cands = [t for t in cands if packed_ok(t)]
            if not cands:
                b_packed = False
                continue
            bdt = rng.choice(cands)
            lo, hi, q = _pick_dist(rng, bdt)
            if bdt.is_float:
                q = max(q, rng.randint(-6, 0))
                hi = min(hi, 2.0 ** rng.randint(0, 4))
                lo = max(lo, -hi)
            b = Input(bdt.name, path="shared",
                      smem=rng.choice(_smem_choices(bn, bk, adt)), lo=lo, hi=hi, q=q)
        else:
            b = Input(adt.name, path=rng.choice(("global", "async")),
                      smem=rng.choice(_smem_choices(bk, bn, adt)))
            b = dataclasses.replace(b, **dict(zip(("lo", "hi", "q"), _dot_dist(rng, adt))))
        stages = None
        if a.path == "async" or (b.path == "async" and not b_packed):
            stages = rng.choice((None, 1, 2, 3, 4))
        spec = Spec("dot", warps, (bm, bn), (), (), "float32", stages=stages, steps=steps,
                    a=a, b=b, b_packed=b_packed, bk=bk, mma=(wm, wn) if explicit else None)
        try:
            analyze(spec)
        except Invalid:
            continue
        break
    else:
        raise RuntimeError("no valid dot operands found")  # pragma: no cover
    inputs = [_pick_input(rng, (bm, bn), None, allow_shapes=True, allow_shared=False,
                          wide=0.8)
              for _ in range(rng.choice((0, 0, 1, 2)))]
    inputs = [i for i in inputs if nm.type_by_name(i.dtype).nbits >= 8]
    spec = dataclasses.replace(spec, inputs=tuple(inputs))
    vals = analyze(spec)[:-1]
    ops = _grow_ops(rng, vals, (bm, bn), rng.randint(0, 4))
    return _finish(rng, dataclasses.replace(spec, ops=tuple(ops)))


def _dot_dist(rng: random.Random, dt: DType) -> tuple[float, float, int]:
    if dt.is_float:
        e = rng.randint(0, 3)
        q = max(nm.quantum_exp(dt), e - rng.randint(2, min(6, nm.mantissa_bits(dt))))
        return (0.0 if rng.random() < 0.2 else -(2.0**e)), 2.0**e, q
    if dt.kind == "uint":
        return 0.0, float(rng.choice((3, 15, 63, 255))), 0
    m = float(rng.choice((3, 15, 63, 127)))
    return -m - 1, m, 0


def generate_structure(rng: random.Random) -> Spec:
    """A random valid program structure (extents and data seed left at their defaults)."""
    family = rng.choices(("tile", "loop", "dot"), weights=(50, 25, 25))[0]
    if family == "dot":
        return _dot(rng)
    spec = _tile_like(rng, family)
    # drawn last, so the choices above are those of the same seed without these features
    wrap = rng.random() < 0.3
    runtime_step = family == "loop" and not (spec.stages or 0) > 1 and rng.random() < 0.5
    return dataclasses.replace(spec, wrap=wrap, runtime_step=runtime_step)


def validate(spec: Spec) -> None:
    """Raise :class:`Invalid` unless ``spec`` is a program the generator could make: the
    values analyze, the layout fits the warps and the tile, packed types fill whole bytes
    (per thread under an explicit layout, per row of the tile and of the data), shared
    layouts fit their tiles, shared memory fits the budget. The shrinker keeps to these."""
    analyze(spec)
    if spec.wrap and spec.family == "dot":
        raise Invalid("wrap: tile and loop programs shift their input rows")
    if spec.runtime_step and (spec.family != "loop" or (spec.stages or 0) > 1):
        raise Invalid("runtime_step: loops without pipelining (its step is a constant)")
    if spec.runtime_step and spec.ints[3] == 0:
        raise Invalid("runtime_step: the step 0 never ends")
    bm, bn = spec.tile
    threads = 32 * spec.warps
    packed = [nm.type_by_name(i.dtype) for i in spec.inputs if i.shape == "full"]
    packed = [t for t in packed if is_packed(t)]
    odt = nm.type_by_name(spec.out_dtype)
    if spec.family == "dot":
        if spec.a is None or spec.b is None or spec.inputs and any(
                nm.type_by_name(i.dtype).nbits < 8 for i in spec.inputs):
            raise Invalid("dot: operands a, b and whole-byte epilogue inputs")
        if spec.mma is not None and spec.mma[0] * spec.mma[1] != spec.warps:
            raise Invalid("dot: warps_m * warps_n != warps")
        if any(i.path != "global" for i in spec.inputs):
            raise Invalid("dot: epilogue inputs are loaded from global memory")
        if is_packed(odt) and odt.nbits < 8 and nm.granule(odt) > 2:
            raise Invalid("dot: packed outputs of 2-element runs at most")
        if spec.b_packed:
            bdt = nm.type_by_name(spec.b.dtype)
            tpr = threads // bn if threads % bn == 0 else 0
            if not tpr or spec.bk % tpr or (spec.bk // tpr) % nm.granule(bdt):
                raise Invalid("dot: the packed b tile does not split into whole bytes")
            if spec.extent[2] % nm.granule(bdt):
                raise Invalid("dot: K is not a whole number of bytes of b")
        elif spec.a.path == "global" and spec.b.path == "global" and spec.stages:
            raise Invalid("dot: stages need a copy_async")
        if spec.extent[1] % _granule_of(spec, [spec.out_dtype]):
            raise Invalid("N is not a whole number of bytes of the output")
        if -(-spec.extent[2] // spec.bk) > spec.steps:
            raise Invalid("K needs more loop steps than the analysis assumed")
        return
    if spec.layout is not None:
        if spec.layout.shape != spec.tile or math.prod(spec.layout.threads) != threads:
            raise Invalid("the layout does not fit the tile or the warps")
        for t in packed + ([odt] if is_packed(odt) and odt.nbits < 8 else []):
            if spec.layout.inner[1] % nm.granule(t):
                raise Invalid(f"{t.name} values are not whole bytes per thread")
    elif not threads <= bm * bn <= 16 * threads:
        raise Invalid("the inferred tile is too small or too large for the warps")
    for t in packed + [odt]:
        if is_packed(t) and bn % nm.granule(t):
            raise Invalid(f"a tile row of {t.name} is not whole bytes")
    if is_packed(odt) and odt.nbits < 8 and analyze(spec)[-1].shape != "full":
        raise Invalid("packed outputs are full tiles")
    for inp in spec.inputs:
        dt = nm.type_by_name(inp.dtype)
        if inp.shape != "full" and (dt.nbits < 8 or inp.path != "global"):
            raise Invalid("row/column inputs are whole bytes, loaded from global memory")
        if inp.path != "global":
            cols = bn * dt.nbits // 8 if is_packed(dt) else bn
            if inp.smem not in _smem_choices(bm, cols, storage_type(dt)):
                raise Invalid(f"shared layout {inp.smem} does not fit the tile")
    if spec.stages and spec.family == "loop" and spec.stages > 1 and not any(
            i.path == "async" for i in spec.inputs):
        raise Invalid("stages need a copy_async")
    if spec.family == "tile" and spec.stages:
        raise Invalid("tile programs have no loop")
    if _shared_bytes(spec) > MAX_SHARED:
        raise Invalid("shared memory over the budget")
    m, n, k = spec.extent
    full_types = [i.dtype for i in spec.inputs if i.shape != "row"]
    cols = k if spec.family == "loop" else n
    if cols % _granule_of(spec, full_types + ([spec.out_dtype] if spec.family == "tile"
                                              else [])):
        raise Invalid("the data's rows are not whole bytes of the packed types")
    if spec.family == "loop" and -(-k // bn) > spec.steps:
        raise Invalid("K needs more loop steps than the analysis assumed")
    if spec.family == "loop" and n != bn:
        raise Invalid("a loop's output is as wide as its tile: n must be bn")


# -------------------------------------------------------------------------------------
# data


def _granule_of(spec: Spec, names: list[str]) -> int:
    g = 1
    for name in names:
        dt = nm.type_by_name(name)
        if is_packed(dt):
            g = math.lcm(g, nm.granule(dt))
    return g


def _extent(rng: random.Random, block: int, most: int, granule: int = 1) -> int:
    """A size in ``[granule, most]``, a multiple of ``granule``; often not of ``block``."""
    top = max(granule, most // granule * granule)
    if rng.random() < 0.3 and block % granule == 0:
        return rng.randint(1, max(1, top // block)) * block
    return rng.randint(1, top // granule) * granule


def with_data(spec: Spec, rng: random.Random) -> Spec:
    """``spec`` with random runtime extents and a data seed."""
    bm, bn = spec.tile
    full_types = [i.dtype for i in spec.inputs if i.shape != "row"]
    if spec.family == "tile":
        g = _granule_of(spec, [*full_types, spec.out_dtype])
        extent = (_extent(rng, bm, 3 * bm), _extent(rng, bn, 3 * bn, g), 1)
    elif spec.family == "loop":
        g = _granule_of(spec, full_types)
        extent = (_extent(rng, bm, 2 * bm), bn, _extent(rng, bn, spec.steps * bn, g))
    else:
        gk = _granule_of(spec, [spec.b.dtype] if spec.b_packed else [])
        gn = _granule_of(spec, [spec.out_dtype])
        extent = (_extent(rng, bm, 2 * bm), _extent(rng, bn, 2 * bn, gn),
                  _extent(rng, spec.bk, spec.steps * spec.bk, gk))
    spec = dataclasses.replace(spec, extent=extent, data_seed=rng.getrandbits(32))
    return dataclasses.replace(spec, ints=_runtime_ints(rng, spec))


_INT32_MAX = 2**31 - 1


def _runtime_ints(rng: random.Random, spec: Spec) -> tuple[int, int, int, int]:
    """``(u, v, t, s)``: ``u * v + t`` is a row shift within a tile either way, reached
    through a product or a sum that leaves int32 (mostly), and ``s`` a step of either
    sign."""
    u, v, t, s = 0, 0, 0, 1
    if spec.wrap:
        delta = rng.choice((0, 0, rng.randint(-spec.tile[0], spec.tile[0])))
        kind = rng.randrange(6)
        if kind == 0:
            u, v = 65536, 65536  # 2^32: 0 in 32 bits
        elif kind == 1:
            u, v = 46341, 46341  # just past INT32_MAX
        elif kind == 2:
            u, v = 1, _INT32_MAX  # the product fits; the sum with t overflows
        elif kind == 3:
            u = rng.choice((-1, 1)) * rng.randint(2**8, 2**20)  # |u * v| > 2^31
            v = rng.choice((-1, 1)) * rng.randint(2**31 // abs(u) + 1, _INT32_MAX)
        elif kind == 4:
            u, v = -65536, 32768  # INT32_MIN exactly
        else:
            u, v = rng.randint(-3, 3), rng.randint(-3, 3)  # nothing wraps
        t = wrap_int32(delta - wrap_int32(u * v))
    if spec.runtime_step:
        s = rng.choice((1, -1, -1, 2, -2, 3, -3))
    return u, v, t, s


@dataclass
class Arrays:
    """The runtime arguments of a spec: its int32 scalars (``Spec.scalar_names``), one
    tensor per pointer (inputs in parameter order, then ``out``), and the inputs' values
    (float64, global shape)."""

    scalars: tuple[int, ...]
    tensors: list[Any]
    values: list[np.ndarray]


def output_geometry(spec: Spec) -> tuple[int, int]:
    """``(rows, cols)`` of the output tensor's elements (before the row pitch)."""
    m, n, k = spec.extent
    bm, bn = spec.tile
    shape = analyze(spec)[-1].shape
    if spec.family == "loop":
        gm = -(-m // bm)
        return {"full": (m, bn), "row": (m, 1), "col": (gm, bn)}[shape]
    gm, gn = -(-m // bm), -(-n // bn)
    return {"full": (m, n), "row": (m, gn), "col": (gm, n)}[shape]


def _input_geometry(spec: Spec, inp: Input) -> tuple[int, int]:
    m, n, k = spec.extent
    cols = k if spec.family == "loop" else n
    return (m if inp.shape != "col" else 1, cols if inp.shape != "row" else 1)


def _sample(rng: np.random.Generator, inp: Input, shape: tuple[int, int]
            ) -> tuple[np.ndarray, np.ndarray | None]:
    """``(values, codes)`` of an input: values float64; codes for packed types."""
    dt = nm.type_by_name(inp.dtype)
    q = max(inp.q, nm.quantum_exp(dt))
    if dt.nbits <= 8:
        table = nm.code_values(dt)
        scaled = table / 2.0**q
        ok = np.isfinite(table) & (table >= inp.lo) & (table <= inp.hi) & (
            scaled == np.round(scaled))
        codes_ok = np.flatnonzero(ok)
        codes = rng.choice(codes_ok, size=shape)
        return table[codes], codes
    uniform = rng.uniform(inp.lo, inp.hi, size=shape)
    top = max(abs(inp.lo), abs(inp.hi), 2.0**q)
    logs = rng.uniform(q, math.log2(top), size=shape)
    signs = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    log_uniform = np.clip(signs * 2.0**logs, inp.lo, inp.hi)
    raw = np.where(rng.random(shape) < 0.5, uniform, log_uniform)
    values = nm.round_to_type(np.rint(raw / 2.0**q) * 2.0**q, dt)
    special = np.array(sorted({0.0, inp.lo, inp.hi, 2.0**q} & set(
        nm.round_to_type(np.array([0.0, inp.lo, inp.hi, 2.0**q]), dt).tolist())))
    special = special[(special >= inp.lo) & (special <= inp.hi)]
    pick = rng.random(shape) < 0.1
    if special.size:
        values = np.where(pick, rng.choice(special, size=shape), values)
    if dt.is_integer and top > 2.0**25:
        values = np.where(rng.random(shape) < 0.1, _rounding_edges(rng, inp, shape), values)
    return values, None


def _rounding_edges(rng: np.random.Generator, inp: Input, shape: tuple[int, int]
                    ) -> np.ndarray:
    """Integers next to the midpoints between neighbouring values of a float of up to 8
    significant bits, beyond float32's exact integers: where a conversion that rounds
    to float32 first rounds twice (clipped to the input's range)."""
    top = max(abs(inp.lo), abs(inp.hi))
    e = rng.integers(25, max(26, int(math.log2(top))), size=shape)
    bits = rng.integers(1, 9, size=shape)  # the target's significant bits
    k = rng.integers(0, 2**bits, size=shape)
    mid = (2.0**e) * (1 + (2 * k + 1) / 2.0 ** (bits + 1))
    edge = mid + rng.integers(-2, 3, size=shape)
    signs = np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    return np.clip(signs * edge, inp.lo, inp.hi)


def _tensor(values: np.ndarray, codes: np.ndarray | None, dt: DType):
    import torch

    if is_packed(dt):
        if codes is None:  # pragma: no cover - packed types always sample codes
            raise ValueError(dt.name)
        data = nm.pack_rows(codes, dt.nbits) if dt.nbits < 8 else codes.astype(np.uint8)
        return torch.from_numpy(np.ascontiguousarray(data, dtype=np.uint8))
    torch_type = {"float16": torch.float16, "bfloat16": torch.bfloat16,
                  "float32": torch.float32, "int32": torch.int32, "int8": torch.int8,
                  "uint8": torch.uint8}[dt.name]
    if dt.is_float:
        return torch.from_numpy(values.copy()).to(torch_type)
    return torch.from_numpy(values.astype(np.int64)).to(torch_type)


def _out_tensor(spec: Spec):
    import torch

    dt = nm.type_by_name(spec.out_dtype)
    rows, cols = output_geometry(spec)
    if is_packed(dt):
        nbytes = cols * dt.nbits // 8
        return torch.full((rows, nbytes + spec.out_pad), POISON_BYTE, dtype=torch.uint8)
    fill = np.full((rows, cols + spec.out_pad), POISON if dt.name != "uint8" else 177.0)
    return _tensor(fill, None, dt)


def make_arrays(spec: Spec) -> Arrays:
    """The inputs of ``spec`` (from its data seed) and a poisoned output buffer."""
    rng = np.random.default_rng(spec.data_seed)
    m, n, k = spec.extent
    tensors, values = [], []
    entries: list[tuple[Input, tuple[int, int]]] = []
    if spec.family == "dot":
        entries.append((spec.a, (m, k)))
        entries.append((spec.b, (n, k) if spec.b_packed else (k, n)))
    entries += [(inp, _input_geometry(spec, inp)) for inp in spec.inputs]
    for inp, shape in entries:
        vals, codes = _sample(rng, inp, shape)
        values.append(vals)
        tensors.append(_tensor(vals, codes, nm.type_by_name(inp.dtype)))
    tensors.append(_out_tensor(spec))
    u, v, t, s = spec.ints
    extra = ((u, v, t) if spec.wrap else ()) + ((s,) if spec.runtime_step else ())
    return Arrays((m, n, k, *extra), tensors, values)
