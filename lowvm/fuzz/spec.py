"""The printable description of one fuzz program: a tree of frozen dataclasses.

A :class:`Spec` holds every choice the generator made, and nothing else: the program
(:mod:`lowvm.fuzz.build`), its inputs and the numpy reference
(:mod:`lowvm.fuzz.reference`) are all functions of it. So a failure is reproduced from
its JSON alone, the shrinker edits specs rather than programs, and a regression test is
a JSON file.

Three families:

- ``tile``: one block per ``[bm, bn]`` tile of ``[M, N]`` inputs; a chain of ops; the
  last value is stored (a full tile, or a row/column reduction of it).
- ``loop``: one block per ``bm`` rows; a ``vm.range`` loop (pipelined with
  ``stages``) over the ``bn``-wide column chunks of ``[M, K]`` inputs runs the chain
  on each chunk and accumulates the last value (``accumulate``: add, max or min).
- ``dot``: ``c[M, N] = a[M, K] @ b[K, N]`` through a K loop of ``vm.dot`` (``b`` may be
  a packed low-bit ``[N, K]`` matrix converted in the loop), then the chain on the
  accumulator as an epilogue.

Runtime integer arithmetic, in ``tile`` and ``loop`` programs: with ``wrap`` every
input's rows start ``u * v + t`` rows past the block's (runtime int32 values chosen so
the product or the sum wraps: the row offset is what 32-bit arithmetic gives, often 0 or
a small shift either way); with ``runtime_step`` a loop's step is the runtime ``s``,
counting down from the last chunk when negative. ``ints`` holds ``(u, v, t, s)``.

Value ids: ``tile``/``loop``: inputs first, then one per op. ``dot``: 0 is the
accumulator, then the (epilogue) inputs, then the ops. The stored value is the last one.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from lowvm.expr import wrap_int32

__all__ = ["Layout", "Input", "Op", "Spec", "FAMILIES", "SHAPES", "PATHS", "SMEM",
           "UNARY", "BINARY", "COMPARE", "REDUCE", "ACCUMULATE", "spec_from_json",
           "spec_to_json", "features", "dumps"]

FAMILIES = ("tile", "loop", "dot")
SHAPES = ("full", "row", "col")  # [bm, bn], [bm, 1], [1, bn]
PATHS = ("global", "shared", "async")  # load_global; via store_shared; via copy_async
SMEM = ("row", "pad", "pad1", "swizzle")  # row-major, rows padded by 16 bytes or by one
# element, the 128-byte swizzle
UNARY = ("neg", "abs", "exp", "sqrt")
BINARY = ("add", "sub", "mul", "div", "mod", "max", "min")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
REDUCE = ("sum", "max", "min")
ACCUMULATE = ("add", "max", "min")


@dataclass(frozen=True)
class Layout:
    """``local(outer).spatial(threads).local(inner)`` (2-D each): the register layout
    of a ``[bm, bn]`` tile, ``bm = outer[0] * threads[0] * inner[0]`` and likewise
    ``bn``; ``column`` uses ``column_spatial`` for the threads."""

    outer: tuple[int, int]
    threads: tuple[int, int]
    inner: tuple[int, int]
    column: bool = False

    @property
    def shape(self) -> tuple[int, int]:
        return (self.outer[0] * self.threads[0] * self.inner[0],
                self.outer[1] * self.threads[1] * self.inner[1])

    def __str__(self) -> str:
        spatial = "column_spatial" if self.column else "spatial"
        return (f"local{self.outer}.{spatial}{self.threads}.local{self.inner}"
                .replace(" ", ""))


@dataclass(frozen=True)
class Input:
    """One input tensor: its value type, tile shape, how it reaches registers, and the
    values it holds (``[lo, hi]``, multiples of ``2**q``; 0 always included, as
    out-of-bounds loads read 0)."""

    dtype: str
    shape: str = "full"
    path: str = "global"
    smem: str = "row"
    lo: float = -4.0
    hi: float = 4.0
    q: int = -2


@dataclass(frozen=True)
class Op:
    """One instruction of the chain.

    ``op``: ``cast`` (to ``dtype``), ``bitcast`` (``vm.view`` as the same-width
    ``dtype``), a unary (``neg abs exp sqrt``), a binary (``add sub mul div mod max
    min``: ``args[1]``, or ``scalar`` when given), ``select``
    (``where(cmp(args[0], args[1] or scalar), args[2], args[3])``), ``fma`` (three
    args), ``reduce`` (``reduce`` op over ``dim``, keepdims).
    """

    op: str
    args: tuple[int, ...]
    scalar: float | int | None = None
    dtype: str | None = None
    cmp: str | None = None
    reduce: str | None = None
    dim: int | None = None


@dataclass(frozen=True)
class Spec:
    """One fuzz program and its data (see the module docstring)."""

    family: str
    warps: int
    tile: tuple[int, int]
    inputs: tuple[Input, ...]
    ops: tuple[Op, ...]
    out_dtype: str
    layout: Layout | None = None  # tile/loop: explicit layout, None: inferred
    out_path: str = "global"  # "global" | "shared" (through a shared tile)
    out_pad: int = 0  # the output's rows are out_pad elements (bytes if packed) apart more
    stages: int | None = None  # loop/dot: vm.range(..., stages=)
    accumulate: str = "add"  # loop
    steps: int = 1  # loop/dot: the most loop iterations the data may need
    a: Input | None = None  # dot operands
    b: Input | None = None
    b_packed: bool = False  # dot: b is a packed low-bit [N, K] matrix
    bk: int = 16  # dot: K per step
    mma: tuple[int, int] | None = None  # dot: explicit (warps_m, warps_n), None: inferred
    extent: tuple[int, int, int] = (1, 1, 1)  # M, N, K (runtime)
    data_seed: int = 0
    wrap: bool = False  # tile/loop: input rows start u * v + t past the block's (int32)
    runtime_step: bool = False  # loop: the chunk loop's step is the runtime s
    ints: tuple[int, int, int, int] = (0, 0, 0, 1)  # u, v, t, s (runtime)

    @property
    def first_input(self) -> int:
        """Value id of ``inputs[0]``."""
        return 1 if self.family == "dot" else 0

    @property
    def num_values(self) -> int:
        return self.first_input + len(self.inputs) + len(self.ops)

    @property
    def scalar_names(self) -> tuple[str, ...]:
        """The program's runtime int32 parameters, in order."""
        return ("m", "n", "k") + (("u", "v", "t") if self.wrap else ()) + (
            ("s",) if self.runtime_step else ())

    @property
    def row_shift(self) -> int:
        """The rows every input starts past the block's: ``u * v + t`` in int32."""
        if not self.wrap:
            return 0
        u, v, t, _ = self.ints
        return wrap_int32(wrap_int32(u * v) + t)

    @property
    def shift_overflows(self) -> bool:
        """Whether ``u * v`` or the sum with ``t`` leaves int32 (checked mode refuses it)."""
        if not self.wrap:
            return False
        u, v, t, _ = self.ints
        product = wrap_int32(u * v)
        return product != u * v or wrap_int32(product + t) != product + t

    def structure(self) -> Spec:
        """The spec without its data (extents, seed, runtime integers): what the CUDA
        source depends on."""
        return dataclasses.replace(self, extent=(1, 1, 1), data_seed=0, ints=(0, 0, 0, 1))



