"""fuse_projections: q/k/v and gate/up fused into one QuantLinear each (CPU reference path).

Logit tolerance: the fused model runs exactly the same float operations as the unfused
one except that each fused GEMM is one float32 matmul over the concatenated weight instead
of several; an output element's dot product over K is the same sum, so on this CPU the
logits come out bitwise equal (``concat_out_features`` is checked bitwise below). Whole
models are compared with ``atol = rtol = 1e-3`` (about one float16 ulp of these logits)
so that a BLAS that orders a K-reduction differently for another N cannot fail the test,
while a wrong split (swapped heads, k for v) changes logits by orders of magnitude more;
greedy tokens must be equal.
"""

from __future__ import annotations

import copy
import gc
import json
import pickle
import weakref

import pytest
import torch
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import lowvm
from lowvm.nn.errors import WeightFormatError
from lowvm.nn.layer.quant_linear import QuantLinear
from lowvm.nn.serve import fuse
from lowvm.nn.serve.fuse import FusedGateUpMLP, FuseError, concat_out_features, fuse_projections
from lowvm.serving import cli as serving_cli
from lowvm.serving.decode_loop import DecodeLoop
from lowvm.serving.generation import prompts
from lowvm.serving.models import init_random, quantized_copy, random_config
from tests.helpers.models import tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.layer.backend.LowvmFallbackWarning")

SIZES = (128, 64, 192)


def _layers(wtype: str = "int4", group: int = 64, bias: bool = False, k: int = 128,
            sizes: tuple[int, ...] = SIZES, seed: int = 0) -> list[QuantLinear]:
    torch.manual_seed(seed)
    return [QuantLinear.from_linear(torch.nn.Linear(k, n, bias=bias).half(), wtype, group)
            for n in sizes]


def _quantized(model: torch.nn.Module, wtype: str = "int4") -> torch.nn.Module:
    lowvm.quantize_model(model, dtype=wtype, group_size=64, progress=False)
    return model


def _fuse_all(model: torch.nn.Module) -> None:
    """fuse_projections, checked to fuse every block: a skip (e.g. a transformers whose
    forwards differ) must fail the test, not compare the unfused model with itself."""
    report = fuse_projections(model)
    layers = model.config.num_hidden_layers
    assert (report.attention_fused, report.mlps_fused, report.skipped) == (layers, layers, [])


