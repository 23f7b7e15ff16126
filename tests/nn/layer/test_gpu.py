"""QuantLinear on CUDA (run with `pytest -m gpu` on the device): kernel path vs a float64
reference, bf16 reference path, torch.compile and CUDA-graph capture of a tiny model, and
the one stored copy of the weight (buffers, bytes allocated, GPU repacking)."""

from __future__ import annotations

import pytest
import torch

import lowvm
from lowvm.nn.layer.quant_linear import QuantLinear
from tests.helpers.models import tiny_llama

pytestmark = [pytest.mark.gpu,
              pytest.mark.filterwarnings("ignore::lowvm.nn.layer.backend.LowvmFallbackWarning")]


@pytest.mark.parametrize("wtype,group", [("int4", 128), ("uint4", 128), ("int3", 64),
                                         ("e3m2", 64), ("uint8", 128), ("e2m1", 32)])
@pytest.mark.parametrize("m", [1, 16, 37])
def test_cuda_forward_vs_float64(wtype, group, m):
    torch.manual_seed(m)
    lin = torch.nn.Linear(512, 256, bias=True).half()
    layer = QuantLinear.from_linear(lin, wtype, group_size=group).cuda()
    x = torch.randn(m, 512, dtype=torch.float16, device="cuda")
    y = layer(x)
    ref = x.double() @ layer.dequantize(torch.float64).t() + layer.bias.double()
    assert y.dtype == torch.float16 and torch.isfinite(y).all()
    assert ((y.double() - ref).norm() / ref.norm()).item() < 2e-3


@pytest.mark.parametrize("wtype,group,bias,act_order", [
    ("int4", 128, False, False), ("uint4", 64, True, False), ("uint3", 32, True, True),
    ("float4_e2m1", -1, False, False)])
def test_cuda_layer_holds_exactly_its_buffers_once(wtype, group, bias, act_order):
    """On CUDA the buffers are exactly (packed, scales, zeros?, bias?, input_perm?), the
    packed one is the library's repacked weight, and moving the layer allocates only
    their bytes (no second copy of the weight)."""
    from lowvm.kernels.library import prepare_weight

    torch.manual_seed(1)
    layer = QuantLinear.from_linear(torch.nn.Linear(512, 256, bias=bias).half(), wtype,
                                    group_size=group)
    if act_order:  # a shuffled layer, as an act-order GPTQ import makes
        perm = torch.randperm(512)
        act = QuantLinear(512, 256, wtype, group, bias=bias, act_order=True)
        act.set_codes(layer.codes(), layer.scales, layer.zeros, perm)
        if bias:
            act.bias.copy_(layer.bias)
        layer = act
    codes = layer.codes()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    layer = layer.cuda()
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated() - before
    names = ["qweight", "scales"] + (["zeros"] if layer.zeros is not None else []) + \
        (["bias"] if bias else []) + (["input_perm"] if act_order else [])
    assert [n for n, _ in layer.named_buffers()] == names
    assert all(b.is_cuda for b in layer.buffers())
    assert grown <= layer.weight_bytes() + 512 * len(names)  # allocator rounding only
    assert layer.qweight.numel() == 256 * 512 * lowvm.dtype(wtype).nbits // 8
    ref = prepare_weight(codes.numpy(), layer.scales.cpu().numpy(), wtype, layer.group_size,
                         device="cuda",
                         zeros=None if layer.zeros is None else layer.zeros.cpu().numpy())
    assert torch.equal(layer.qweight, ref.packed)
    assert torch.equal(layer.codes().cpu(), codes)  # unpacking on the GPU
    x = torch.randn(5, 512, dtype=torch.bfloat16, device="cuda")
    y = layer(x)
    expected = x.double() @ layer.dequantize(torch.float64).t()
    if bias:
        expected = expected + layer.bias.double()
    assert ((y.double() - expected).norm() / expected.norm()).item() < 1e-2


def test_cuda_state_dict_round_trip_and_device_moves():
    torch.manual_seed(0)
    a = QuantLinear.from_linear(torch.nn.Linear(256, 128).half(), "int4", 64).cuda()
    b = QuantLinear.from_linear(torch.nn.Linear(256, 128).half(), "int4", 64).cuda()
    x = torch.randn(3, 256, dtype=torch.float16, device="cuda")
    assert not torch.equal(a(x), b(x))
    a.load_state_dict(b.state_dict())
    assert torch.equal(a(x), b(x))
    packed = a.qweight.clone()
    a.cpu()
    assert not a.qweight.is_cuda and torch.equal(a.qweight, packed.cpu())
    a.cuda()
    assert torch.equal(a.qweight, packed) and torch.equal(a(x), b(x))


def test_repacking_on_cuda_matches_the_cpu_and_checkpoints_load(tmp_path):
    """Repacking on the GPU (torch gathers there) gives the bytes the CPU gives, and a
    model saved from the GPU loads back into layers that run the kernel to the same
    outputs."""
    from transformers import AutoModelForCausalLM

    model = tiny_llama()
    lowvm.quantize_model(model, dtype="uint4", group_size=64, progress=False)
    for name, layer in model.named_modules():
        if isinstance(layer, QuantLinear):
            on_gpu = QuantLinear(layer.in_features, layer.out_features, "uint4", 64,
                                 device="cuda")
            on_gpu.set_codes(layer.codes().cuda(), layer.scales.cuda(), layer.zeros.cuda())
            assert torch.equal(on_gpu.qweight.cpu(), layer.qweight), name
    model.cuda()
    model.save_pretrained(tmp_path)
    loaded = dict(AutoModelForCausalLM.from_pretrained(tmp_path).cuda().named_modules())
    x = torch.randn(3, 256, dtype=torch.float16, device="cuda")
    for name, layer in model.named_modules():
        if isinstance(layer, QuantLinear):
            other = loaded[name]
            assert isinstance(other, QuantLinear) and other.qweight.is_cuda
            assert torch.equal(other.qweight, layer.qweight), name
            xs = x[:, :layer.in_features]
            assert torch.equal(other(xs), layer(xs)), name


