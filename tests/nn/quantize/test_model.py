"""quantize_model and the transformers integration on a tiny random Llama (CPU)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

import lowvm
from lowvm.nn.errors import QuantizationError
from lowvm.nn.layer.quant_linear import QuantLinear
from tests.helpers.models import tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.layer.backend.LowvmFallbackWarning")


def _generate(model, ids):
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                              do_sample=False, pad_token_id=0)


def _quant_layers(model) -> dict[str, QuantLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_quantize_generate_save_load_same_tokens(tmp_path, dtype):
    model = tiny_llama(dtype=dtype)
    ids = torch.randint(0, 256, (2, 6))
    report = lowvm.quantize_model(model, dtype="int4", group_size=64, progress=False)
    assert report.layers_replaced == 14 and "lm_head" in report.skipped
    assert report.bytes_after * 3 < report.bytes_before
    assert isinstance(model.lm_head, torch.nn.Linear)
    tokens = _generate(model, ids)
    assert tokens.shape == (2, 14)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert saved["quant_method"] == "lowvm" and len(saved["modules"]) == 14
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert len(_quant_layers(loaded)) == 14
    for name, layer in _quant_layers(model).items():
        other = _quant_layers(loaded)[name]
        assert other.scales.dtype == torch.float16
        for key, value in layer.state_dict().items():
            assert torch.equal(value, other.state_dict()[key]), (name, key)
    assert torch.equal(_generate(loaded, ids), tokens)


def test_quantized_logits_are_close_to_dense():
    dense = tiny_llama()
    quant = tiny_llama()
    lowvm.quantize_model(quant, dtype="int8", group_size=64, progress=False)
    ids = torch.randint(0, 256, (1, 10))
    with torch.no_grad():
        a, b = dense(ids).logits.float(), quant(ids).logits.float()
    assert (a - b).norm() / a.norm() < 0.05
    assert not torch.equal(a, b)


def test_per_layer_dtype_patterns():
    model = tiny_llama()
    report = lowvm.quantize_model(model, dtype={"*": "int4", "mlp.down_proj": "uint6",
                                                "layers.1.self_attn.*": None},
                                  group_size=64, progress=False)
    layers = _quant_layers(model)
    assert layers["model.layers.0.mlp.down_proj"].wtype.name == "uint6"
    assert layers["model.layers.0.mlp.down_proj"].zeros is not None
    assert layers["model.layers.0.mlp.up_proj"].wtype.name == "int4"
    assert "model.layers.1.self_attn.q_proj" not in layers
    assert isinstance(model.model.layers[1].self_attn.q_proj, torch.nn.Linear)
    assert report.layers_replaced == 10
    assert report.skipped["model.layers.1.self_attn.q_proj"] == "no dtype pattern matches"


def test_quantize_while_loading_then_reload(tmp_path):
    tiny_llama(seed=1).save_pretrained(tmp_path / "dense")
    config = lowvm.LowvmConfig(dtype="int4", group_size=64)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "dense", quantization_config=config)
    assert len(_quant_layers(model)) == 14 and isinstance(model.lm_head, torch.nn.Linear)
    assert model.config.quantization_config.modules
    ids = torch.randint(0, 256, (1, 5))
    tokens = _generate(model, ids)
    # the same weights quantized by hand give the same layers
    by_hand = tiny_llama(seed=1)
    lowvm.quantize_model(by_hand, dtype="int4", group_size=64, progress=False)
    assert torch.equal(_generate(by_hand, ids), tokens)
    model.save_pretrained(tmp_path / "quant")
    again = AutoModelForCausalLM.from_pretrained(tmp_path / "quant")
    assert torch.equal(_generate(again, ids), tokens)


def test_failure_half_way_leaves_the_model_unchanged():
    model = tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # group 96 divides no layer's K (128 or 256): the first layer checked is named
    with pytest.raises(QuantizationError, match=r"layer 'model.layers.0.self_attn.q_proj'"):
        lowvm.quantize_model(model, dtype={"*": "int4"}, group_size=96, progress=False)
    with pytest.raises(lowvm.DTypeError, match="int12"):
        lowvm.quantize_model(model, dtype={"mlp.*": "int4", "self_attn.o_proj": "int12"},
                             group_size=64, progress=False)
    assert not _quant_layers(model)
    after = model.state_dict()
    assert set(after) == set(before) and all(torch.equal(before[k], after[k]) for k in before)
    assert getattr(model.config, "quantization_config", None) is None


def test_error_while_quantizing_swaps_nothing(monkeypatch):
    model = tiny_llama()
    calls = []
    real = QuantLinear.from_linear.__func__

    def flaky(cls, linear, *args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("out of memory (simulated)")
        return real(cls, linear, *args, **kwargs)

    monkeypatch.setattr(QuantLinear, "from_linear", classmethod(flaky))
    with pytest.raises(RuntimeError, match="simulated"):
        lowvm.quantize_model(model, dtype="int4", group_size=64, progress=False)
    assert len(calls) == 5 and not _quant_layers(model)


def test_tied_lm_head_is_left_dense():
    model = tiny_llama(tie=True)
    report = lowvm.quantize_model(model, dtype="int4", group_size=64, skip=(), progress=False)
    assert report.skipped.get("lm_head") == "weight tied to another module"
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_progress_bar_and_report_text(capsys):
    model = tiny_llama()
    report = lowvm.quantize_model(model, dtype="int4", group_size=64, progress=True)
    assert "lowvm: quantizing" in capsys.readouterr().err
    assert "replaced 14 linear layers" in str(report)


def test_config_rejects_bad_types_early():
    with pytest.raises(lowvm.DTypeError, match="int12"):
        lowvm.LowvmConfig(dtype="int12")
    with pytest.raises(lowvm.DTypeError, match="mlp"):
        lowvm.LowvmConfig(dtype={"mlp": "bogus"})


@pytest.mark.parametrize("kwargs, needle", [
    ({"skip": ["lm_haed"]}, "skip pattern 'lm_haed' matches no linear layer; close names: "
                            "['lm_head']"),
    ({"dtype": {"*": "int4", "mlp.dwn_proj": "int6"}}, "dtype pattern 'mlp.dwn_proj' matches "
                                                       "no linear layer; close names: "
                                                       "['mlp.down_proj'"),
    ({"dtype": {}}, "nothing to quantize"),
    ({"dtype": {"*": "int4"}, "skip": ["*"]}, "nothing to quantize"),
])
def test_patterns_that_match_nothing_and_empty_plans_are_refused(kwargs, needle):
    model = tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(QuantizationError) as e:
        lowvm.quantize_model(model, progress=False, **kwargs)
    assert needle in str(e.value)
    assert not any(isinstance(m, QuantLinear) for m in model.modules())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_float32_layers_are_refused_before_any_work():
    model = tiny_llama(dtype=torch.float32)
    with pytest.raises(QuantizationError, match=r"layer 'model.layers.0.self_attn.q_proj' is "
                                                r"float32; .*model\.half\(\)"):
        lowvm.quantize_model(model, progress=False)
    assert not any(isinstance(m, QuantLinear) for m in model.modules())


def test_a_model_without_lm_head_quantizes_with_the_default_skip():
    mlp = torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.ReLU()).half()
    report = lowvm.quantize_model(mlp, progress=False)
    assert isinstance(mlp[0], QuantLinear) and report is not None


def test_settings_go_to_the_registered_recorder():
    """quantize_model hands a Hugging Face model's settings to whichever recorder is
    registered (import lowvm registers hf's); a plain module records nothing."""
    from lowvm.nn.hf.record import record_quantization
    from lowvm.nn.quantize.recorder import model_recorder, set_model_recorder

    calls = []
    before = set_model_recorder(lambda *settings: calls.append(settings))
    try:
        assert before is not None
        model = tiny_llama()
        report = lowvm.quantize_model(model, dtype="int4", group_size=64, skip=["lm_head"],
                                      progress=False)
        ((got_model, got_report, *settings),) = calls
        assert got_model is model and got_report is report
        assert settings[:3] == ["int4", 64, None] and list(settings[3]) == ["lm_head"]
        assert getattr(model.config, "quantization_config", None) is None
        plain = torch.nn.Sequential(torch.nn.Linear(128, 64, dtype=torch.float16))
        lowvm.quantize_model(plain, dtype="int4", group_size=64, progress=False)
        assert len(calls) == 1
    finally:
        set_model_recorder(before)
    assert model_recorder() is before
    record_quantization(model, report, "int4", 64, None, ["lm_head"])  # what hf's keeps
    assert set(model.config.quantization_config.modules) == set(report.layers)


class _Doubling(torch.nn.Linear):
    """A linear with its own forward: a QuantLinear in its place would drop the * 2."""

    def forward(self, x):
        return super().forward(x) * 2


def test_a_linear_subclass_with_its_own_forward_is_left_dense_and_named():
    torch.manual_seed(0)
    model = torch.nn.Sequential(_Doubling(128, 128), torch.nn.Linear(128, 64)).half()
    x = torch.randn(2, 128, dtype=torch.float16)
    with pytest.warns(lowvm.nn.LayerSkippedWarning, match=r"'0': .*_Doubling \(an nn.Linear "
                                                          r"subclass\) has its own forward"):
        report = lowvm.quantize_model(model, group_size=64, progress=False)
    assert type(model[0]) is _Doubling and isinstance(model[1], QuantLinear)
    assert "has its own forward" in report.skipped["0"]
    with torch.no_grad():  # the override still runs: the dense output doubled
        doubled = torch.nn.functional.linear(x, model[0].weight, model[0].bias) * 2
        assert torch.equal(model(x), model[1](doubled))


def test_torch_modules_that_read_their_linears_weights_keep_them_dense():
    torch.manual_seed(0)
    block = torch.nn.Sequential(
        torch.nn.TransformerEncoderLayer(128, 4, 256, batch_first=True),
        torch.nn.Linear(128, 128)).half().eval()
    x = torch.randn(2, 4, 128, dtype=torch.float16)
    with pytest.warns(lowvm.nn.LayerSkippedWarning, match="MultiheadAttention, reads "
                                                          "out_proj.weight itself"):
        report = lowvm.quantize_model(block, group_size=64, progress=False)
    assert set(report.replaced) == {"1"}
    assert {"0.self_attn.out_proj", "0.linear1", "0.linear2"} <= set(report.skipped)
    with torch.no_grad():
        assert block(x).shape == (2, 4, 128)  # the fast path reads linear1.weight too
    alone = torch.nn.TransformerEncoderLayer(128, 4, 256).half()
    with pytest.raises(QuantizationError, match="nothing to quantize: .*MultiheadAttention"):
        lowvm.quantize_model(alone, group_size=64, progress=False)
    assert not any(isinstance(m, QuantLinear) for m in alone.modules())


def test_a_float32_bias_float16_cannot_hold_fails_before_any_swap():
    model = tiny_llama(attention_bias=True)
    with torch.no_grad():
        model.model.layers[1].self_attn.v_proj.bias = torch.nn.Parameter(
            torch.full((64,), 1e5))
    with pytest.raises(QuantizationError, match=r"layer 'model.layers.1.self_attn.v_proj': "
                                                r"bias\[0\] = 100000"):
        lowvm.quantize_model(model, group_size=64, progress=False)
    assert not _quant_layers(model)
