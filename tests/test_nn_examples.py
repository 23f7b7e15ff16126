"""The serving examples run on the CPU with tiny settings (what CI runs)."""

from __future__ import annotations

import json
import re
import runpy
import sys

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.backend.LowvmFallbackWarning")


def test_quantize_and_generate_tiny(tmp_path, monkeypatch):
    out = tmp_path / "result.json"
    monkeypatch.setattr(sys, "argv", [
        "quantize_and_generate.py", "--dtype", "int4", "--group-size", "64", "--new-tokens", "3",
        "--batch-sizes", "1,2", "--prompt-len", "6", "--json", str(out)])
    runpy.run_path("serving_examples/quantize_and_generate.py", run_name="__main__")
    result = json.loads(out.read_text())
    assert result["layers_replaced"] == 14
    assert result["weight_bytes"]["lowvm"] < result["weight_bytes"]["float16"]
    assert len(result["generated"]) == 3
    assert [r["batch"] for r in result["tokens_per_s"]] == [1, 2]
    assert all(r["lowvm_tokens_per_s"] > 0 for r in result["tokens_per_s"])
    assert 0.0 <= result["quality"]["top1_agreement"] <= 1.0
    assert 0.0 < result["quality"]["last_logits_rel_error"] < 1.0


def test_custom_program_example(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["custom_program.py", "--seq", "4"])
    runpy.run_path("serving_examples/custom_program.py", run_name="__main__")
    text = capsys.readouterr().out
    error = float(re.search(r"max \|error\| vs torch = (\S+)", text).group(1))
    assert error < 1e-3  # fp16 outputs: at most a rounding step apart
    assert "top-1 agreement" in text


def test_custom_program_compiles_for_sm80():
    import lowvm

    module = runpy.run_path("serving_examples/custom_program.py")
    kernel_source = lowvm.compile(module["silu_mul"], arch="sm_80").source
    assert "__global__" in kernel_source
