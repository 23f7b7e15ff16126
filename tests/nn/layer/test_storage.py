"""QuantLinear holds one copy of its weights, in the kernel's repacked layout: codes ->
layer -> dequantize is exact, the buffers are exactly the five documented ones, state
dicts and checkpoints carry the format's record and refuse other formats (CPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import lowvm
from lowvm.dtypes import decode
from lowvm.kernels.library import prepare_weight, weight_bk
from lowvm.kernels.quant_gemm import GemmSchedule, repack_weights
from lowvm.nn.errors import QuantizationError, WeightFormatError
from lowvm.nn.layer.packing import pack_rows
from lowvm.nn.layer.quant_linear import QuantLinear
from tests.helpers.models import tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.layer.backend.LowvmFallbackWarning")

K, N = 256, 128


def _random_layer(wtype: str, group: int, bias: bool = False, act_order: bool = False,
                  seed: int = 0):
    """A layer filled by set_codes with random codes, scales, zeros (and permutation)."""
    g = torch.Generator().manual_seed(seed)
    wt = lowvm.dtype(wtype)
    layer = QuantLinear(K, N, wtype, group, bias=bias, act_order=act_order)
    groups = K // layer.group_size
    codes = torch.randint(0, 1 << wt.nbits, (N, K), generator=g, dtype=torch.uint8)
    scales = (torch.rand(groups, N, generator=g) * 0.1 + 0.01).half()
    zeros = (torch.randint(0, 1 << wt.nbits, (groups, N), generator=g).half()
             if layer.zeros is not None else None)
    perm = torch.randperm(K, generator=g) if act_order else None
    layer.set_codes(codes, scales, zeros, perm)
    if bias:
        assert layer.bias is not None
        with torch.no_grad():
            layer.bias.copy_(torch.randn(N, generator=g).half())
    return layer, codes, scales, zeros, perm


def _reference(wtype: str, codes, scales, zeros, perm, group: int) -> np.ndarray:
    """dequant(W)[n, k] in float64 from lowvm.dtypes.decode, in the original input order."""
    values = decode(codes.numpy(), wtype).astype(np.float64)  # [N, K] stored order
    g = np.arange(K) // group
    if zeros is not None:
        values = values - zeros.double().numpy().T[:, g]
    stored = values * scales.double().numpy().T[:, g]
    if perm is None:
        return stored
    weight = np.empty_like(stored)
    weight[:, perm.numpy()] = stored
    return weight


CASES = [("int4", 128), ("int4", 32), ("uint4", 64), ("int3", 64), ("uint3", -1),
         ("int2", 32), ("uint1", 128), ("int8", 64), ("uint8", -1), ("uint6", 32),
         ("float4_e2m1", 32), ("float6_e3m2", 128), ("float8_e4m3", -1), ("float5_e2m2", 64)]


@pytest.mark.parametrize("wtype,group", CASES)
def test_codes_to_layer_to_dequantize_is_exact(wtype, group):
    layer, codes, scales, zeros, _ = _random_layer(wtype, group)
    group = K if group == -1 else group
    assert torch.equal(layer.codes(), codes)
    ref = _reference(wtype, codes, scales, zeros, None, group)  # e4m3 codes include NaN
    assert np.array_equal(layer.dequantize(torch.float64).numpy(), ref, equal_nan=True)
    # the stored bytes are the kernel library's repacking of those codes
    library = repack_weights(codes.numpy(), wtype, GemmSchedule(bk=weight_bk(group, K)))
    assert np.array_equal(layer.qweight.numpy(), library)


@pytest.mark.parametrize("wtype,group", [("uint4", 64), ("int3", 32), ("uint8", 128)])
def test_act_order_layer_dequantizes_and_runs_in_input_order(wtype, group):
    layer, codes, scales, zeros, perm = _random_layer(wtype, group, bias=True,
                                                       act_order=True, seed=4)
    assert layer.input_perm is not None and torch.equal(layer.input_perm, perm)
    ref = _reference(wtype, codes, scales, zeros, perm, group)
    assert np.array_equal(layer.dequantize(torch.float64).numpy(), ref)
    x = torch.randn(3, K, dtype=torch.float16)
    expected = x.double() @ torch.from_numpy(ref).t() + layer.bias.double()
    y = layer(x).double()
    assert (y - expected).norm() / expected.norm() < 2e-3


@pytest.mark.parametrize("wtype,group,bias,act_order,names", [
    ("int4", 128, False, False, ["qweight", "scales"]),
    ("uint4", 64, True, False, ["qweight", "scales", "zeros", "bias"]),
    ("uint3", 32, True, True, ["qweight", "scales", "zeros", "bias", "input_perm"]),
])
def test_the_module_holds_one_copy_of_the_weight(wtype, group, bias, act_order, names):
    layer = _random_layer(wtype, group, bias, act_order)[0]
    assert [name for name, _ in layer.named_buffers()] == names
    assert not layer._non_persistent_buffers_set and not list(layer.parameters())
    hidden = [k for k, v in vars(layer).items() if isinstance(v, torch.Tensor)]
    assert hidden == []  # no tensor cached outside the buffers
    nbits = lowvm.dtype(wtype).nbits
    assert layer.qweight.numel() == N * K * nbits // 8  # the packed bytes, once
    total = sum(b.numel() * b.element_size() for b in layer.buffers())
    assert layer.weight_bytes() == total
    assert total == (N * K * nbits // 8 + (K // group) * N * 2 * (2 if "zeros" in names else 1)
                     + (N * 2 if bias else 0) + (K * 8 if act_order else 0))


def test_the_gpu_path_receives_what_prepare_weight_would_make(monkeypatch):
    """cuda_quant_linear hands the layer's qweight to the library as is; it is the array
    the library's own prepare_weight makes from the same codes."""
    from lowvm.nn.layer import backend

    layer, codes, scales, zeros, _ = _random_layer("uint4", 64, seed=2)
    seen = {}

    def fake_library(x, weight):
        seen["weight"] = weight
        return torch.zeros(x.shape[0], weight.n, dtype=x.dtype)

    monkeypatch.setattr(backend, "library_quant_linear", fake_library)
    backend.cuda_quant_linear(torch.zeros(2, K, dtype=torch.float16), layer.packed())
    ref = prepare_weight(codes.numpy(), scales.numpy(), "uint4", 64, device="cpu",
                         zeros=zeros.numpy())
    got = seen["weight"]
    assert got.packed is layer.qweight and torch.equal(got.packed, ref.packed)
    assert (got.n, got.k, got.bk, got.group, got.wtype) == (ref.n, ref.k, ref.bk, ref.group,
                                                            ref.wtype)
    assert torch.equal(got.scales, ref.scales) and torch.equal(got.zeros, ref.zeros)


