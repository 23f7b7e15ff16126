"""The TP scaling driver: its ratios, its option checks, and a two-size run on the CPU."""

from __future__ import annotations

import json
import sys

import pytest

from lowvm.serving import tp_scaling
from lowvm.serving.errors import ServingError


def _row(dtype: str, tp: int, batch: int, tok_s: float) -> dict:
    return {"dtype": dtype, "tp": tp, "batch": batch, "tok_s": tok_s}


def test_summarise_divides_by_tp1_and_by_float16_at_the_same_tp():
    rows = [_row("int4", 1, 1, 10.0), _row("int4", 2, 1, 16.0), _row("int4", 4, 1, 30.0),
            _row("int4", 2, 16, 100.0), _row("float16", 2, 1, 8.0),
            _row("float16", 4, 1, 10.0), {"dtype": "float16", "tp": 1, "batch": 1,
                                          "skipped": "does not fit"}]
    s = tp_scaling.summarise(rows)
    assert s["scaling"] == {"tp2_batch1": 1.6, "tp4_batch1": 3.0}  # batch 16 has no TP 1
    assert s["vs_float16"] == {"tp2_batch1": 2.0, "tp4_batch1": 3.0}
    assert s["goals"]["int4_tp2_over_tp1_batch1"] == {"value": 1.6, "target": 1.7,
                                                       "met": False}
    assert s["goals"]["int4_over_float16"] == {"value": 2.0, "target": 2.5, "met": False}


def test_summarise_without_the_rows_a_goal_needs_says_not_measured():
    s = tp_scaling.summarise([_row("int4", 2, 1, 5.0)])
    assert s["scaling"] == {} and s["vs_float16"] == {}
    assert all(g["value"] is None and g["met"] is None for g in s["goals"].values())


@pytest.mark.parametrize("tp", ["0,2", "1,x", ""])
def test_bad_tp_sizes_are_refused(tp, tmp_path):
    with pytest.raises(ServingError, match="--tp"):
        tp_scaling.main(["--tp", tp, "--json", str(tmp_path / "o.json")])


def test_the_command_is_torchrun_of_tp_bench_with_this_interpreter():
    cmd = tp_scaling.tp_command(4, ["--config", "tiny"], "/x.json")
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nproc-per-node=4" in cmd and cmd[-4:] == ["--config", "tiny", "--json", "/x.json"]


@pytest.mark.slow
def test_two_sizes_on_the_cpu_give_one_document(tmp_path):
    path = tmp_path / "tp.json"
    doc = tp_scaling.main(["--tp", "1,2", "--json", str(path), "--config", "tiny", "--layers",
                           "1", "--dtype", "int4,float16", "--batch-sizes", "1",
                           "--prompt-len", "4", "--tokens", "3", "--steps", "1",
                           "--device", "cpu"])
    assert doc["ok"] and json.loads(path.read_text())["ok"]
    assert [(r["dtype"], r["tp"]) for r in doc["rows"]] == [
        ("int4", 1), ("float16", 1), ("int4", 2), ("float16", 2)]
    assert all(r["tokens_agree"] and r["tok_s"] > 0 for r in doc["rows"])
    assert set(doc["scaling"]) == {"tp2_batch1"} and set(doc["vs_float16"]) == {
        "tp1_batch1", "tp2_batch1"}
    assert [run["environment"]["world"] for run in doc["runs"]] == [1, 2]
