"""``from_pretrained(dense, quantization_config=LowvmConfig(...))`` quantizes each weight as
transformers reads it: the same layers as quantize_model, errors raised (not only logged),
and never the whole dense model in memory."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

import lowvm
from lowvm.nn.errors import QuantizationError
from lowvm.nn.hf import quantizer
from lowvm.nn.layer.quant_linear import QuantLinear
from tests.helpers.models import tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.LowvmFallbackWarning")


@pytest.fixture(scope="module")
def dense_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("dense")
    tiny_llama().save_pretrained(path)
    return path


@pytest.mark.slow
def test_each_weight_is_quantized_as_it_is_read(dense_dir, monkeypatch):
    seen = []  # how many dense linears the model holds whenever a weight is quantized
    original = quantizer.LowvmHfQuantizer.quantize_layer

    def spy(self, model, name, weight):
        seen.append(sum(isinstance(m, nn.Linear) and not m.weight.is_meta
                        for n, m in model.named_modules() if n in self.plan))
        return original(self, model, name, weight)

    monkeypatch.setattr(quantizer.LowvmHfQuantizer, "quantize_layer", spy)
    model = AutoModelForCausalLM.from_pretrained(
        dense_dir, quantization_config=lowvm.LowvmConfig(dtype="int4", group_size=64))
    assert len(seen) == 14 and max(seen) == 0  # no planned layer was ever dense and loaded
    reference = AutoModelForCausalLM.from_pretrained(dense_dir)
    lowvm.quantize_model(reference, dtype="int4", group_size=64, progress=False)
    got, want = model.state_dict(), reference.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert set(model.config.quantization_config.modules) == {
        n for n, m in model.named_modules() if isinstance(m, QuantLinear)}


@pytest.mark.slow
def test_a_bad_weight_fails_the_load_with_its_layer(tmp_path):
    model = tiny_llama()
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight[7, 3] = float("nan")
    model.save_pretrained(tmp_path)
    with pytest.raises(QuantizationError, match=r"layers\.1\.mlp\.up_proj.*row 7, column 3"):
        AutoModelForCausalLM.from_pretrained(
            tmp_path, quantization_config=lowvm.LowvmConfig(dtype="int4", group_size=64))


def test_calibrated_methods_cannot_run_while_loading(dense_dir):
    with pytest.raises(QuantizationError, match="cannot run while loading"):
        AutoModelForCausalLM.from_pretrained(
            dense_dir, quantization_config=lowvm.LowvmConfig(dtype="int4", method="gptq"))
    with pytest.raises(QuantizationError, match="method='awq'"):
        lowvm.LowvmConfig(method="awq")


@pytest.mark.slow
def test_float32_says_it_loads_as_float16_and_dequantize_gives_dense(dense_dir, tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = lowvm.from_pretrained(dense_dir, lowvm.LowvmConfig(group_size=64),
                                      dtype=torch.float32)
    assert any("loads as torch.float16" in str(w.message) for w in caught)
    layers = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert layers and all(m.wtype.name == "int4" for m in layers.values())  # the default
    weights = {n: m.dequantize(torch.float16) for n, m in layers.items()}
    model.save_pretrained(tmp_path / "saved")
    assert "import lowvm" in (tmp_path / "saved" / "README.md").read_text()
    dense = model.dequantize()
    assert not any(isinstance(m, QuantLinear) for m in dense.modules())
    assert all(torch.equal(dense.get_submodule(n).weight, w) for n, w in weights.items())
    assert getattr(dense.config, "quantization_config", None) is None


def test_lowvm_dequantize_model_refuses_a_bad_dtype():
    model = nn.Sequential(QuantLinear(128, 64, "int4", 64))
    with pytest.raises(QuantizationError, match="dtype=torch.int32"):
        lowvm.dequantize_model(model, torch.int32)
    assert isinstance(model[0], QuantLinear)


def test_a_model_quantized_in_place_saves_its_card_and_method(tmp_path):
    import json

    model = tiny_llama()
    lowvm.quantize_model(model, dtype="int4", group_size=64, progress=False)
    model.save_pretrained(tmp_path)
    card = (tmp_path / "README.md").read_text()
    assert "only after `import lowvm`" in card and "random" in card
    saved = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert saved["method"] == "rtn" and saved["quant_method"] == "lowvm"