def test_to_moves_and_casts_without_copies_or_new_buffers():
    layer = _random_layer("uint4", 64, bias=True)[0]
    before = layer.qweight.clone()
    layer.to(torch.bfloat16)
    assert layer.qweight.dtype == torch.uint8 and torch.equal(layer.qweight, before)
    assert layer.scales.dtype == torch.float16 and layer.bias.dtype == torch.bfloat16
    layer.to("meta")
    assert [n for n, _ in layer.named_buffers()] == ["qweight", "scales", "zeros", "bias"]
    assert all(b.is_meta for b in layer.buffers())
    assert layer.qweight.shape == before.shape


def test_state_dict_round_trip_gives_identical_outputs_and_codes():
    layer = _random_layer("int3", 64, bias=True, act_order=True, seed=1)[0]
    state = layer.state_dict()
    assert list(state) == ["qweight", "scales", "bias", "input_perm", "_extra_state"]
    assert bytes(state["_extra_state"].tolist()).hex() == layer.kernel_format.fingerprint
    fresh = QuantLinear(K, N, "int3", 64, bias=True, act_order=True)
    fresh.load_state_dict(state)
    x = torch.randn(2, 5, K, dtype=torch.bfloat16)
    assert torch.equal(fresh(x), layer(x)) and torch.equal(fresh.codes(), layer.codes())
    # an empty layer on the meta device, filled by assignment (as loaders do)
    shell = QuantLinear(K, N, "int3", 64, bias=True, act_order=True, device="meta")
    shell.load_state_dict(state, assign=True)
    assert torch.equal(shell(x), layer(x))