def _to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        out = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.default is not dataclasses.MISSING and value == f.default and \
                    f.name not in ("family",):
                continue
            out[f.name] = _to_jsonable(value)
        return out
    if isinstance(obj, tuple):
        return [_to_jsonable(v) for v in obj]
    return obj


def spec_to_json(spec: Spec) -> dict[str, Any]:
    """A JSON-ready dict (defaults left out)."""
    return _to_jsonable(spec)


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def spec_from_json(data: dict[str, Any]) -> Spec:
    """The inverse of :func:`spec_to_json`."""
    d = dict(data)
    d["tile"] = tuple(d["tile"])
    d["inputs"] = tuple(Input(**i) for i in d.get("inputs", ()))
    d["ops"] = tuple(Op(**{k: _tuple(v) for k, v in o.items()}) for o in d.get("ops", ()))
    for key in ("a", "b"):
        if d.get(key) is not None:
            d[key] = Input(**d[key])
    if d.get("layout") is not None:
        d["layout"] = Layout(**{k: _tuple(v) for k, v in d["layout"].items()})
    for key in ("extent", "mma", "ints"):
        if d.get(key) is not None:
            d[key] = tuple(d[key])
    return Spec(**d)


def features(spec: Spec) -> list[str]:
    """The features a spec exercises (for the run's ``by_feature`` counts)."""
    found = {f"family:{spec.family}", f"warps:{spec.warps}", f"out:{spec.out_dtype}"}
    found.add("layout:explicit" if (spec.layout or spec.mma) else "layout:inferred")
    if spec.stages:
        found.add(f"stages:{spec.stages}")
    if spec.out_path != "global":
        found.add("out_path:shared")
    m, n, k = spec.extent
    bm, bn = spec.tile
    if m % bm or (n % bn if spec.family != "loop" else k % bn):
        found.add("partial_tile")
    for inp in (*spec.inputs, *(x for x in (spec.a, spec.b) if x is not None)):
        found.add(f"type:{inp.dtype}")
        found.add(f"path:{inp.path}")
        if inp.path != "global":
            found.add(f"smem:{inp.smem}")
        if inp.shape != "full":
            found.add(f"input_shape:{inp.shape}")
    if spec.b_packed:
        found.add("dot:packed_b")
    if spec.wrap:
        found.add("int:overflow" if spec.shift_overflows else "int:no_overflow")
        found.add("int:shift_negative" if spec.row_shift < 0 else "int:shift_nonnegative")
    if spec.runtime_step:
        found.add("int:step_down" if spec.ints[3] < 0 else "int:step_up")
    for op in spec.ops:
        name = op.op
        if op.op == "reduce":
            name = f"reduce:{op.reduce}"
        elif op.op == "select":
            name = f"select:{op.cmp}"
        elif op.op in ("cast", "bitcast"):
            found.add(f"type:{op.dtype}")
        found.add(f"op:{name}" + (":scalar" if op.scalar is not None else ""))
    return sorted(found)


def dumps(spec: Spec) -> str:
    """One-line JSON of a spec."""
    return json.dumps(spec_to_json(spec), sort_keys=True)
