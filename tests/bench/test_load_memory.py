"""The load-memory benchmark on a tiny checkpoint: both loads run, rows carry the figures
the docs' table reads and the goal is computed from the model's own bytes."""

from __future__ import annotations

import json

import pytest

from lowvm.bench.load_memory import main, write_dense_checkpoint


def test_the_written_checkpoint_loads_and_says_its_sizes(tmp_path):
    from transformers import AutoModelForCausalLM

    sizes = write_dense_checkpoint(tmp_path / "c", "tiny")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "c")
    assert sum(p.numel() * 2 for p in model.parameters()) == sizes["bytes"]
    assert sizes["largest_dense_bytes"] >= sizes["largest_linear_bytes"] > 0


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::lowvm.nn.LowvmFallbackWarning")
def test_tiny_run_writes_both_rows(tmp_path):
    assert main(["--size", "tiny", "--json", str(tmp_path / "out.json")]) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["ok"] and [r["case"] for r in doc["rows"]] == ["dense", "int4 on load"]
    dense, int4 = doc["rows"]
    assert int4["model_bytes"] < dense["model_bytes"] / 2
    for row in doc["rows"]:
        assert row["goal_bytes"] == row["model_bytes"] + 2 * doc["checkpoint"][
            "largest_dense_bytes"]
        assert row["cpu_hwm_used_bytes"] >= row["cpu_hwm_peak_bytes"] > 0