def test_state_dict_round_trip_through_safetensors(tmp_path):
    layer = _random_layer("float4_e2m1", 32, bias=True)[0]
    save_file(layer.state_dict(), tmp_path / "layer.safetensors")
    fresh = QuantLinear(K, N, "float4_e2m1", 32, bias=True)
    fresh.load_state_dict(load_file(tmp_path / "layer.safetensors"))
    x = torch.randn(4, K, dtype=torch.float16)
    assert torch.equal(fresh(x), layer(x))


def test_another_kernel_format_is_refused_and_nothing_changes():
    layer = _random_layer("int4", 128, seed=3)[0]
    state = layer.state_dict()
    target = _random_layer("int4", 128, seed=4)[0]
    before = {k: v.clone() for k, v in target.state_dict().items()}
    state["_extra_state"] = torch.zeros(8, dtype=torch.uint8)
    with pytest.raises(WeightFormatError, match="kernel format 0000000000000000"):
        target.load_state_dict(state)
    assert all(torch.equal(v, target.state_dict()[k]) for k, v in before.items())
    assert isinstance(WeightFormatError("x"), lowvm.LowvmError)


def test_plain_rows_of_older_lowvm_are_refused_with_the_reason():
    layer, codes, *_ = _random_layer("uint4", 64, bias=True)
    old = {"qweight": pack_rows(codes, 4), "scales": layer.scales, "zeros": layer.zeros,
           "bias": layer.bias}  # what lowvm saved before weights were stored repacked
    fresh = QuantLinear(K, N, "uint4", 64, bias=True)
    with pytest.raises(WeightFormatError, match=r"shape \(128, 128\): plain bit-stream rows"):
        fresh.load_state_dict(old)
    assert not torch.equal(fresh.qweight, layer.qweight)
    no_record = {k: v for k, v in layer.state_dict().items() if k != "_extra_state"}
    with pytest.raises(WeightFormatError, match="without a format record"):
        fresh.load_state_dict(no_record)


def test_set_codes_checks_everything_before_changing_anything():
    layer, codes, scales, zeros, _ = _random_layer("uint4", 64)
    before = [b.clone() for b in layer.buffers()]
    bad = [
        ((codes[:, :128], scales, zeros), r"codes must be an integer tensor of shape \(128, 256\)"),
        ((codes.float(), scales, zeros), "integer tensor"),
        ((codes.long() + 16, scales, zeros), r"lie in \[0, 15\]; got values in \[16, 31\]"),
        ((codes, scales[:2], zeros), r"scales must be a tensor of shape \(4, 128\)"),
        ((codes, scales, None), "zeros must be given"),
    ]
    for args, message in bad:
        with pytest.raises(QuantizationError, match=message):
            layer.set_codes(*args)
    with pytest.raises(QuantizationError, match="act_order=True"):
        layer.set_codes(codes, scales, zeros, torch.arange(K))
    symmetric = QuantLinear(K, N, "int4", 64)
    with pytest.raises(QuantizationError, match="zeros must be None"):
        symmetric.set_codes(codes, scales, zeros)
    assert all(torch.equal(a, b) for a, b in zip(before, layer.buffers()))


