"""QuantLinear on the CPU: packing, round-to-nearest, forward, state_dict, errors."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import lowvm
from lowvm.dtypes import pack
from lowvm.kernels.quant_matmul import dequantize_weights, quantize_weights
from lowvm.nn.errors import ActivationError, QuantizationError
from lowvm.nn.layer import backend
from lowvm.nn.layer.packing import pack_rows, unpack_rows
from lowvm.nn.layer.quant_linear import QuantLinear
from tests.helpers.activation_errors import assert_activation_errors

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.layer.backend.LowvmFallbackWarning")


def _linear(k: int = 256, n: int = 128, bias: bool = True, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    lin = torch.nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.normal_()
        if bias:
            lin.bias.normal_()
    return lin.half()


@pytest.mark.parametrize("nbits", range(1, 9))
def test_pack_rows_is_lowvm_dtypes_pack(nbits):
    codes = torch.randint(0, 2**nbits, (3, 80), dtype=torch.uint8)
    packed = pack_rows(codes, nbits)
    expected = np.stack([pack(row, f"uint{nbits}") for row in codes.numpy()])
    assert np.array_equal(packed.numpy(), expected)
    assert torch.equal(unpack_rows(packed, nbits, 80), codes)


@pytest.mark.parametrize("wtype", ["int4", "int3", "int8", "e3m2", "e2m1", "float8_e4m3"])
def test_symmetric_rtn_matches_the_kernel_host_reference(wtype):
    """Same codes and scales as lowvm.kernels.quant_matmul.quantize_weights (numpy)."""
    lin = _linear()
    layer = QuantLinear.from_linear(lin, wtype, group_size=64)
    packed, scales = quantize_weights(lin.weight.detach().double().numpy(), wtype, 64)
    assert np.array_equal(layer.scales.numpy(), scales)
    nbits = lowvm.dtype(wtype).nbits  # the host reference packs plain bit-stream rows
    assert np.array_equal(pack_rows(layer.codes(), nbits).numpy(), packed)
    ref = dequantize_weights(packed, scales, wtype, 64, 256)
    assert np.array_equal(layer.dequantize(torch.float64).numpy(), ref)


@pytest.mark.parametrize("wtype", ["uint4", "uint3", "uint8"])
def test_zero_point_rtn_error_is_within_half_a_step(wtype):
    lin = _linear()
    layer = QuantLinear.from_linear(lin, wtype, group_size=64)
    assert layer.zeros is not None and layer.spec.zero_point
    step = layer.scales.float().repeat_interleave(64, dim=0).t()  # [N, K]
    err = (layer.dequantize() - lin.weight.detach().float()).abs()
    assert (err <= step / 2 * (1 + 1e-3) + 1e-6).all()
    zeros = layer.zeros.float()
    assert torch.equal(zeros, zeros.round()) and zeros.min() >= 0
    assert zeros.max() <= 2 ** lowvm.dtype(wtype).nbits - 1


@pytest.mark.parametrize("act", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("shape", [(5,), (2, 3), (2, 1, 4)])
def test_forward_matches_float64_reference(act, shape):
    lin = _linear()
    layer = QuantLinear.from_linear(lin, "uint4", group_size=64)
    x = torch.randn(*shape, 256).to(act)
    y = layer(x)
    assert y.dtype == act and y.shape == (*shape, 128)
    ref = x.double() @ layer.dequantize(torch.float64).t() + lin.bias.double()
    rel = (y.double() - ref).norm() / ref.norm()
    assert rel < (2e-3 if act == torch.float16 else 1e-2)
    # and it is a low-bit layer, not the dense one
    assert not torch.allclose(layer.dequantize(), lin.weight.float())


def test_group_size_minus_one_is_one_group_per_row():
    layer = QuantLinear.from_linear(_linear(), "int4", group_size=-1)
    assert layer.group_size == 256 and layer.scales.shape == (1, 128)


def test_state_dict_round_trip_and_repr():
    layer = QuantLinear.from_linear(_linear(), "uint3", group_size=128)
    state = layer.state_dict()
    assert set(state) == {"qweight", "scales", "zeros", "bias", "_extra_state"}
    fresh = QuantLinear(256, 128, "uint3", 128, bias=True)
    x = torch.randn(4, 256, dtype=torch.float16)
    assert not torch.equal(fresh(x), layer(x))
    fresh.load_state_dict(state)
    assert torch.equal(fresh(x), layer(x))
    text = repr(fresh)
    assert "dtype=uint3" in text and "group_size=128" in text and "in_features=256" in text


def test_model_cast_keeps_float16_scales_and_casts_bias():
    layer = QuantLinear.from_linear(_linear(), "int4", group_size=64)
    scales = layer.scales.clone()
    layer.to(torch.bfloat16)
    assert layer.scales.dtype == torch.float16 and torch.equal(layer.scales, scales)
    assert layer.bias is not None and layer.bias.dtype == torch.bfloat16
    layer.float()
    assert layer.scales.dtype == torch.float16
    assert list(layer.state_dict()) == ["qweight", "scales", "bias", "_extra_state"]


def test_cpu_fallback_warns_once():
    layer = QuantLinear.from_linear(_linear(), "int4", group_size=64)
    backend._warned.clear()
    x = torch.randn(2, 256, dtype=torch.float16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        layer(x)
        layer(x)
    hits = [w for w in caught if issubclass(w.category, backend.LowvmFallbackWarning)]
    assert len(hits) == 1 and "reference path" in str(hits[0].message)


@pytest.mark.parametrize("bad", ["int32", "float16", "int9", "int1", "nonsense"])
def test_unsupported_dtype_names_are_lowvm_errors(bad):
    with pytest.raises(lowvm.DTypeError, match="dtype"):
        QuantLinear.from_linear(_linear(), bad)


def test_group_size_must_divide_in_features():
    with pytest.raises(QuantizationError, match=r"group_size=96 does not divide in_features=256"):
        QuantLinear.from_linear(_linear(), "int4", group_size=96)
    with pytest.raises(QuantizationError, match="group_size"):
        QuantLinear.from_linear(_linear(), "int4", group_size=0)


def test_features_must_fit_the_kernel_tile():
    with pytest.raises(QuantizationError, match="in_features=200 is not a multiple of 64"):
        QuantLinear.from_linear(_linear(k=200), "int4", group_size=-1)
    with pytest.raises(QuantizationError, match="out_features=100 is not a multiple of 64"):
        QuantLinear.from_linear(_linear(n=100), "int4", group_size=64)
    with pytest.raises(QuantizationError, match="multiple of 16"):
        QuantLinear.from_linear(_linear(k=192), "int4", group_size=24)


def test_zero_point_rules():
    with pytest.raises(QuantizationError, match="needs zero points"):
        QuantLinear.from_linear(_linear(), "uint4", zero_point=False)
    with pytest.raises(QuantizationError, match="needs an unsigned type"):
        QuantLinear.from_linear(_linear(), "int4", zero_point=True)


def test_from_linear_needs_a_linear():
    with pytest.raises(QuantizationError, match="torch.nn.Linear"):
        QuantLinear.from_linear(torch.nn.Conv1d(4, 4, 1), "int4")  # type: ignore[arg-type]


def test_activation_errors_name_dtype_shape_and_device():
    layer = QuantLinear.from_linear(_linear(), "int4", group_size=64)
    assert_activation_errors(layer)
    assert isinstance(ActivationError("x"), lowvm.LowvmError)


def test_bfloat16_scales_are_cast_once_per_layer_and_again_after_an_in_place_change():
    """The CUDA path reads a layer's scales in the activation type: cast once, kept while
    the layer's tensors are unchanged (not a cast kernel before every GEMM)."""
    import gc

    import lowvm.dtypes
    from lowvm.nn.layer import backend
    from lowvm.nn.layer.packed import PackedLinear

    scales = torch.rand(4, 64, dtype=torch.float16)
    zeros = torch.full((4, 64), 8.0, dtype=torch.float16)
    layer = PackedLinear(torch.zeros(1, dtype=torch.uint8), scales, zeros, None,
                         lowvm.dtypes.uint4, 128, 512)
    assert backend._scales_as(layer, torch.float16) == (scales, zeros)  # no copy
    s1, z1 = backend._scales_as(layer, torch.bfloat16)
    assert s1.dtype == z1.dtype == torch.bfloat16 and torch.equal(s1, scales.bfloat16())
    s2, z2 = backend._scales_as(layer, torch.bfloat16)
    assert s2 is s1 and z2 is z1  # kept
    scales.mul_(2)  # load_state_dict copies in place: the cast must follow
    s3, _ = backend._scales_as(layer, torch.bfloat16)
    assert s3 is not s1 and torch.equal(s3, scales.bfloat16())
    key = (id(scales), torch.bfloat16)
    del layer, scales, s1, s2, s3, z1, z2
    gc.collect()
    assert key not in backend._CONVERTED  # freed with the layer's scales


