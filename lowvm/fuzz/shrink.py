"""Shrinking a failing spec to a small one that still fails, and saving it as a test.

:func:`shrink` is greedy: it proposes simpler variants of the spec (fewer ops, fewer
inputs, smaller extents and tiles, fewer warps, global paths instead of shared ones, no
pipelining, no integer wrap or runtime step, simpler types), keeps the first that is
still valid (:func:`lowvm.fuzz.generate.validate`) and still fails the same way (the caller's
predicate), and starts over from it, until no variant fails or the budget runs out.

:func:`save_regression` writes the result as a JSON file that
``tests/fuzz/test_regressions.py`` replays on every CI run.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from lowvm.fuzz.analysis import Invalid
from lowvm.fuzz.build import program_name
from lowvm.fuzz.generate import validate
from lowvm.fuzz.spec import Layout, Op, Spec, spec_from_json, spec_to_json

__all__ = ["shrink", "candidates", "save_regression", "load_regression", "size"]

_SIMPLE_TYPES = ("float32", "int32", "int8", "float16")


def size(spec: Spec) -> tuple[int, ...]:
    """An order on specs: fewer ops and inputs, then fewer elements and threads first."""
    m, n, k = spec.extent
    return (len(spec.ops) + len(spec.inputs), spec.tile[0] * spec.tile[1] * spec.warps,
            m * n * k, spec.steps)


def _drop_value(spec: Spec, value: int, replacement: int | None) -> Spec | None:
    """``spec`` without value ``value`` (an input or an op's result); uses of it become
    ``replacement`` (a smaller value id), or the op using it is dropped too."""
    first = spec.first_input
    inputs, ops = list(spec.inputs), list(spec.ops)
    if first <= value < first + len(inputs):
        del inputs[value - first]
    else:
        del ops[value - first - len(inputs)]
    remapped: list[Op] = []
    for op in ops:
        args = []
        for a in op.args:
            if a == value:
                if replacement is None:
                    return None
                a = replacement
            args.append(a - 1 if a > value else a)
        remapped.append(dataclasses.replace(op, args=tuple(args)))
    if not remapped and spec.family != "dot" and not inputs:
        return None
    return dataclasses.replace(spec, inputs=tuple(inputs), ops=tuple(remapped))


def _halve_layout(lay: Layout) -> Iterator[Layout]:
    for field in ("outer", "inner"):
        dims = getattr(lay, field)
        for d in (0, 1):
            if dims[d] > 1:
                new = list(dims)
                new[d] //= 2
                yield dataclasses.replace(lay, **{field: tuple(new)})
    if lay.column:
        yield dataclasses.replace(lay, column=False)


def _retile(spec: Spec, tile: tuple[int, int], layout: Layout | None) -> Spec:
    """``spec`` on another tile (a loop's output is as wide as its tile)."""
    extent = spec.extent
    if spec.family == "loop":
        extent = (extent[0], tile[1], extent[2])
    return dataclasses.replace(spec, tile=tile, layout=layout, extent=extent)


def candidates(spec: Spec) -> Iterator[Spec]:
    """Simpler variants of ``spec``, most aggressive first (not all of them valid)."""
    first = spec.first_input
    n_values = first + len(spec.inputs) + len(spec.ops)
    # fewer ops: cut the chain, then drop single ops and unused inputs
    for keep in range(len(spec.ops)):
        yield dataclasses.replace(spec, ops=spec.ops[:keep])
    for value in range(n_values - 1, first - 1, -1):
        yield from filter(None, [_drop_value(spec, value, None)])
        if value >= first + len(spec.inputs):
            op = spec.ops[value - first - len(spec.inputs)]
            yield from filter(None, [_drop_value(spec, value, op.args[0])])
    # simpler ops: a scalar instead of a second operand, no scalar comparison
    for i, op in enumerate(spec.ops):
        if op.op in ("add", "sub", "mul", "max", "min") and op.scalar is None:
            ops = list(spec.ops)
            ops[i] = dataclasses.replace(op, args=op.args[:1], scalar=1)
            yield dataclasses.replace(spec, ops=tuple(ops))
    # smaller data, then smaller loops
    m, n, k = spec.extent
    if spec.family == "loop":  # n is the tile's width there
        n = spec.tile[1]
    for new in ((1, n, k), (m, 1, k), (m, n, 1), (max(1, m // 2), n, k),
                (m, max(1, n // 2), k), (m, n, max(1, k // 2)), (spec.tile[0], n, k),
                (m, spec.tile[1], k), (m - 1, n, k), (m, n - 1, k), (m, n, k - 1)):
        if spec.family == "loop":
            new = (new[0], spec.tile[1], new[2])
        if min(new) >= 1 and new != spec.extent:
            yield dataclasses.replace(spec, extent=new)
    if spec.steps > 1:
        yield dataclasses.replace(spec, steps=spec.steps - 1)
    # simpler program shape
    if spec.stages:
        yield dataclasses.replace(spec, stages=None)
    u, v, t, step = spec.ints
    if spec.wrap:
        yield dataclasses.replace(spec, wrap=False, ints=(0, 0, 0, step))
        if (u, v) != (0, 0):  # the same shift without the wrap
            yield dataclasses.replace(spec, ints=(0, 0, spec.row_shift, step))
    if spec.runtime_step:
        yield dataclasses.replace(spec, runtime_step=False, ints=(u, v, t, 1))
        if abs(step) > 1:
            yield dataclasses.replace(spec, ints=(u, v, t, 1 if step > 0 else -1))
    for field, plain in (("out_path", "global"), ("out_pad", 0)):
        if getattr(spec, field) != plain:
            yield dataclasses.replace(spec, **{field: plain})
    for i, inp in enumerate(spec.inputs):
        for change in ({"path": "global", "smem": "row"}, {"smem": "row"}, {"shape": "full"}):
            new_inp = dataclasses.replace(inp, **change)
            if new_inp != inp:
                inputs = list(spec.inputs)
                inputs[i] = new_inp
                yield dataclasses.replace(spec, inputs=tuple(inputs))
    for name in ("a", "b"):
        inp = getattr(spec, name)
        if inp is not None and inp.path == "async":
            yield dataclasses.replace(spec, **{name: dataclasses.replace(inp, path="global",
                                                                          smem="row")})
    # smaller tiles and fewer warps
    if spec.layout is not None:
        for lay in _halve_layout(spec.layout):
            yield _retile(spec, lay.shape, lay)
        yield dataclasses.replace(spec, layout=None)
    if spec.family != "dot":
        bm, bn = spec.tile
        for tile in ((bm // 2, bn), (bm, bn // 2)):
            if min(tile) >= 1 and spec.layout is None:
                yield _retile(spec, tile, None)
        if spec.warps > 1 and spec.layout is None:
            yield dataclasses.replace(spec, warps=spec.warps // 2)
    elif spec.mma is not None:
        yield dataclasses.replace(spec, mma=None)
    # simpler types
    if spec.out_dtype != "float32":
        yield dataclasses.replace(spec, out_dtype="float32")
    for i, inp in enumerate(spec.inputs):
        for t in _SIMPLE_TYPES:  # only towards the front of the list: no cycles
            if t == inp.dtype:
                break
            inputs = list(spec.inputs)
            inputs[i] = dataclasses.replace(inp, dtype=t)
            yield dataclasses.replace(spec, inputs=tuple(inputs))


def shrink(spec: Spec, fails: Callable[[Spec], bool], budget_s: float = 60.0,
           max_tries: int = 400) -> tuple[Spec, int]:
    """The smallest variant of ``spec`` found that is valid and ``fails``; and how many
    candidates were tried. ``spec`` itself is assumed to fail."""
    deadline = time.monotonic() + budget_s
    tries = 0
    seen: set[str] = set()
    progress = True
    while progress and tries < max_tries and time.monotonic() < deadline:
        progress = False
        for cand in candidates(spec):
            key = json.dumps(spec_to_json(cand), sort_keys=True)
            if key in seen:
                continue
            seen.add(key)
            try:
                validate(cand)
            except Invalid:
                continue
            tries += 1
            if fails(cand):
                spec, progress = cand, True
                break
            if tries >= max_tries or time.monotonic() >= deadline:
                break
    return spec, tries


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:40]


def save_regression(spec: Spec, status: str, stage: str, message: str, directory: Path,
                    xfail: str | None = None) -> Path:
    """Write a failing (shrunk) spec as a regression case ``<stage>-<hash>.json``.

    ``xfail``: why the case is expected to fail for now (a known bug), or None: the
    replay must pass (the bug is fixed).
    """
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{_slug(stage)}-{program_name(spec).removeprefix('fuzz_')}.json"
    record: dict[str, Any] = {"status": status, "stage": stage, "message": message,
                              "xfail": xfail, "spec": spec_to_json(spec)}
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def load_regression(path: Path) -> tuple[Spec, dict[str, Any]]:
    """The spec of a regression file and the file's record."""
    record = json.loads(Path(path).read_text())
    return spec_from_json(record["spec"]), record