def test_shapes_the_kernel_cannot_tile_are_refused_early():
    with pytest.raises(QuantizationError, match=r"multiples of the kernel's K step bk=128"):
        QuantLinear(192, 64, "int4", group_size=-1)  # per-channel over K = 192
    with pytest.raises(QuantizationError, match="bk=128"):
        QuantLinear(384, 64, "int4", group_size=192)


def test_report_counts_the_one_copy():
    model = tiny_llama()
    report = lowvm.quantize_model(model, dtype="int4", group_size=64, progress=False)
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert report.bytes_after == sum(m.weight_bytes() for m in layers)
    resident = sum(b.numel() * b.element_size() for m in layers for b in m.buffers())
    assert report.bytes_after == resident
    packed = sum(m.in_features * m.out_features // 2 for m in layers)  # int4: half a byte
    scales = sum(m.in_features // 64 * m.out_features * 2 for m in layers)
    assert report.bytes_after == packed + scales


def test_checkpoints_record_the_format_and_refuse_another(tmp_path):
    model = tiny_llama()
    lowvm.quantize_model(model, dtype={"*": "int4", "mlp.*": "uint3"}, group_size=64,
                         progress=False)
    model.save_pretrained(tmp_path)
    config_path = tmp_path / "config.json"
    config = json.loads(config_path.read_text())
    modules = config["quantization_config"]["modules"]
    layer = model.model.layers[0].mlp.up_proj
    assert modules["model.layers.0.mlp.up_proj"]["kernel_format"] == \
        layer.kernel_format.fingerprint
    assert modules["model.layers.0.self_attn.q_proj"]["kernel_format"] == \
        model.model.layers[0].self_attn.q_proj.kernel_format.fingerprint
    weights = load_file(tmp_path / "model.safetensors")
    assert "model.layers.0.mlp.up_proj._extra_state" in weights
    # the untouched checkpoint loads back to the same codes
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert torch.equal(loaded.model.layers[0].mlp.up_proj.codes(), layer.codes())

    modules["model.layers.0.mlp.up_proj"]["kernel_format"] = "0123456789abcdef"
    config_path.write_text(json.dumps(config))
    with pytest.raises(WeightFormatError, match="saved in kernel format 0123456789abcdef"):
        AutoModelForCausalLM.from_pretrained(tmp_path)
    del modules["model.layers.0.mlp.up_proj"]["kernel_format"]
    config_path.write_text(json.dumps(config))
    with pytest.raises(WeightFormatError, match="older lowvm"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


def test_checkpoint_tensor_record_is_checked_when_loading(tmp_path):
    """A checkpoint whose config matches but whose stored record differs is refused
    (transformers hands the record to set_extra_state)."""
    model = tiny_llama()
    lowvm.quantize_model(model, dtype="int4", group_size=64, progress=False)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights["model.layers.1.mlp.down_proj._extra_state"] = torch.zeros(8, dtype=torch.uint8)
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightFormatError, match="kernel format 0000000000000000"):
        AutoModelForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("saved, wanted, needle", [
    (("int3", 128), ("int4", 128), "bits per weight: the checkpoint's codes take 3, this "
                                   "layer's int4 4"),
    (("float4_e2m1", 128), ("int4", 128), "type: the checkpoint holds float4_e2m1, this "
                                          "layer int4"),
    (("uint4", 128), ("int4", 128), "zero points: the checkpoint has them"),
    (("int4", 128), ("int4", 64), "group size: the checkpoint's is 128, this layer's 64"),
    (("int4", 64), ("uint4", 64), "zero points: the checkpoint has none"),
])
def test_a_checkpoint_of_other_settings_names_the_difference(saved, wanted, needle):
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 128, dtype=torch.float16)
    source = QuantLinear.from_linear(linear, *saved)
    target = QuantLinear(256, 128, *wanted, bias=True)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(WeightFormatError) as e:
        target.load_state_dict(source.state_dict())
    assert needle in str(e.value) and "layout changed" not in str(e.value)
    assert all(torch.equal(v, before[k]) for k, v in target.state_dict().items())
