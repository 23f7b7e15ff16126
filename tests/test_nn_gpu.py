"""QuantLinear on CUDA (run with `pytest -m gpu` on the device): kernel path vs a float64
reference, bf16 reference path, torch.compile and CUDA-graph capture of a tiny model."""

from __future__ import annotations

import pytest
import torch

import lowvm
from lowvm.nn.quant_linear import QuantLinear
from tests.test_nn_model import tiny_llama

pytestmark = [pytest.mark.gpu,
              pytest.mark.filterwarnings("ignore::lowvm.nn.backend.LowvmFallbackWarning")]


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


def test_kernel_weight_follows_qweight_through_the_layer():
    torch.manual_seed(0)
    a = QuantLinear.from_linear(torch.nn.Linear(256, 128).half(), "int4", 64).cuda()
    b = QuantLinear.from_linear(torch.nn.Linear(256, 128).half(), "int4", 64).cuda()
    x = torch.randn(3, 256, dtype=torch.float16, device="cuda")
    assert a.kernel_weight is not None and "kernel_weight" not in a.state_dict()
    a.load_state_dict(b.state_dict())
    assert torch.equal(a(x), b(x))
    assert a.cpu().kernel_weight is None and a.cuda().kernel_weight is not None


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


def test_types_beyond_float16_take_the_reference_path_with_f16_activations():
    lin = torch.nn.Linear(256, 128).half()
    layer = QuantLinear.from_linear(lin, "e5m1", group_size=64).cuda()
    x = torch.randn(3, 256, dtype=torch.float16, device="cuda")
    y = layer(x)  # warns once and dequantizes instead of overflowing in the kernel
    ref = x.double() @ layer.dequantize(torch.float64).t() + layer.bias.double()
    assert torch.isfinite(y).all()
    assert ((y.double() - ref).norm() / ref.norm()).item() < 2e-3