def test_cuda_bfloat16_runs_the_kernel():
    lin = torch.nn.Linear(256, 128).to(torch.bfloat16)
    layer = QuantLinear.from_linear(lin, "int4", group_size=64).cuda()
    x = torch.randn(4, 256, dtype=torch.bfloat16, device="cuda") * 1e3  # past fp16 range
    y = layer(x)
    ref = x.double() @ layer.dequantize(torch.float64).t() + layer.bias.double()
    assert y.dtype == torch.bfloat16
    # bf16 activations, scales rounded to bf16: a few bf16 ulps
    assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2


def test_cpu_activations_for_a_cuda_layer_are_refused():
    layer = QuantLinear.from_linear(torch.nn.Linear(256, 128).half(), "int4", 64).cuda()
    with pytest.raises(lowvm.LowvmError, match="cuda"):
        layer(torch.randn(2, 256, dtype=torch.float16))


def test_tiny_model_compile_and_cuda_graph():
    model = tiny_llama().cuda()
    lowvm.quantize_model(model, dtype="int4", group_size=64, progress=False)
    ids = torch.randint(0, 256, (2, 7), device="cuda")
    with torch.no_grad():
        eager = model(ids, use_cache=False).logits
        compiled = torch.compile(model, fullgraph=True)
        assert torch.allclose(compiled(ids, use_cache=False).logits, eager, atol=1e-2,
                              rtol=1e-2)
        static_ids = ids.clone()
        model(static_ids, use_cache=False)  # warm up: kernels compiled and loaded
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = model(static_ids, use_cache=False).logits
        static_ids.copy_(torch.randint(0, 256, (2, 7), device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, model(static_ids, use_cache=False).logits)


def test_split_k_layers_under_cuda_graph_trees(monkeypatch):
    """inductor's CUDA-graph trees (``mode="reduce-overhead"``) record decode GEMMs that
    split K, with the library's split-K buffers first made while the trees warm up and
    record (they must not land in the trees' pool, which refuses live tensors it did
    not make), and replays with new inputs give eager's result."""
    from lowvm.kernels.library import choose_schedule
    from lowvm.runtime import workspaces

    monkeypatch.setattr(workspaces, "_SPLIT", {})
    torch.manual_seed(3)
    layers = torch.nn.Sequential(torch.nn.Linear(4096, 4096, bias=False).half(),
                                 torch.nn.Linear(4096, 1024, bias=False).half())
    lowvm.quantize_model(layers, dtype="int4", group_size=128, skip=(), progress=False)
    layers = layers.cuda()
    assert choose_schedule(1, 4096, 4096, 128).split > 1
    compiled = torch.compile(layers, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for step in range(5):  # warm-up, recording, then replays
            x = torch.randn(1, 4096, dtype=torch.float16, device="cuda")
            got = compiled(x).clone()
            want = layers(x)
            assert torch.allclose(got, want, atol=1e-3, rtol=1e-3), step


@pytest.mark.parametrize("fmt,kw", [("gptq", {"bits": 4, "act_order": True}),
                                    ("awq", {}),
                                    ("compressed-tensors", {"bits": 8, "sym": True})])
def test_hub_checkpoint_loads_on_cuda_and_generates_under_cuda_graphs(tmp_path, fmt, kw):
    """A Hub-layout checkpoint loads straight onto the GPU's kernels; greedy decoding in
    CUDA graphs gives the tokens of the float64 model of the same weights."""
    from lowvm.serving.decode_loop import DecodeLoop
    from tests.helpers.hub_checkpoints import reference_model, write_hub_checkpoint

    written = write_hub_checkpoint(tmp_path / "hub", fmt, **kw)
    model = lowvm.from_pretrained(written.path, device_map="cuda")
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert len(layers) == len(written.references)
    assert all(m.qweight.is_cuda for m in layers)
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(0)).cuda()
    loop = DecodeLoop(model, ids, 12)
    loop.capture()
    assert loop.graph is not None
    got = loop(12).cpu()
    ref = reference_model(written)
    with torch.no_grad():  # the float64 model's choice after each prefix lowvm generated
        want = ref(torch.cat([ids.cpu(), got], dim=1)).logits[:, 7:-1].argmax(-1)
    agree = (got == want).float().mean().item()
    assert agree >= 0.9, (got, want)  # fp16 rounding may flip a near tie


def test_quantize_on_load_to_cuda_peaks_below_the_dense_model(tmp_path):
    """device_map="cuda": each weight is quantized on the GPU as it arrives."""
    from transformers import AutoModelForCausalLM

    tiny_llama().save_pretrained(tmp_path)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    model = AutoModelForCausalLM.from_pretrained(
        tmp_path, device_map="cuda",
        quantization_config=lowvm.LowvmConfig(dtype="int4", group_size=64))
    held = torch.cuda.memory_allocated() - start
    peak = torch.cuda.max_memory_allocated() - start
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    assert layers and all(m.qweight.is_cuda for m in layers)
    dense_layer = max(m.in_features * m.out_features * 2 for m in layers)
    assert peak <= held + 2 * dense_layer + 2**20