def test_bfloat16_scales_of_inference_mode_layers_are_cast_per_call():
    """Inference tensors have no version counter to watch: no cache, still right."""
    import lowvm.dtypes
    from lowvm.nn.layer import backend
    from lowvm.nn.layer.packed import PackedLinear

    with torch.inference_mode():
        scales = torch.rand(4, 64, dtype=torch.float16)
    layer = PackedLinear(torch.zeros(1, dtype=torch.uint8), scales, None, None,
                         lowvm.dtypes.int4, 128, 512)
    s1, z1 = backend._scales_as(layer, torch.bfloat16)
    assert z1 is None and torch.equal(s1, scales.bfloat16())
    assert (id(scales), torch.bfloat16) not in backend._CONVERTED


def _dense(dtype=torch.float16):
    torch.manual_seed(0)
    return torch.nn.Linear(128, 64, dtype=dtype)


@pytest.mark.parametrize("wtype", ["int4", "uint4", "float4_e2m1", "float6_e3m2", "int8"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_weights_are_refused_with_row_and_column(wtype, bad):
    linear = _dense()
    with torch.no_grad():
        linear.weight[3, 5] = bad
    with pytest.raises(QuantizationError, match=r"layer 'mlp.up': .* 1 non-finite value\(s\), "
                                                r"the first -?(nan|inf) at row 3, column 5"):
        QuantLinear.from_linear(linear, wtype, 64, name="mlp.up")


@pytest.mark.parametrize("wtype", ["int4", "uint4", "float4_e2m1"])
def test_scales_float16_cannot_hold_are_refused_with_the_group(wtype):
    big = _dense(torch.float32)
    with torch.no_grad():
        big.weight[2, 70] = 1e6
    with pytest.raises(QuantizationError, match=r"row 2, columns 64\.\.127 needs a scale of "
                                                r".* above float16's largest"):
        QuantLinear.from_linear(big, wtype, 64)
    tiny = _dense(torch.float32)
    with torch.no_grad():
        tiny.weight.mul_(1e-9)
    with pytest.raises(QuantizationError, match=r"row 0, columns 0\.\.63 .* below float16's "
                                                r"smallest positive value"):
        QuantLinear.from_linear(tiny, wtype, 64)


@pytest.mark.parametrize("wtype", ["float8_e6m1", "float8_e5m2"])
def test_wide_float_types_take_the_smallest_scale_where_theirs_is_smaller(wtype):
    """A small float whose range is wider than float16's scales can follow (e6m1's
    largest value is 6.4e9) quantizes ordinary weights with float16's smallest scale: the
    values still land on normal numbers of the type, so each keeps its relative precision."""
    linear = _dense(torch.float32)
    layer = QuantLinear.from_linear(linear, wtype, 64)
    w = linear.weight.double()
    rel = (layer.dequantize(torch.float64) - w).abs() / w.abs().clamp(min=1e-30)
    bound = 2.0 ** -(1 + lowvm.dtype(wtype).mantissa_bits)
    assert float(rel.max()) <= bound * 1.0001


def test_weights_within_float16s_range_still_quantize():
    linear = _dense(torch.float32)
    with torch.no_grad():
        linear.weight[0, 0] = 60000.0  # int8's scale 472: fine
        linear.weight[1].zero_()       # an all-zero group keeps scale 1
    layer = QuantLinear.from_linear(linear, "int8", 64)
    assert torch.isfinite(layer.dequantize(torch.float32)).all()


def test_quantize_model_names_the_module_of_a_nan_and_changes_nothing():
    from tests.helpers.models import tiny_llama

    model = tiny_llama()
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[7, 9] = float("nan")
    with pytest.raises(QuantizationError, match=r"layer 'model.layers.1.mlp.down_proj': .* "
                                                r"row 7, column 9"):
        lowvm.quantize_model(model, dtype="int4", progress=False)
    assert not any(isinstance(m, QuantLinear) for m in model.modules())
