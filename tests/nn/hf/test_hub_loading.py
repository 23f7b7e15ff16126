"""Whole Hub checkpoints (GPTQ, AWQ, compressed-tensors) load onto lowvm layers through
``lowvm.from_pretrained``: written by the tests in the Hub's layout, checked layer by layer
against the float64 weight each format's formula gives, and end to end against a float64
model of the same weights."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import lowvm
from lowvm.nn.errors import CheckpointImportError, QuantizationError
from lowvm.nn.hf.hub_formats import read_format
from lowvm.nn.layer.quant_linear import QuantLinear
from tests.helpers.hub_checkpoints import (
    quantization_config,
    reference_model,
    write_hub_checkpoint,
)

pytestmark = [pytest.mark.filterwarnings("ignore::lowvm.nn.LowvmFallbackWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

ROOT = Path(__file__).resolve().parents[3]

CASES = [
    ("gptq", dict(bits=2)),
    ("gptq", dict(bits=3, act_order=True)),
    ("gptq", dict(bits=4, sym=True)),
    ("gptq", dict(bits=4, act_order=True, v1=False)),
    ("gptq", dict(bits=8, sym=True, act_order=True)),
    ("gptq", dict(bits=4, group=None)),
    ("awq", dict()),
    ("compressed-tensors", dict(bits=4, sym=True)),                    # W4A16
    ("compressed-tensors", dict(bits=8, sym=True, group=None)),        # W8A16, per channel
    ("compressed-tensors", dict(bits=4, sym=False, act_order=True)),   # asymmetric, g_idx
]


def _ids(case):
    fmt, kw = case
    return fmt + "-" + "-".join(f"{k}{v}" for k, v in kw.items())


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_hub_checkpoint_loads_onto_lowvm_layers_exactly(tmp_path, case):
    fmt, kw = case
    written = write_hub_checkpoint(tmp_path / "hub", fmt, dense_layers=("o_proj",), **kw)
    model = lowvm.from_pretrained(written.path)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert set(layers) == set(written.references)
    for name, ref in written.references.items():  # every code, scale and zero exact
        assert torch.equal(layers[name].dequantize(torch.float64), ref), name
    dense = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert dense and all(n.endswith(("o_proj", "lm_head")) for n in dense)
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = model(ids).logits.double()
        want = reference_model(written)(ids).logits
    assert (got - want).norm() / want.norm() < 3e-3
    assert model.config.quantization_config.quant_method == "lowvm"


@pytest.mark.slow
def test_imported_model_saves_as_lowvm_and_reloads_in_a_fresh_process(tmp_path):
    written = write_hub_checkpoint(tmp_path / "hub", "gptq", bits=4, act_order=True)
    model = lowvm.from_pretrained(written.path)
    model.save_pretrained(tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert saved["quantization_config"]["quant_method"] == "lowvm"
    assert saved["quantization_config"].get("source") is None
    assert "import lowvm" in (tmp_path / "saved" / "README.md").read_text()
    ids = torch.arange(10)[None]
    with torch.no_grad():
        expected = model(ids).logits.float()
    script = textwrap.dedent("""
        import sys, torch, lowvm
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
        with torch.no_grad():
            torch.save(model(torch.arange(10)[None]).logits.float(), sys.argv[2])
    """)
    out = tmp_path / "logits.pt"
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "saved"), str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert torch.equal(torch.load(out), expected)


def test_a_dtype_on_a_quantized_checkpoint_is_refused_before_loading(tmp_path):
    written = write_hub_checkpoint(tmp_path / "hub", "awq")
    with pytest.raises(QuantizationError, match="keeps its own quantization"):
        lowvm.from_pretrained(written.path, lowvm.LowvmConfig(dtype="int3"))
    with pytest.raises(QuantizationError, match="auto_class"):
        lowvm.from_pretrained(written.path, auto_class="NoSuchModel")


@pytest.mark.parametrize("change, field", [
    ({"quant_method": "awq", "version": "gemv"}, "version='gemv'"),
    ({"quant_method": "awq", "version": "exllama"}, "version='exllama'"),
    ({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"},
     "checkpoint_format='marlin'"),
    ({"quant_method": "gptq", "bits": 5}, "bits=5"),
    ({"quant_method": "gptq", "bits": 4, "dynamic": {"-:.*down": {}}}, "dynamic"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized"},
     "format='float-quantized'"),
    ({"quant_method": "bitsandbytes"}, "quant_method='bitsandbytes'"),
])
def test_unsupported_variants_name_the_field_and_value(change, field):
    with pytest.raises(CheckpointImportError, match=field.replace("(", r"\(")):
        read_format(change)


def test_activation_quantization_is_refused():
    config = quantization_config("compressed-tensors", 8, 128, True, False, True)
    config["config_groups"]["group_0"]["input_activations"] = {"num_bits": 8, "type": "int"}
    with pytest.raises(CheckpointImportError, match="input_activations"):
        read_format(config)


def test_gptq_group_size_minus_one_means_per_row():
    fmt = read_format(quantization_config("gptq", 4, None, True, False, True))
    assert fmt.group_size is None and fmt.groups(256, "x") == 1


@pytest.mark.slow
def test_a_checkpoint_of_other_shapes_is_refused(tmp_path):
    written = write_hub_checkpoint(tmp_path / "hub", "gptq", bits=4)
    config = json.loads((written.path / "config.json").read_text())
    config["quantization_config"]["bits"] = 8  # the tensors hold 4-bit words
    (written.path / "config.json").write_text(json.dumps(config))
    # transformers from 5.23 refuses the shapes itself; before, lowvm's holder does
    with pytest.raises((CheckpointImportError, RuntimeError), match="mismatch|shape"):
        lowvm.from_pretrained(written.path)


def test_a_holder_refuses_tensors_of_another_shape_than_its_format():
    """transformers before 5.23 assigns a checkpoint tensor of any shape to a quantizer's
    module: the holder checks each one against its format before repacking."""
    from lowvm.nn.hf.hub_formats import HubFormat
    from lowvm.nn.hf.import_shell import ImportShell

    shell = ImportShell(HubFormat("gptq", 4, 64), 256, 128, {"qweight"}, "mlp.up_proj")
    shell.qweight = torch.zeros(64, 128, dtype=torch.int32)   # 8-bit words for K=256
    shell.qzeros = torch.zeros(4, 16, dtype=torch.int32)
    shell.scales = torch.ones(4, 128)
    with pytest.raises(CheckpointImportError, match=r"'mlp.up_proj'.*qweight has shape "
                                                    r"\(64, 128\).*stores \(32, 128\)"):
        shell.to_quant_linear()
