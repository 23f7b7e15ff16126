"""The built-in choice of quant_gemm's schedule as an ordered table of rules
(lowvm.kernels.schedules.SCHEDULE_RULES): each rule cites a results file that holds rows
it chooses for, every rule is reached, and the table in docs/performance.md is the code's."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from lowvm.dtypes import dtype as as_dtype
from lowvm.kernels.schedules import (
    SCHEDULE_RULES,
    GemmShape,
    choose_schedule,
    plan_refusal,
    prefill_split,
    runs_wgmma,
    schedule_rule,
)

ROOT = Path(__file__).resolve().parents[2]
GRID = [GemmShape(m, n, k, bk, sms, x_whole)
        for m in (*range(1, 65), 96, 128, 256, 4096)
        for n in (128, 1024, 4096, 6144, 28672)
        for k in (512, 1024, 4096, 14336, 28672)
        for bk in (32, 128) for sms in (132, 78) for x_whole in (True, False)]


def _rule(name):
    return next(r for r in SCHEDULE_RULES if r.name == name)


def test_rules_have_unique_names_one_line_reasons_and_are_each_reached():
    names = [r.name for r in SCHEDULE_RULES]
    assert len(set(names)) == len(names)
    assert all(r.reason and "\n" not in r.reason for r in SCHEDULE_RULES)
    reached = {schedule_rule(s).name for s in GRID}   # every shape has a rule, too
    assert reached == set(names)


def test_the_order_decides_where_rules_overlap():
    """The first rule that applies wins: these shapes meet two rules' conditions."""
    both = GemmShape(16, 6144, 4096, 128)               # split 8, 16 rows would fit
    assert _rule("x-held-whole").applies(both) and _rule("stream-at-split-4").applies(both)
    assert schedule_rule(both).name == "stream-at-split-4"
    assert choose_schedule(16, 6144, 4096, 128).split == 4
    one_row = GemmShape(1, 10240, 8192, 128)             # split 4 < 8
    assert _rule("decode-prefetch").applies(one_row)
    assert schedule_rule(one_row).name == "x-held-whole"
    streamed = GemmShape(1, 10240, 8192, 128, x_whole=False)
    assert schedule_rule(streamed).name == "decode-prefetch"
    assert not choose_schedule(1, 10240, 8192, 128, x_whole=False).x_whole


def test_every_choice_is_one_quant_linear_runs():
    for s in GRID:
        if s.k % s.bk == 0 and s.n % 64 == 0:
            chosen = choose_schedule(s.m, s.n, s.k, s.bk, s.num_sms, s.x_whole)
            assert plan_refusal(chosen, s.k, s.bk) is None, (s, chosen)


def _quant_gemm_rows(path: Path):
    """``(k, n, m, bk)`` of the lowvm rows of an H100 results file where quant_linear runs
    quant_gemm (not the wgmma or prefill kernel)."""
    doc = json.loads(path.read_text())
    assert "H100" in doc["gpu"]  # the rules cite H100 files: sm_90's kernel choice below
    for r in doc["rows"]:
        if not isinstance(r, dict) or r.get("family") != "lowvm" or "k" not in r:
            continue
        k, n, m = r["k"], r["n"], r["m"]
        bk = min(128, r["group"] if r["group"] > 0 else k)
        weight = SimpleNamespace(n=n, k=k, bk=bk, wtype=as_dtype(r["wtype"]))
        if not runs_wgmma(m, weight) and not prefill_split(m, n, k, bk):
            yield k, n, m, bk


@pytest.mark.parametrize("rule", SCHEDULE_RULES, ids=lambda r: r.name)
def test_each_rule_cites_a_results_file_with_rows_it_chooses_for(rule):
    if rule.results is None:  # no measured rows yet: the docs say so
        assert rule.name == "tall-tiles"
        return
    assert re.fullmatch(r"benchmarks/results/\d{4}-\d\d-\d\d/[\w-]+/[\w-]+\.json",
                        rule.results)
    path = ROOT / rule.results
    assert path.is_file(), rule.results
    chosen = [row for row in _quant_gemm_rows(path)
              if schedule_rule(GemmShape(row[2], row[1], row[0], row[3])).name == rule.name]
    assert chosen, f"{rule.results} has no row {rule.name} chooses for"


def _doc_table() -> list[list[str]]:
    text = (ROOT / "docs/performance.md").read_text()
    section = text[text.index("## Schedule choices"):]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in rows]


def test_the_table_in_the_docs_is_the_code_s():
    table = _doc_table()
    assert [row[0].strip("`") for row in table] == [r.name for r in SCHEDULE_RULES]
    documented = {}
    for (cell, chooses, why, results), rule in zip(table, SCHEDULE_RULES):
        name = cell.strip("`")
        assert why == rule.reason, name
        assert results == (f"`{rule.results}`" if rule.results else "none yet"), name
        for part in chooses.split("; "):
            shape, ms = part.split(": ")
            k, n = map(int, shape.split("x"))
            for m in map(int, ms.split(", ")):
                assert schedule_rule(GemmShape(m, n, k, 128)).name == name, (k, n, m)
                documented[k, n, m] = name
    # every documented shape is listed at each M of the table, once
    shapes = {(k, n) for k, n, _ in documented}
    assert set(documented) == {(k, n, m) for k, n in shapes
                               for m in (1, 2, 4, 8, 16, 64, 256)}
