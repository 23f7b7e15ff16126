"""Checkpoints of 3..7-bit float layers saved in the earlier kernel layout (the plain MMA
order, before those codes took the split_pairs order) load converted, not refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import lowvm
import lowvm.nn.serve.fuse
from lowvm.kernels.gemm_schedule import GemmSchedule
from lowvm.kernels.weight_format import repack_weights, weight_format, weight_layouts
from lowvm.layouts.mma_tiling import block_mma_layouts
from lowvm.nn.errors import WeightFormatError
from lowvm.nn.layer.kernel_format import (
    LayoutConvertedWarning,
    earlier_kernel_format,
    kernel_format,
)
from lowvm.nn.layer.quant_linear import QuantLinear
from tests.helpers.models import tiny_llama

ROOT = Path(__file__).resolve().parents[3]
K, N = 256, 128
CASES = [("float4_e2m1", 128), ("float6_e3m2", 64), ("float7_e3m3", 128), ("float4_e2m1", -1)]


def _record(fingerprint: str) -> torch.Tensor:
    return torch.frombuffer(bytearray.fromhex(fingerprint), dtype=torch.uint8)


def _layer(wtype: str, group: int, seed: int = 0) -> QuantLinear:
    torch.manual_seed(seed)
    linear = torch.nn.Linear(K, N, bias=True, dtype=torch.float16)
    return QuantLinear.from_linear(linear, wtype, group)


def _earlier_state(layer: QuantLinear) -> dict[str, torch.Tensor]:
    """The layer's state dict as the earlier lowvm saved it: the same codes packed by the
    library's numpy repacker in the plain order, with that layout's fingerprint."""
    bk = layer.kernel_format.bk
    packed = repack_weights(layer.codes().numpy(), layer.wtype, GemmSchedule(bk=bk),
                            order="plain")
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    state["qweight"] = torch.from_numpy(np.ascontiguousarray(packed))
    state["_extra_state"] = _record(kernel_format(layer.wtype, bk, "plain").fingerprint)
    return state


def test_the_plain_order_is_the_mma_order_and_the_kernels_order_differs_for_floats():
    """The earlier layout is the MMA B fragment order itself; 3..7-bit floats are now
    stored otherwise (else there would be nothing to convert), int4 never was plain."""
    lay = block_mma_layouts(16, 64, 128, 1, 4, lowvm.float16)
    for wtype in ("float4_e2m1", "float6_e3m2", "float7_e3m3", "int4"):
        plain = weight_layouts(lowvm.dtype(wtype), 16, 64, 128, 1, 4, order="plain")
        current = weight_layouts(lowvm.dtype(wtype), 16, 64, 128, 1, 4)
        assert plain.values == lay.b
        assert current.values != lay.b
    assert weight_format("float4_e2m1", 128) is not weight_format("float4_e2m1", 128, "plain")
    with pytest.raises(lowvm.LowvmError, match=r"order must be one of \[None, 'plain'\]; "
                                               r"got 'split'"):
        weight_format("float4_e2m1", 128, "split")


@pytest.mark.parametrize("wtype, bk, previous", [
    ("float4_e2m1", 128, "89f942f5ffc9af99"),
    ("float6_e3m2", 64, "5ade1c30d5ec111d"),
    ("float7_e3m3", 128, "9a6f44e3476619a6"),
])
def test_the_earlier_fingerprints_are_the_ones_earlier_lowvm_saved(wtype, bk, previous):
    """``previous``: what lowvm recorded in checkpoints of these formats before 3..7-bit
    floats took the split_pairs order (computed by that lowvm, not by this one): the
    plain-order format derived here must give exactly that, or no saved checkpoint
    would ever be recognised."""
    assert kernel_format(wtype, bk, "plain").fingerprint == previous
    assert kernel_format(wtype, bk).fingerprint != previous
    assert earlier_kernel_format(wtype, bk, previous) is kernel_format(wtype, bk, "plain")


@pytest.mark.parametrize("wtype, group", CASES)
@pytest.mark.filterwarnings("ignore::lowvm.nn.LowvmFallbackWarning")
def test_an_earlier_layout_loads_converted(wtype, group):
    layer = _layer(wtype, group)
    state = _earlier_state(layer)
    assert not torch.equal(state["qweight"], layer.qweight)  # the orders differ
    saved = {k: v.clone() for k, v in state.items()}
    fresh = QuantLinear(K, N, wtype, group, bias=True)
    with pytest.warns(LayoutConvertedWarning, match="save the model again"):
        fresh.load_state_dict(state)
    assert torch.equal(fresh.codes(), layer.codes())
    assert torch.equal(fresh.dequantize(), layer.dequantize())
    assert torch.equal(fresh.qweight, layer.qweight)  # stored exactly as quantized now
    x = torch.randn(3, K, dtype=torch.float16)
    assert torch.equal(fresh(x), layer(x))
    # the caller's state dict is left as it was; saving again stores the current layout
    assert all(torch.equal(saved[k], v) for k, v in state.items())
    again = fresh.state_dict()
    assert bytes(again["_extra_state"].tolist()).hex() == layer.kernel_format.fingerprint


def test_an_earlier_layout_loads_by_assignment_into_a_meta_shell():
    layer = _layer("float4_e2m1", 64, seed=2)
    shell = QuantLinear(K, N, "float4_e2m1", 64, bias=True, device="meta")
    with pytest.warns(LayoutConvertedWarning):
        shell.load_state_dict(_earlier_state(layer), assign=True)
    assert torch.equal(shell.codes(), layer.codes())


def test_an_int4_checkpoint_is_untouched_by_the_conversion():
    layer = _layer("int4", 128, seed=1)
    state = layer.state_dict()
    fresh = QuantLinear(K, N, "int4", 128, bias=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayoutConvertedWarning)
        fresh.load_state_dict(state)
    assert torch.equal(fresh.qweight, layer.qweight)
    fingerprint = layer.kernel_format.fingerprint
    assert earlier_kernel_format("int4", 128, fingerprint) is None


def test_a_made_up_fingerprint_is_still_refused_and_nothing_changes():
    layer = _layer("float4_e2m1", 128, seed=3)
    target = _layer("float4_e2m1", 128, seed=4)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    state = _earlier_state(layer)
    state["_extra_state"] = _record("0123456789abcdef")
    with pytest.raises(WeightFormatError, match="kernel format 0123456789abcdef"):
        target.load_state_dict(state)
    assert all(torch.equal(v, target.state_dict()[k]) for k, v in before.items())


@pytest.mark.parametrize("wanted, needle", [
    (("int4", 128), "type: the checkpoint holds float4_e2m1, this layer int4"),
    (("float4_e2m1", 64), "group size: the checkpoint's is 128, this layer's 64"),
    (("float6_e3m2", 128), "bits per weight: the checkpoint's codes take 4"),
])
def test_an_earlier_layout_of_other_settings_names_the_difference(wanted, needle):
    """The real difference comes first: another type or group size is not converted."""
    state = _earlier_state(_layer("float4_e2m1", 128, seed=5))
    target = QuantLinear(K, N, *wanted, bias=True)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(WeightFormatError) as e:
        target.load_state_dict(state)
    assert needle in str(e.value)
    assert all(torch.equal(v, target.state_dict()[k]) for k, v in before.items())


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::lowvm.nn.LowvmFallbackWarning")
def test_a_fused_model_loads_an_earlier_layout_state_dict():
    """Fused q/k/v and gate/up merge the saved parts first, then convert as one layer;
    the conversion is reported once for the model, not once per layer."""
    source = tiny_llama()
    lowvm.quantize_model(source, dtype="float4_e2m1", group_size=64, progress=False)
    earlier = dict(source.state_dict())
    for name, module in source.named_modules():
        if isinstance(module, QuantLinear):
            state = _earlier_state(module)
            earlier[name + ".qweight"] = state["qweight"]
            earlier[name + "._extra_state"] = state["_extra_state"]
    models = []
    for state in (source.state_dict(), earlier):
        model = tiny_llama(seed=5)
        lowvm.quantize_model(model, dtype="float4_e2m1", group_size=64, progress=False)
        report = lowvm.nn.serve.fuse.fuse_projections(model)
        assert report.skipped == [] and report.mlps_fused == 2
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")  # what users see: repeats shown once
            model.load_state_dict(state)
        converted = [w for w in caught if issubclass(w.category, LayoutConvertedWarning)]
        assert len(converted) == (1 if state is earlier else 0)  # all of one type and bk
        models.append(model)
    ids = torch.arange(8)[None]
    with torch.no_grad():
        assert torch.equal(models[1](ids).logits, models[0](ids).logits)


def _save_in_earlier_layout(path: Path) -> torch.nn.Module:
    """A tiny Llama with float4_e2m1 attention and int4 MLP layers, saved as it is
    (``path/"current"``) and as the earlier lowvm would have saved it (``path/"old"``);
    returns the model as quantized."""
    model = tiny_llama()
    lowvm.quantize_model(model, dtype={"*": "float4_e2m1", "mlp.*": "int4"}, group_size=64,
                         progress=False)
    model.save_pretrained(path / "current")
    shutil.copytree(path / "current", path / "old")
    path = path / "old"
    weights = load_file(path / "model.safetensors")
    config = json.loads((path / "config.json").read_text())
    modules = config["quantization_config"]["modules"]
    for name, module in model.named_modules():
        if isinstance(module, QuantLinear) and module.wtype == lowvm.float4_e2m1:
            state = _earlier_state(module)
            weights[name + ".qweight"] = state["qweight"]
            weights[name + "._extra_state"] = state["_extra_state"]
            modules[name]["kernel_format"] = bytes(state["_extra_state"].tolist()).hex()
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config))
    return model


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::lowvm.nn.LowvmFallbackWarning")
def test_from_pretrained_converts_an_earlier_layout_and_saves_the_current(tmp_path):
    model = _save_in_earlier_layout(tmp_path)
    with pytest.warns(LayoutConvertedWarning):
        loaded = lowvm.from_pretrained(tmp_path / "old")
    for name, module in model.named_modules():
        if isinstance(module, QuantLinear):
            other = loaded.get_submodule(name)
            assert torch.equal(other.qweight, module.qweight), name
            assert (loaded.config.quantization_config.modules[name]["kernel_format"]
                    == module.kernel_format.fingerprint)
    ids = torch.arange(8)[None]
    with warnings.catch_warnings():
        warnings.simplefilter("error", LayoutConvertedWarning)
        current = lowvm.from_pretrained(tmp_path / "current")
    with torch.no_grad():  # loading keeps float32 rotary tables: compare loaded to loaded
        assert torch.equal(loaded(ids).logits, current(ids).logits)

    # a checkpoint whose tensor records contradict its config is refused
    weights = load_file(tmp_path / "old" / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj"
    weights[name + "._extra_state"] = _record(model.get_submodule(name).kernel_format
                                              .fingerprint)
    save_file(weights, tmp_path / "old" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightFormatError, match="the checkpoint is inconsistent"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "old")


_RELOAD = textwrap.dedent("""
    import sys, warnings, torch, lowvm
    from lowvm.nn.layer.kernel_format import LayoutConvertedWarning
    warnings.simplefilter("error", LayoutConvertedWarning)  # saved again: nothing to convert
    model = lowvm.from_pretrained(sys.argv[1])
    with torch.no_grad():
        torch.save({"logits": model(torch.arange(8)[None]).logits.float(),
                    "codes": model.model.layers[1].self_attn.o_proj.codes()}, sys.argv[2])
""")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::lowvm.nn.LowvmFallbackWarning")
def test_a_converted_model_saved_again_reloads_in_a_fresh_process(tmp_path):
    model = _save_in_earlier_layout(tmp_path)
    with pytest.warns(LayoutConvertedWarning):
        loaded = lowvm.from_pretrained(tmp_path / "old")
    loaded.save_pretrained(tmp_path / "new")
    out = tmp_path / "logits.pt"
    done = subprocess.run([sys.executable, "-c", _RELOAD, str(tmp_path / "new"), str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = torch.load(out)
    assert torch.equal(got["codes"], model.model.layers[1].self_attn.o_proj.codes())
    with torch.no_grad():
        expected = loaded(torch.arange(8)[None]).logits.float()
    assert (got["logits"] - expected).norm() / expected.norm() < 1e-5
