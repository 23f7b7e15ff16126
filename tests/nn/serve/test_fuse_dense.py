"""fuse_projections on dense (nn.Linear) projections: a float16 baseline fused the same way.

Tolerances: a fused GEMM computes each output element as the same K-long dot product as
the separate GEMM it replaces, only within a wider matrix. On this CPU that is bitwise the
same; a BLAS may still block K differently for another N, so float32 logits are compared
with ``1e-5`` (orders of magnitude below what a wrong split changes) and float16/bfloat16
ones are checked against a float64 run of the same weights: the fused model may not be
further from it than the unfused one, beyond one ulp of the logits.
"""

from __future__ import annotations

import copy

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen2Config, Qwen2ForCausalLM

import lowvm
from lowvm.nn.layer.quant_linear import QuantLinear
from lowvm.nn.serve.fuse import FusedGateUpMLP, FuseError, concat_out_features, fuse_projections
from tests.helpers.models import tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.layer.backend.LowvmFallbackWarning")

ULP = {torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def _pair(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(unfused, fused) copies; every block must fuse densely."""
    fused = copy.deepcopy(model)
    report = fuse_projections(fused)
    layers = model.config.num_hidden_layers
    assert (report.attention_fused, report.mlps_fused, report.dense_fused,
            report.skipped) == (layers, layers, 2 * layers, [])
    return model, fused


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits.double()


def _generate(model: torch.nn.Module, ids: torch.Tensor, **kw) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8,
                              do_sample=False, pad_token_id=0, **kw)


def test_concat_dense_layers_outputs_and_parameters():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, n, bias=True) for n in (64, 32, 96)]
    fused = concat_out_features(layers)
    assert type(fused) is torch.nn.Linear and fused.out_features == 192
    assert isinstance(fused.weight, torch.nn.Parameter) and fused.weight.requires_grad
    x = torch.randn(3, 5, 64)
    expected = torch.cat([layer(x) for layer in layers], -1)
    torch.testing.assert_close(fused(x), expected, atol=1e-6, rtol=1e-6)
    # an independent float64 reference of the concatenation
    w = torch.cat([la.weight.double() for la in layers])
    b = torch.cat([la.bias.double() for la in layers])
    torch.testing.assert_close(fused(x).double(), x.double() @ w.T + b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("change,message", [
    (lambda la: la.half(), "has dtype torch.float16, layers\\[0\\] has torch.float32"),
    (lambda la: torch.nn.Linear(32, 16), "in_features 32"),
    (lambda la: torch.nn.Linear(64, 16, bias=False), "has bias None"),
    (lambda la: la.requires_grad_(False), "requires_grad False"),
    (lambda la: la.double(), "dtype torch.float64; dense layers are fused in"),
    (lambda la: QuantLinear.from_linear(torch.nn.Linear(64, 64).half(), "int4", 64),
     "layers\\[2\\] is QuantLinear, layers\\[0\\] is Linear: a block of quantized and dense"),
])
def test_concat_refuses_dense_layers_that_are_not_one_gemm(change, message):
    torch.manual_seed(0)
    layers = [torch.nn.Linear(64, n) for n in (32, 16)]
    before = [la.weight.clone() for la in layers]
    with pytest.raises(FuseError, match=message) as info:
        concat_out_features([*layers, change(torch.nn.Linear(64, 16))])
    assert isinstance(info.value, lowvm.LowvmError) and "layers[2]" in str(info.value)
    assert all(torch.equal(b, la.weight) for b, la in zip(before, layers, strict=True))


def test_fused_float32_llama_equals_unfused_and_trains_the_same():
    unfused, fused = _pair(tiny_llama(dtype=torch.float32))
    attn, mlp = fused.model.layers[0].self_attn, fused.model.layers[0].mlp
    assert type(attn).__name__ == "FusedLlamaAttention" and isinstance(mlp, FusedGateUpMLP)
    assert type(attn.qkv_proj) is torch.nn.Linear and attn.qkv_proj.out_features == 256
    assert type(mlp.gate_up_proj) is torch.nn.Linear and mlp.gate_up_proj.out_features == 512
    ids = torch.randint(0, 256, (2, 9))
    torch.testing.assert_close(_logits(fused, ids), _logits(unfused, ids), atol=1e-5,
                               rtol=1e-5)
    # gradients reach the fused weights as the concatenation of the parts' gradients
    fused(ids).logits.square().mean().backward()
    unfused(ids).logits.square().mean().backward()
    parts = unfused.model.layers[1].self_attn
    expected = torch.cat([parts.q_proj.weight.grad, parts.k_proj.weight.grad,
                          parts.v_proj.weight.grad])
    torch.testing.assert_close(fused.model.layers[1].self_attn.qkv_proj.weight.grad,
                               expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_half_llama_within_rounding_of_a_float64_run(dtype):
    model = tiny_llama(dtype=dtype)
    reference = copy.deepcopy(model).double()
    unfused, fused = _pair(model)
    ids = torch.randint(0, 256, (2, 9))
    ref = _logits(reference, ids)
    a, b = _logits(unfused, ids), _logits(fused, ids)
    scale = ref.abs().max().item()
    assert (b - ref).abs().max() <= (a - ref).abs().max() + ULP[dtype] * scale
    torch.testing.assert_close(b, a, atol=ULP[dtype] * scale, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("cache", [None, "static"])
def test_fused_float16_greedy_generation_same_tokens(cache):
    unfused, fused = _pair(tiny_llama())
    ids = torch.randint(0, 256, (2, 6))
    kw = {} if cache is None else {"cache_implementation": cache}
    tokens = _generate(unfused, ids, **kw)
    assert tokens.shape == (2, 14)
    assert torch.equal(_generate(fused, ids, **kw), tokens)


def test_state_dict_splits_back_and_loads_merged(tmp_path):
    unfused, fused = _pair(tiny_llama())
    a, b = fused.state_dict(), unfused.state_dict()
    assert list(a) == list(b)  # the unfused keys, in their order
    assert "model.layers.0.self_attn.q_proj.weight" in a
    assert all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in b)
    assert set(a._metadata) == set(b._metadata)
    save_file(a, tmp_path / "fused.safetensors")  # no two entries share storage
    back = load_file(tmp_path / "fused.safetensors")
    assert all(torch.equal(back[k], b[k]) for k in b)

    target = tiny_llama(seed=7)
    fuse_projections(target)
    ids = torch.randint(0, 256, (2, 7))
    assert not torch.equal(_logits(target, ids), _logits(unfused, ids))
    result = target.load_state_dict(back)
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(_logits(target, ids), _logits(fused, ids))
    assert all(torch.equal(v, b[k]) for k, v in target.state_dict().items())


def test_load_refuses_a_wrong_shape_naming_the_unfused_key():
    unfused, fused = _pair(tiny_llama())
    state = unfused.state_dict()
    state["model.layers.1.self_attn.k_proj.weight"] = torch.zeros(32, 128,
                                                                  dtype=torch.float16)
    before = {k: v.clone() for k, v in fused.state_dict().items()}
    with pytest.raises(RuntimeError, match="size mismatch for model.layers.1.self_attn.k_proj"
                       ".weight: copying a param with shape \\(32, 128\\)"):
        fused.load_state_dict(state)
    assert all(torch.equal(v, before[k]) for k, v in fused.state_dict().items())


def test_biases_of_qwen2_are_concatenated():
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=256, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64)
    model = Qwen2ForCausalLM(config).float().eval()
    for module in model.modules():  # random biases (they start at zero)
        if isinstance(module, torch.nn.Linear) and module.bias is not None:
            torch.nn.init.normal_(module.bias, std=0.5)
    unfused, fused = _pair(model)
    assert fused.model.layers[0].self_attn.qkv_proj.bias.shape == (256,)
    ids = torch.randint(0, 256, (2, 8))
    torch.testing.assert_close(_logits(fused, ids), _logits(unfused, ids), atol=1e-5,
                               rtol=1e-5)
    assert list(fused.state_dict()) == list(unfused.state_dict())


def test_mixed_blocks_are_skipped_with_the_reason_and_unchanged():
    model = tiny_llama()
    # layer 0's k_proj and layer 1's up_proj stay float16; everything else int4
    lowvm.quantize_model(model, dtype="int4", group_size=64, progress=False,
                         skip=("lm_head", "layers.0.self_attn.k_proj", "layers.1.mlp.up_proj"))
    keys = list(model.state_dict())
    report = fuse_projections(model)
    reasons = dict(report.skipped)
    assert set(reasons) == {"model.layers.0.self_attn", "model.layers.1.mlp"}
    assert reasons["model.layers.0.self_attn"] == (
        "k_proj is Linear, q_proj is QuantLinear: a block of quantized and dense projections "
        "has no one GEMM (quantize all of them or none)")
    assert "up_proj is Linear, gate_proj is QuantLinear" in reasons["model.layers.1.mlp"]
    assert (report.attention_fused, report.mlps_fused, report.dense_fused) == (1, 1, 0)
    assert isinstance(model.model.layers[0].self_attn.k_proj, torch.nn.Linear)
    assert isinstance(model.model.layers[1].mlp.gate_proj, QuantLinear)
    assert list(model.state_dict()) == keys
    assert "skipped 2 (first: model.layers.0.self_attn: k_proj is Linear" in str(report)


def test_blocks_of_two_dtypes_or_dense_false_are_skipped():
    model = tiny_llama()
    model.model.layers[1].mlp.up_proj.float()
    report = fuse_projections(model, dense=False)
    assert report.attention_fused == report.mlps_fused == 0 and len(report.skipped) == 4
    report = fuse_projections(model)
    assert (report.attention_fused, report.mlps_fused, report.dense_fused) == (2, 1, 3)
    assert report.skipped == [("model.layers.1.mlp", "up_proj has dtype torch.float32, "
                               "gate_proj has torch.float16")]
    assert "(3 of these blocks dense)" in str(report)
    with pytest.raises(FuseError, match="dense must be True or False; got 'yes'"):
        fuse_projections(model, dense="yes")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_dense_model_on_cuda_matches_unfused(dtype):
    """cuBLAS may pick another algorithm for the wider N (another K order: float32 sums
    round apart), so logits agree to rounding and greedy choices wherever the unfused
    model's top two logits are not within that rounding."""
    model = tiny_llama(dtype=dtype).cuda()
    reference = copy.deepcopy(model).double()
    unfused, fused = _pair(model)
    assert fused.model.layers[0].self_attn.qkv_proj.weight.is_cuda
    ids = torch.randint(0, 256, (4, 16), device="cuda")
    ref, a, b = _logits(reference, ids), _logits(unfused, ids), _logits(fused, ids)
    assert ((a - b).norm() / a.norm()).item() < 8 * ULP[dtype]
    # no further from float64 than the unfused model, give or take its own rounding
    assert (b - ref).norm() <= 2 * (a - ref).norm() + ULP[dtype] * ref.norm()
    top2 = a.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 8 * ULP[dtype] * a.abs().amax()
    assert clear.any()
    assert torch.equal(a.argmax(-1)[clear], b.argmax(-1)[clear])