def _pair(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(unfused, fused) copies of one quantized model."""
    fused = copy.deepcopy(model)
    _fuse_all(fused)
    return model, fused


def _logits(model: torch.nn.Module, ids: torch.Tensor, **kw) -> torch.Tensor:
    with torch.no_grad():
        return model(ids, **kw).logits.float()


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)


def _generate(model: torch.nn.Module, ids: torch.Tensor, **kw) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                              do_sample=False, pad_token_id=0, **kw)


# --------------------------------------------------------------------------------------
# concat_out_features


@pytest.mark.parametrize("wtype,group,bias", [("int4", 64, False), ("uint4", 64, True),
                                              ("int3", 128, False), ("e2m1", 32, True),
                                              ("uint8", -1, False), ("int2", 16, True)])
def test_concat_equals_set_codes_of_concatenated_codes_and_outputs_bitwise(wtype, group,
                                                                           bias):
    layers = _layers(wtype, group, bias)
    fused = concat_out_features(layers)
    assert fused.out_features == sum(SIZES) and fused.spec == layers[0].spec
    # the tile-view concatenation is the repacking of the concatenated codes
    codes = torch.cat([layer.codes() for layer in layers])
    assert torch.equal(fused.codes(), codes)
    ref = QuantLinear(128, sum(SIZES), wtype, group, bias=bias)
    ref.set_codes(codes, torch.cat([la.scales for la in layers], 1),
                  None if layers[0].zeros is None else torch.cat([la.zeros for la in layers], 1))
    assert torch.equal(fused.qweight, ref.qweight)
    assert torch.equal(fused.scales, ref.scales)
    if bias:
        assert torch.equal(fused.bias, torch.cat([la.bias for la in layers]))
    for dtype in (torch.float16, torch.bfloat16):
        x = torch.randn(3, 5, 128).to(dtype)
        assert torch.equal(fused(x), torch.cat([layer(x) for layer in layers], -1))


def test_concat_through_the_codes_when_the_tile_view_is_not_known_good(monkeypatch):
    layers = _layers("uint3", 64, True)
    fast = concat_out_features(layers)
    monkeypatch.setattr(fuse, "_tile_view_ok", lambda layer: False)
    slow = concat_out_features(layers)
    assert torch.equal(slow.qweight, fast.qweight)
    parts = fuse._split_qweight(slow.qweight, SIZES, slow)
    assert all(torch.equal(p, la.qweight) for p, la in zip(parts, layers, strict=True))


def test_concat_with_equal_act_order_permutations():
    torch.manual_seed(1)
    perm = torch.randperm(128)
    layers = []
    for n in (64, 128):
        layer = QuantLinear(128, n, "int4", 64, act_order=True)
        layer.set_codes(torch.randint(0, 16, (n, 128)), torch.rand(2, n).half() + 0.1, None,
                        perm)
        layers.append(layer)
    fused = concat_out_features(layers)
    assert torch.equal(fused.input_perm, perm)
    x = torch.randn(4, 128).half()
    assert torch.equal(fused(x), torch.cat([layer(x) for layer in layers], -1))
    other = QuantLinear(128, 64, "int4", 64, act_order=True)  # identity permutation
    with pytest.raises(FuseError, match="permute their inputs differently"):
        concat_out_features([layers[0], other])


@pytest.mark.parametrize("change,message", [
    (lambda: _layers(k=256, sizes=(64,))[0], "in_features 256"),
    (lambda: _layers("int3", sizes=(64,))[0], "format"),
    (lambda: _layers(group=32, sizes=(64,))[0], "format"),
    (lambda: _layers(bias=True, sizes=(64,))[0], "bias"),
    (lambda: torch.nn.Linear(128, 64).half(), "layers\\[2\\] is Linear, layers\\[0\\] is "
                                               "QuantLinear: a block of quantized and dense"),
    (lambda: torch.nn.Conv1d(128, 64, 1), "is Conv1d, not a lowvm QuantLinear or a torch"),
])
def test_concat_refuses_layers_of_different_formats(change, message):
    layers = _layers(sizes=(128, 64))
    before = [layer.qweight.clone() for layer in layers]
    with pytest.raises(FuseError, match=message) as info:
        concat_out_features([*layers, change()])
    assert isinstance(info.value, lowvm.LowvmError) and "layers[2]" in str(info.value)
    assert all(torch.equal(b, la.qweight) for b, la in zip(before, layers, strict=True))


@pytest.mark.parametrize("arg,message", [
    (lambda layers: layers[0], "layers must be a list or tuple of QuantLinear or nn.Linear "
                               "layers; got QuantLinear"),
    (lambda layers: [], "layers is empty"),
])
def test_concat_names_a_bad_layers_argument(arg, message):
    with pytest.raises(FuseError, match=f"concat_out_features: {message}"):
        concat_out_features(arg(_layers(sizes=(64,))))
    assert torch.equal(concat_out_features(torch.nn.ModuleList(_layers())).qweight,
                       concat_out_features(_layers()).qweight)


def test_fused_mlp_takes_only_a_gate_up_layer_of_twice_the_width():
    gate_up = _layers(sizes=(128,))[0]
    with pytest.raises(FuseError, match=r"out_features 2 \* intermediate_size = 256; got "
                       "QuantLinear with out_features 128"):
        FusedGateUpMLP(gate_up, torch.nn.Identity(), torch.nn.SiLU(), 128)
    with pytest.raises(FuseError, match="got Linear with out_features 100"):
        FusedGateUpMLP(torch.nn.Linear(128, 100), torch.nn.Identity(), torch.nn.SiLU(), 64)
    with pytest.raises(FuseError, match="a lowvm QuantLinear or a torch.nn.Linear with "
                       "out_features 2 \\* intermediate_size = 128; got Identity$"):
        FusedGateUpMLP(torch.nn.Identity(), torch.nn.Identity(), torch.nn.SiLU(), 64)
    assert FusedGateUpMLP(torch.nn.Linear(128, 128), torch.nn.Identity(), torch.nn.SiLU(),
                          64).gate_up_proj.out_features == 128
    assert FusedGateUpMLP(gate_up, torch.nn.Identity(), torch.nn.SiLU(), 64).intermediate_size \
        == 64


# --------------------------------------------------------------------------------------
# fuse_projections on a tiny Llama


@pytest.mark.slow
def test_fused_llama_logits_state_dict_and_memory():
    model = _quantized(tiny_llama())
    unfused = copy.deepcopy(model)
    bytes_before = sum(m.weight_bytes() for m in model.modules() if isinstance(m, QuantLinear))
    old = [weakref.ref(model.model.layers[0].self_attn.q_proj),
           weakref.ref(model.model.layers[1].mlp.gate_proj)]
    report = fuse_projections(model)
    assert (report.attention_fused, report.mlps_fused, report.skipped) == (2, 2, [])
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert isinstance(attn, type(unfused.model.layers[0].self_attn))  # a subclass
    assert type(attn).__name__ == "FusedLlamaAttention" and isinstance(mlp, FusedGateUpMLP)
    assert not hasattr(attn, "q_proj") and attn.qkv_proj.out_features == 128 + 64 + 64
    assert mlp.gate_up_proj.out_features == 2 * 256
    quant = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert len(quant) == 8 and sum(m.weight_bytes() for m in quant) == bytes_before
    gc.collect()
    assert [ref() for ref in old] == [None, None]  # originals gone, not kept beside the fused

    ids = torch.randint(0, 256, (2, 9))
    _close(_logits(model, ids), _logits(unfused, ids))
    a, b = model.state_dict(), unfused.state_dict()
    assert list(a) == list(b)  # same keys, same order
    assert all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in b)
    assert all(a[k].is_contiguous() for k in a)
    assert set(a._metadata) == set(b._metadata)


def test_state_dict_tensors_own_their_storage(tmp_path):
    """Per-channel scales and a single K tile make the split parts contiguous slices of
    the fused buffers; they must still be separate tensors (safetensors refuses shared)."""
    from safetensors.torch import save_file

    model = tiny_llama()
    lowvm.quantize_model(model, dtype="uint4", group_size=-1, progress=False)
    unfused, fused = _pair(model)
    state = fused.state_dict()
    save_file(state, tmp_path / "fused.safetensors")
    back = load_file(tmp_path / "fused.safetensors")
    expected = unfused.state_dict()
    assert set(back) == set(expected) and all(torch.equal(back[k], expected[k]) for k in back)


def test_inspect_signature_is_the_hf_forwards():
    import inspect

    model = _quantized(tiny_llama())
    cls = type(model.model.layers[0].self_attn)
    _fuse_all(model)
    assert inspect.signature(model.model.layers[0].self_attn.forward) == \
        inspect.signature(cls.forward.__get__(model.model.layers[0].self_attn))


@pytest.mark.slow
def test_fuse_is_idempotent_and_a_second_call_changes_nothing():
    model = _quantized(tiny_llama())
    _fuse_all(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 256, (1, 6))
    first = _logits(model, ids)
    report = fuse_projections(model)
    assert (report.attention_fused, report.mlps_fused, report.already_fused) == (0, 0, 4)
    assert report.skipped == []
    assert torch.equal(_logits(model, ids), first)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_load_unfused_state_dict_into_fused_model():
    source = _quantized(tiny_llama(seed=0))
    target = _quantized(tiny_llama(seed=5))
    _fuse_all(target)
    ids = torch.randint(0, 256, (2, 7))
    assert not torch.equal(_logits(target, ids), _logits(source, ids))
    result = target.load_state_dict(source.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    _close(_logits(target, ids), _logits(source, ids))
    assert all(torch.equal(v, source.state_dict()[k]) for k, v in target.state_dict().items())


def test_load_refuses_a_wrong_format_record_and_wrong_shapes():
    source = _quantized(tiny_llama())
    target = _quantized(tiny_llama(seed=5))
    _fuse_all(target)
    state = source.state_dict()
    bad = dict(state)
    bad["model.layers.0.self_attn.k_proj._extra_state"] = torch.zeros(8, dtype=torch.uint8)
    with pytest.raises(WeightFormatError):
        target.load_state_dict(bad)
    bad = dict(state)
    bad["model.layers.1.mlp.up_proj.scales"] = torch.ones(2, 64, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="model.layers.1.mlp.up_proj.scales"):
        target.load_state_dict(bad)
    partial = {k: v for k, v in state.items() if "layers.0.self_attn.v_proj" not in k}
    result = target.load_state_dict(partial, strict=False)
    assert "model.layers.0.self_attn.q_proj.qweight" in result.unexpected_keys
    assert "model.layers.0.self_attn.qkv_proj.qweight" in result.missing_keys


@pytest.mark.slow
def test_save_pretrained_writes_the_unfused_checkpoint(tmp_path):
    unfused, fused = _pair(_quantized(tiny_llama()))
    unfused.save_pretrained(tmp_path / "unfused")
    fused.save_pretrained(tmp_path / "fused")
    a = load_file(tmp_path / "unfused" / "model.safetensors")
    b = load_file(tmp_path / "fused" / "model.safetensors")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert ((tmp_path / "unfused" / "config.json").read_text()
            == (tmp_path / "fused" / "config.json").read_text())
    from_unfused = AutoModelForCausalLM.from_pretrained(tmp_path / "unfused")
    from_fused = AutoModelForCausalLM.from_pretrained(tmp_path / "fused")
    attn = from_fused.model.layers[0].self_attn
    assert type(attn).__name__ == "LlamaAttention" and isinstance(attn.q_proj, QuantLinear)
    ids = torch.randint(0, 256, (2, 8))
    expected = _logits(from_unfused, ids)
    assert torch.equal(_logits(from_fused, ids), expected)
    _fuse_all(from_fused)  # a loaded model fuses like a quantized one
    _close(_logits(from_fused, ids), expected)


@pytest.mark.slow
@pytest.mark.parametrize("cache", [None, "static"])
def test_greedy_generation_same_tokens(cache):
    unfused, fused = _pair(_quantized(tiny_llama()))
    ids = torch.randint(0, 256, (2, 6))
    kw = {} if cache is None else {"cache_implementation": cache}
    tokens = _generate(unfused, ids, **kw)
    assert tokens.shape == (2, 14)
    assert torch.equal(_generate(fused, ids, **kw), tokens)


@pytest.mark.slow
def test_compile_fullgraph_of_the_fused_model():
    torch._dynamo.reset()
    _, fused = _pair(_quantized(tiny_llama()))
    ids = torch.randint(0, 256, (2, 7))
    with torch.no_grad():
        eager = fused(ids, use_cache=False).logits
        compiled = torch.compile(fused, backend="aot_eager", fullgraph=True)
        assert torch.equal(compiled(ids, use_cache=False).logits, eager)


def test_output_attentions_are_recorded_from_the_fused_class():
    model = tiny_llama()
    model.config._attn_implementation = "eager"
    unfused, fused = _pair(_quantized(model))
    ids = torch.randint(0, 256, (1, 6))
    with torch.no_grad():
        a = unfused(ids, output_attentions=True).attentions
        b = fused(ids, output_attentions=True).attentions
    assert len(a) == len(b) == 2
    for x, y in zip(a, b, strict=True):
        _close(y.float(), x.float())


def test_deepcopy_and_pickle_of_a_fused_model():
    _, fused = _pair(_quantized(tiny_llama()))
    ids = torch.randint(0, 256, (1, 5))
    expected = _logits(fused, ids)
    for other in (copy.deepcopy(fused), pickle.loads(pickle.dumps(fused))):
        assert type(other.model.layers[1].self_attn).__name__ == "FusedLlamaAttention"
        assert torch.equal(_logits(other, ids), expected)
        assert list(other.state_dict()) == list(fused.state_dict())


# --------------------------------------------------------------------------------------
# other Llama-family classes


def _family(name: str) -> torch.nn.Module:
    common = dict(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    if name == "mistral":  # a window shorter than the prompt: the sliding_window argument
        model = MistralForCausalLM(MistralConfig(**common, sliding_window=4))
    elif name == "qwen2":  # q/k/v biases
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif name == "qwen3":  # q_norm / k_norm
        model = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=32))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common, attention_bias=True, mlp_bias=True))
    model = model.half().eval()
    for module in model.modules():  # random biases (they start at zero)
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            torch.nn.init.normal_(module.bias, std=0.5)
    model.config._attn_implementation = "eager"
    return model


@pytest.mark.parametrize("name", ["mistral", "qwen2", "qwen3", "llama_bias"])
def test_family_fused_equals_unfused(name):
    unfused, fused = _pair(_quantized(_family(name), "uint4"))
    report = fuse_projections(copy.deepcopy(unfused))
    assert (report.attention_fused, report.mlps_fused, report.skipped) == (2, 2, [])
    ids = torch.randint(0, 256, (2, 10))
    _close(_logits(fused, ids), _logits(unfused, ids))
    a, b = fused.state_dict(), unfused.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in b)
    assert torch.equal(_generate(fused, ids[:1]), _generate(unfused, ids[:1]))


def test_family_with_sdpa_attention():
    model = _family("qwen2")
    model.config._attn_implementation = "sdpa"
    unfused, fused = _pair(_quantized(model))
    ids = torch.randint(0, 256, (2, 10))
    _close(_logits(fused, ids), _logits(unfused, ids))


@pytest.mark.parametrize("name", ["mistral", "qwen2", "qwen3", "llama_bias"])
def test_family_passes_the_same_arguments_to_the_attention_function(name, monkeypatch):
    """The sliding_window argument only matters to flash attention (eager and sdpa get the
    window through the mask), so a recording attention function checks every argument."""
    from transformers import AttentionInterface
    from transformers.models.llama.modeling_llama import eager_attention_forward

    calls: list[tuple] = []

    def recording(module, query, key, value, mask, **kwargs):
        calls.append((type(module).__mro__[-3].__name__, query.shape, key.shape, value.shape,
                      None if mask is None else mask.shape,
                      sorted((k, v) for k, v in kwargs.items()
                             if isinstance(v, int | float | bool | None))))
        return eager_attention_forward(module, query, key, value, mask, **kwargs)

    # registered for this test only (restored afterwards): the registry is global
    monkeypatch.setitem(AttentionInterface._global_mapping, "lowvm_test_recording", recording)
    model = _family(name)
    model.config._attn_implementation = "lowvm_test_recording"
    unfused, fused = _pair(_quantized(model))
    ids = torch.randint(0, 256, (2, 10))
    _logits(unfused, ids)
    expected, calls[:] = list(calls), []
    _logits(fused, ids)
    assert len(calls) == 2 and calls == expected
    if name == "mistral":
        assert ("sliding_window", 4) in calls[0][-1]


# --------------------------------------------------------------------------------------
# what is not fused, and errors


def test_no_candidates_returns_an_empty_report():
    model = torch.nn.Sequential(torch.nn.Linear(64, 64))
    report = fuse_projections(model)
    assert (report.attention_fused, report.mlps_fused, report.skipped) == (0, 0, [])
    assert "fused q/k/v of 0 attention blocks" in str(report)


def test_dense_model_with_dense_false_is_skipped_with_reasons_and_unchanged():
    model = tiny_llama()
    keys = list(model.state_dict())
    report = fuse_projections(model, dense=False)
    assert report.attention_fused == report.mlps_fused == report.dense_fused == 0
    assert len(report.skipped) == 4
    assert all("dense projections; fuse_projections(model, dense=True)" in why
               for _, why in report.skipped)
    assert ("model.layers.0.self_attn", report.skipped[0][1]) == report.skipped[0]
    assert list(model.state_dict()) == keys


def test_non_module_argument_is_a_lowvm_error():
    with pytest.raises(FuseError, match="model must be a torch.nn.Module; got str") as info:
        fuse_projections("meta-llama/Llama-3-8B")
    assert isinstance(info.value, lowvm.LowvmError) and isinstance(info.value, TypeError)


def test_unknown_forward_or_subclass_or_hooks_are_skipped(monkeypatch):
    model = _quantized(tiny_llama())
    monkeypatch.setitem(fuse._KNOWN_FORWARDS, "LlamaAttention", {"0000000000000000"})
    report = fuse_projections(model)
    assert report.attention_fused == 0 and report.mlps_fused == 2
    assert all("differs from the one lowvm reproduces" in why for _, why in report.skipped)
    assert isinstance(model.model.layers[0].self_attn.q_proj, QuantLinear)
    monkeypatch.undo()

    model = _quantized(tiny_llama())
    base = type(model.model.layers[0].self_attn)
    model.model.layers[0].self_attn.__class__ = type("MyAttention", (base,), {})
    model.model.layers[1].self_attn.v_proj.register_forward_hook(lambda *a: None)
    mlp = model.model.layers[1].mlp
    mlp.forward = mlp.forward  # a forward set on the instance, as accelerate's hooks do
    report = fuse_projections(model)
    reasons = dict(report.skipped)
    assert "not one whose forward lowvm reproduces" in reasons["model.layers.0.self_attn"]
    assert "v_proj has hooks" in reasons["model.layers.1.self_attn"]
    assert "the MLP has hooks" in reasons["model.layers.1.mlp"]
    assert report.attention_fused == 0 and report.mlps_fused == 1


def test_mixed_formats_are_skipped():
    model = tiny_llama()
    lowvm.quantize_model(model, dtype={"*": "int4", "k_proj": "int8", "layers.1.mlp.up_proj":
                                       "uint4"}, group_size=64, progress=False)
    report = fuse_projections(model)
    assert report.attention_fused == 0 and report.mlps_fused == 1
    reasons = dict(report.skipped)
    assert "k_proj has format" in reasons["model.layers.0.self_attn"]
    assert "up_proj has format" in reasons["model.layers.1.mlp"]


# --------------------------------------------------------------------------------------
# the serving measurement (python -m lowvm.serving)


@pytest.mark.slow
@pytest.mark.parametrize("flag", [[], ["--no-fuse"]])
def test_serving_fuse_option(tmp_path, flag):
    out = tmp_path / "result.json"
    serving_cli.main(["--dtype", "int4", "--group-size", "64", "--new-tokens", "6",
                      "--batch-sizes", "1", "--prompt-len", "6", "--repeats", "3",
                      "--modes", "eager,loop", "--json", str(out), *flag])
    result = json.loads(out.read_text())
    fused = not flag
    assert result["errors"] == [] and result["fuse"] is fused
    int4 = result["models"]["int4"]
    assert int4["fused"] is fused
    if fused:
        assert int4["fuse_report"] == {"attention_fused": 2, "mlps_fused": 2,
                                       "dense_fused": 0, "skipped": []}
    else:
        assert "fuse_report" not in int4
    rows = result["speed"]
    # six tokens of a tiny model on a loaded CPU: the decode rate may be NaN (the median
    # 6-token run no slower than the median 1-token run), never zero or negative
    assert len(rows) == 4 and all(r["e2e_tokens_per_s"] > 0 for r in rows)
    assert not any(r["decode_tokens_per_s"] <= 0 for r in rows)
    # the float16 baseline is fused like the quantized model (or neither is)
    assert {(r["model"], r["fused"]) for r in rows} == {("float16", fused), ("int4", fused)}
    loop = next(r for r in rows if r["model"] == "int4" and r["mode"] == "loop")
    assert loop["leading_tokens_equal"]["eager"] == 6  # the loop's tokens are generate's


@pytest.mark.slow
def test_serving_loop_compiled_step_of_the_fused_model():
    """The decode loop's step (static cache, fullgraph) compiles in one graph with the fused
    attention and gives the unfused model's tokens."""
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    dense = init_random(random_config("tiny"), "cpu")
    unfused, _ = quantized_copy(dense, "int4", 64, ("lm_head",))
    fused = copy.deepcopy(unfused)
    _fuse_all(fused)
    ids = prompts(2, 6, dense.config.vocab_size, "cpu", 6)
    torch._dynamo.reset()
    counters.clear()
    try:
        loop = DecodeLoop(fused, ids, 5, compile_mode="default", backend="eager")
        tokens = loop(5)
        assert counters["stats"]["unique_graphs"] == 1
        assert sum(counters["graph_break"].values()) == 0
    finally:
        torch._dynamo.reset()
    assert torch.equal(tokens, DecodeLoop(unfused, ids, 5)(5))


@pytest.mark.gpu
def test_fused_model_on_cuda_matches_unfused():
    model = _quantized(tiny_llama().cuda())
    unfused, fused = _pair(model)
    ids = torch.randint(0, 256, (2, 9), device="cuda")
    a, b = _logits(unfused, ids), _logits(fused, ids)
    assert (a - b).norm() / a.norm() < 1e-2  # other N: another split-K/accumulation order
    assert torch.equal(_generate(fused, ids[:1]), _generate(unfused, ids[:1]))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64])
def test_concat_on_cuda_at_llama3_8b_qkv_shape(m):
    """The kernel on the fused N = 4096 + 1024 + 1024 against the three GEMMs it replaces
    (another N may get another split-K schedule: float32 sums round apart, ~1 ulp)."""
    torch.manual_seed(0)
    layers = [QuantLinear.from_linear(torch.nn.Linear(4096, n, bias=False).half().cuda(),
                                      "int4", 128) for n in (4096, 1024, 1024)]
    fused = concat_out_features(layers)
    assert torch.equal(fused.codes(), torch.cat([layer.codes() for layer in layers]))
    x = torch.randn(m, 4096, dtype=torch.float16, device="cuda")
    expected = torch.cat([layer(x) for layer in layers], -1).float()
    got = fused(x).float()
    assert (got - expected).norm() / expected.norm() < 1e-3
