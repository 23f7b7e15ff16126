"""compile_exprs gives evaluate's values (C division and remainder) without the tree walk."""

from __future__ import annotations

import itertools

from lowvm.expr import Var, compile_exprs, evaluate, maximum, minimum, select


def test_compiled_expressions_match_evaluate():
    m, n = Var("m"), Var("n")
    exprs = ((m + 63) // 64, (m * -7) // 2, (m * -7) % 3, minimum(m, n) * 2 - maximum(m, 3),
             select(m < n, m, n), (n << 2) >> 1, 5)
    fn = compile_exprs(exprs, ("m", "n"))
    for a, b in itertools.product((-9, -1, 0, 1, 7, 64, 1000), (-5, 0, 3, 129)):
        env = {"m": a, "n": b}
        assert fn(a, b) == tuple(int(evaluate(e, env)) for e in exprs), (a, b)


def test_single_expression_returns_a_tuple():
    assert compile_exprs((Var("k") // 4,), ("k",))(9) == (2,)
