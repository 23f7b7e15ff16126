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
    # zero points: today's kernel returns x @ (q*s)^T rounded to fp16 before the backend
    # subtracts the zero term, so that rounding is relative to a larger value
    tol = 1e-2 if layer.zeros is not None else 2e-3
    assert ((y.double() - ref).norm() / ref.norm()).item() < tol


def test_cuda_bfloat16_uses_the_reference_path():
    lin = torch.nn.Linear(256, 128).to(torch.bfloat16)
    layer = QuantLinear.from_linear(lin, "int4", group_size=64).cuda()
    x = torch.randn(4, 256, dtype=torch.bfloat16, device="cuda") * 1e3  # past fp16 range
    y = layer(x)
    ref = x.double() @ layer.dequantize(torch.float64).t() + layer.bias.double()
    assert y.dtype == torch.bfloat16
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
