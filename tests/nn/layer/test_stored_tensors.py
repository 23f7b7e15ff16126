"""What a QuantLinear refuses to store: scales, zero points and biases that are not finite
once kept in the layer's dtype, a qweight that is not bytes, an input permutation that is
not one, and activations that are not tensors. Each refusal leaves the layer as it was."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lowvm.nn.errors import ActivationError, CheckpointError, QuantizationError
from lowvm.nn.layer.quant_linear import QuantLinear

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.LowvmFallbackWarning")

K, N = 128, 64


def _layer(**kwargs) -> QuantLinear:
    torch.manual_seed(0)
    return QuantLinear.from_weight(torch.randn(N, K, dtype=torch.float16), "int4", 64,
                                   **kwargs)


def _act_order_layer() -> QuantLinear:
    layer = QuantLinear(K, N, "int4", 64, act_order=True)
    codes = torch.randint(0, 16, (N, K), dtype=torch.uint8)
    layer.set_codes(codes, torch.rand(2, N) + 0.5, None, torch.randperm(K))
    return layer


def _snapshot(layer: QuantLinear) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in layer.state_dict().items()}


def _unchanged(layer: QuantLinear, before: dict[str, torch.Tensor]) -> bool:
    after = layer.state_dict()
    return all(torch.equal(after[k], v) for k, v in before.items())


@pytest.mark.parametrize("make", ["from_linear", "from_weight"])
def test_a_float32_bias_beyond_float16_is_refused_not_made_inf(make):
    linear = nn.Linear(K, N).half()
    linear.bias = nn.Parameter(torch.full((N,), 1e5))  # float32, as some models keep it
    with pytest.raises(QuantizationError, match=r"bias\[0\] = 100000 .* beyond float16's "
                                                r"range .*65504.*bfloat16"):
        if make == "from_linear":
            QuantLinear.from_linear(linear, "int4", 64, name="mlp.up")
        else:
            QuantLinear.from_weight(linear.weight, "int4", 64, bias=linear.bias)
    linear.bias = nn.Parameter(torch.full((N,), 1e5, dtype=torch.bfloat16))
    kept = QuantLinear.from_weight(linear.weight.bfloat16(), "int4", 64, bias=linear.bias)
    assert kept.bias.dtype == torch.bfloat16 and torch.isfinite(kept.bias).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 1e6])
def test_set_codes_refuses_scales_and_zeros_that_are_not_finite_in_float16(bad):
    layer = _layer()
    before = _snapshot(layer)
    scales = torch.ones(2, N)
    scales[1, 5] = bad
    with pytest.raises(QuantizationError, match=r"set_codes: scales\[1, 5\]"):
        layer.set_codes(layer.codes(), scales, None)
    assert _unchanged(layer, before)
    asym = QuantLinear(K, N, "uint4", 64)
    zeros = torch.full((2, N), 8.0)
    zeros[0, 3] = bad
    with pytest.raises(QuantizationError, match=r"set_codes: zeros\[0, 3\]"):
        asym.set_codes(torch.zeros(N, K, dtype=torch.uint8), torch.ones(2, N), zeros)
    assert torch.equal(asym.zeros, torch.zeros(2, N, dtype=torch.float16))


@pytest.mark.parametrize("perm, needle", [
    (torch.zeros(K, dtype=torch.long), r"input_perm holds 0 128 times \(and lacks 1\)"),
    (torch.arange(K) + 1000, r"input_perm\[0\] = 1000 lies outside \[0, 128\)"),
    (torch.arange(K) - 1, r"input_perm\[0\] = -1 lies outside"),
    (torch.arange(K).float(), "input_perm must be an integer tensor"),
])
def test_an_input_perm_that_is_not_a_permutation_is_refused(perm, needle):
    layer = _act_order_layer()
    before = _snapshot(layer)
    with pytest.raises(QuantizationError, match=needle):
        layer.set_codes(layer.codes(), layer.scales, None, perm)
    assert _unchanged(layer, before)
    state = {k: v.clone() for k, v in before.items()}
    state["input_perm"] = perm
    with pytest.raises(CheckpointError, match=needle):
        layer.load_state_dict(state)
    assert _unchanged(layer, before)
    x = torch.randn(3, K, dtype=torch.float16)
    assert layer(x).shape == (3, N)  # still runs on its own permutation


def test_load_state_dict_refuses_nan_scales_and_a_float_qweight():
    layer = _layer()
    before = _snapshot(layer)
    state = {k: v.clone() for k, v in before.items()}
    state["scales"][0, 7] = float("nan")
    with pytest.raises(CheckpointError, match=r"scales\[0, 7\] is nan; scales must be finite"):
        layer.load_state_dict(state)
    assert _unchanged(layer, before)
    state = {k: v.clone() for k, v in before.items()}
    state["qweight"] = state["qweight"].float() + 200  # values above 255 would wrap
    with pytest.raises(CheckpointError, match=r"qweight is torch.float32; .*must be "
                                              r"torch.uint8"):
        layer.load_state_dict(state)
    assert _unchanged(layer, before)
    state = {k: v.clone() for k, v in before.items()}
    layer.load_state_dict(state)  # the same tensors load
    assert _unchanged(layer, before)


@pytest.mark.parametrize("x, kind", [(np.zeros((1, K), dtype=np.float16), "numpy.ndarray"),
                                     ([0.0] * K, "list")])
def test_activations_that_are_not_tensors_are_named(x, kind):
    with pytest.raises(ActivationError, match=rf"x must be a torch.Tensor; got a {kind}"):
        _layer()(x)
