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


def test_scaling_by_a_power_of_two_and_back_folds_away():
    """``(x * c) / c`` is ``x`` (as the interpreter's unbounded integers say) for a positive
    power-of-two integer c on either side; other divisors, float or negative constants and
    different factors stay as written."""
    from lowvm.expr import BinOp

    kt = minimum(Var("k") + 4, Var("n"))
    assert (kt * 128) // 128 is kt and (128 * kt) // 128 is kt
    for kept in ((kt * 3) // 3, (kt * 8) // 4, (kt * 4) // 8, (kt * -4) // -4,
                 (kt * 4.0) // 4):
        assert isinstance(kept, BinOp) and kept.op == "/", kept
    for k, n in itertools.product((-9, 0, 5, 1 << 29), (-3, 2, 1 << 30)):
        env = {"k": k, "n": n}
        assert evaluate((kt * 64) // 64, env) == evaluate(kt, env)
