"""A saved lowvm model reloads through transformers in a process that never quantized."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import lowvm
from tests.helpers.models import tiny_llama

ROOT = Path(__file__).resolve().parents[3]

_RELOAD = textwrap.dedent("""
    import sys, torch, lowvm
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
    kinds = {type(m).__name__ for m in model.modules()}
    assert "QuantLinear" in kinds, kinds
    with torch.no_grad():
        torch.save(model(torch.arange(8)[None]).logits.float(), sys.argv[2])
""")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::lowvm.nn.LowvmFallbackWarning")
def test_saved_model_reloads_in_a_fresh_process(tmp_path):
    model = tiny_llama()
    lowvm.quantize_model(model, dtype="int4", group_size=64)
    model.save_pretrained(tmp_path / "model")
    with torch.no_grad():
        expected = model(torch.arange(8)[None]).logits.float()
    out = tmp_path / "logits.pt"
    done = subprocess.run([sys.executable, "-c", _RELOAD, str(tmp_path / "model"), str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = torch.load(out)
    assert (got - expected).norm() / expected.norm() < 1e-3
