"""``python -m lowvm.evaluation`` end to end with the tiny config on the CPU: the JSON's
documented fields, failures kept visible, and the bench scenario's rendered table."""

from __future__ import annotations

import json
import math

import pytest

from lowvm.bench import commands, report
from lowvm.bench.scenarios import Scenario
from lowvm.evaluation.cli import main

# a wall-clock budget far beyond the 5 steps, so a loaded machine still trains exactly 5
TINY = ["--config", "tiny", "--max-steps", "5", "--train-seconds", "600", "--max-bytes",
        "300000", "--eval-sequences", "4", "--calibration-sequences", "4", "--device", "cpu"]
ROW_FIELDS = {"variant", "dtype", "method", "bits_per_weight", "perplexity",
              "increase_vs_fp16"}


@pytest.mark.slow
def test_the_json_holds_the_model_and_one_row_per_variant(tmp_path, capsys):
    path = tmp_path / "out" / "result.json"
    assert main([*TINY, "--variants", "int4-rtn,int3-gptq,bits3", "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert doc["ok"] is True and doc["finished"] is True
    model = doc["model"]
    assert model["steps"] == 5 and model["config"] == "tiny" and model["parameters"] > 0
    assert math.isfinite(model["train_loss"]) and model["corpus"]["heldout_bytes"] > 0
    rows = {r["key"]: r for r in doc["rows"]}
    assert [r["variant"] for r in doc["rows"]] == ["float16", "int4 g128 rtn",
                                                   "int3 g128 gptq", "3 bits g128"]
    for row in doc["rows"]:
        assert ROW_FIELDS <= set(row) and "error" not in row
        assert row["perplexity"] == pytest.approx(
            rows["fp16"]["perplexity"] * (1 + row["increase_vs_fp16"]))
    assert rows["fp16"]["bits_per_weight"] == 16.0 and rows["fp16"]["increase_vs_fp16"] == 0
    # int<b> at group 128: b-bit codes plus one float16 scale per 128 weights
    assert rows["int4-rtn"]["bits_per_weight"] == 4 + 16 / 128
    assert (rows["int4-rtn"]["dtype"], rows["int4-rtn"]["method"]) == ("int4", "rtn")
    assert rows["int3-gptq"]["bits_per_weight"] == 3 + 16 / 128
    assert rows["int3-gptq"]["method"] == "gptq"
    assert rows["bits3"]["bits_per_weight"] <= 3 and rows["bits3"]["bits_budget"] == 3
    for key in ("int4-rtn", "int3-gptq", "bits3"):
        assert rows[key]["layer_rel_error_median"] > 0 and 0 <= rows[key]["top1_agreement"] <= 1
    out = capsys.readouterr().out
    assert "perplexity" in out.splitlines()[-6] and out.rstrip().splitlines()[-1].startswith("ok")


@pytest.mark.slow
def test_a_failing_variant_makes_the_run_not_ok_and_says_why(tmp_path, capsys):
    path = tmp_path / "result.json"
    assert main([*TINY, "--variants", "int4-rtn", "--group-size", "96", "--json",
                 str(path)]) == 1
    doc = json.loads(path.read_text())
    assert doc["ok"] is False
    fp16, int4 = doc["rows"]
    assert "error" not in fp16 and fp16["perplexity"] > 1
    assert "96" in int4["error"] and "perplexity" not in int4
    assert "ERROR" in capsys.readouterr().out


@pytest.mark.parametrize("option", [["--variants", "int4-awq"], ["--train-seconds", "-1"],
                                    ["--batch-size", "0"]])
def test_bad_options_are_refused_before_any_work(tmp_path, capsys, option):
    path = tmp_path / "result.json"
    assert main([*TINY, *option, "--json", str(path)]) == 2
    err = capsys.readouterr().err
    assert option[1] in err and "accepted" in err
    assert json.loads(path.read_text())["ok"] is False


@pytest.mark.slow
def test_the_bench_scenario_result_renders_as_a_table(tmp_path):
    sc = Scenario("quality", "json", "tiny quality run",
                  command=("{python}", "-m", "lowvm.evaluation", *TINY, "--variants",
                           "int4-rtn", "--json", "{out}/result.json"))
    ok, rows, extra = commands._json(sc, tmp_path)
    assert ok and [r["variant"] for r in rows] == ["float16", "int4 g128 rtn"]
    doc = {"scenario": "quality", "kind": "json", "ok": ok, "rows": rows, **extra}
    text = report.render_doc(doc)
    assert "Outcome: **passed**" in text and "Llama 2 layers x 128 hidden" in text
    assert f"| int4 g128 rtn | int4 | rtn | 4.125 | {rows[1]['perplexity']:.4f} |" in text
