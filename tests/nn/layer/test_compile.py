"""The custom op under torch.compile, and the CUDA backend's arithmetic run through the
interpreter (the kernel's exact CPU semantics) instead of a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lowvm
from lowvm.kernels.quant_gemm import GemmSchedule, quant_gemm
from lowvm.nn.layer import backend
from lowvm.nn.layer.quant_linear import QuantLinear
from tests.helpers.models import tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.layer.backend.LowvmFallbackWarning")


def _layer(wtype: str = "uint4", bias: bool = True, k: int = 128, n: int = 64, group: int = 64):
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n, bias=bias).half()
    return QuantLinear.from_linear(lin, wtype, group_size=group)


def test_opcheck_fake_and_real_agree():
    layer = _layer()
    x = torch.randn(5, 128, dtype=torch.float16)
    args = (x, layer.qweight, layer.scales, layer.zeros, layer.bias, "uint4", 64)
    torch.library.opcheck(torch.ops.lowvm.quant_linear.default, args,
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("backend_name", ["eager", "aot_eager"])
def test_compile_fullgraph_layer(backend_name):
    torch._dynamo.reset()
    layer = _layer()
    x = torch.randn(2, 3, 128, dtype=torch.float16)
    compiled = torch.compile(layer, backend=backend_name, fullgraph=True)
    assert torch.equal(compiled(x), layer(x))


@pytest.mark.slow
def test_compile_fullgraph_model():
    torch._dynamo.reset()
    model = tiny_llama()
    lowvm.quantize_model(model, dtype="int4", group_size=64, progress=False)
    ids = torch.randint(0, 256, (2, 7))
    with torch.no_grad():
        eager = model(ids, use_cache=False).logits
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        assert torch.equal(compiled(ids, use_cache=False).logits, eager)


def _interpreted_library(x, weight, schedule=None):
    """The library's quant_linear with quant_gemm run by lowvm.interpret (numpy)."""
    m, n, k = x.shape[0], weight.n, weight.k
    out = np.zeros((m, n), np.float16)
    zeros = weight.scales if weight.zeros is None else weight.zeros
    program = quant_gemm.build(wtype=weight.wtype, group=weight.group,
                               zero_point=weight.zeros is not None,
                               schedule=GemmSchedule(bk=weight.bk))
    lowvm.interpret(program, m, n, k, x.numpy(), weight.packed.numpy(),
                    weight.scales.numpy(), zeros.numpy(), out, np.zeros((m, n), np.float32),
                    np.zeros(-(-m // 16) * (n // 64), np.int32))
    return torch.from_numpy(out)


@pytest.mark.parametrize("wtype,group,bias", [("uint4", 64, True), ("int4", 32, False),
                                              ("e3m2", 128, True)])
def test_cuda_path_arithmetic_with_the_interpreted_kernel(monkeypatch, wtype, group, bias):
    """Repacking on the device, zero points and bias of cuda_quant_linear, with the
    library kernel interpreted."""
    monkeypatch.setattr(backend, "library_quant_linear", _interpreted_library)
    layer = _layer(wtype, bias, group=group)
    x = torch.randn(3, 128, dtype=torch.float16)
    y = backend.cuda_quant_linear(x, layer.packed())
    ref = x.double() @ layer.dequantize(torch.float64).t()
    if bias:
        ref = ref + layer.bias.double()
    assert y.dtype == torch.float16 and y.shape == (3, 64)
    assert (y.double() - ref).norm() / ref.norm() < 3e-3


@pytest.mark.parametrize("group", [16, 64, 128, 256])
def test_kernel_builds_for_every_group_the_checks_accept(group):
    """Every group size that passes shape_problem gives a buildable kernel."""
    from lowvm.kernels.library import weight_bk

    assert backend.shape_problem(256, 64, group) is None
    program = quant_gemm.build(wtype=lowvm.int3, group=group,
                               schedule=GemmSchedule(bk=weight_bk(group, 256)))
    assert program is not None
