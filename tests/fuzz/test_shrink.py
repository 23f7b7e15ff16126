"""The shrinker: a synthetic failure shrinks to its minimal spec; a planted semantic
difference shrinks to the one op that shows it; cases save and load."""

from __future__ import annotations

import pytest

from lowvm.fuzz.check import check_cpu
from lowvm.fuzz.generate import validate
from lowvm.fuzz.shrink import load_regression, save_regression, shrink
from lowvm.fuzz.spec import Input, Layout, Op, Spec

BIG = Spec("loop", 4, (16, 32),
           (Input("float32", lo=-8.0, hi=8.0, q=-3),
            Input("float16", path="async", smem="pad", lo=-2.0, hi=2.0, q=-5),
            Input("int8", shape="row", lo=-20.0, hi=20.0, q=0)),
           (Op("cast", (1,), dtype="float32"), Op("add", (0, 3)), Op("mul", (4,), scalar=2.0),
            Op("cast", (2,), dtype="float32"), Op("max", (5, 6)), Op("abs", (7,))),
           "bfloat16", layout=Layout((1, 1), (16, 8), (1, 4)), out_path="shared", out_pad=3,
           stages=3, steps=4, accumulate="add", extent=(37, 32, 100), data_seed=9)


def test_a_synthetic_failure_shrinks_to_the_minimal_spec():
    validate(BIG)

    def fails(spec: Spec) -> bool:  # "a mul by a scalar, on more than two rows"
        return any(op.op == "mul" for op in spec.ops) and spec.extent[0] >= 3

    small, tries = shrink(BIG, fails)
    assert fails(small) and tries > 0
    assert [op.op for op in small.ops] == ["mul"] and len(small.inputs) == 1
    assert small.extent == (3, small.tile[1], 1) and small.steps == 1
    assert small.tile[0] * small.tile[1] == 32 and small.inputs[0].dtype == "float32"
    assert (small.out_path, small.out_pad, small.stages, small.out_dtype) == (
        "global", 0, None, "float32")
    assert small.warps == 1 and small.layout is None
    assert small.inputs[0].path == "global"
    validate(small)


def test_the_budget_bounds_the_work():
    small, tries = shrink(BIG, lambda spec: True, max_tries=3)
    assert tries == 3
    validate(small)


@pytest.mark.slow
def test_a_planted_difference_shrinks_to_the_op_that_shows_it(monkeypatch):
    """The reference computes ``abs`` wrongly: the minimal failing spec is one abs."""
    from lowvm.fuzz import reference

    real = reference._op

    def wrong_abs(op, values, types, out):
        if op.op == "abs":
            return reference._rounded(values[op.args[0]] * 1, out, "abs")
        return real(op, values, types, out)
    monkeypatch.setattr(reference, "_op", wrong_abs)
    verdict, _ = check_cpu(BIG)
    assert verdict.status == "mismatch"
    small, _ = shrink(BIG, lambda s: check_cpu(s)[0].signature() == verdict.signature(),
                      budget_s=120)
    assert [op.op for op in small.ops] == ["abs"] and len(small.inputs) == 1


def test_regression_files_round_trip(tmp_path):
    path = save_regression(BIG, "mismatch", "interpreter", "why", tmp_path, xfail="known")
    spec, record = load_regression(path)
    assert spec == BIG and record["xfail"] == "known" and record["stage"] == "interpreter"
    assert path.name.startswith("interpreter-loop_")
