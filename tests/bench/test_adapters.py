"""CPU tests of the kernel adapters: lowvm_entry's quantiser, tinygemm's conventions,
the candidate names and the optional-baseline probe."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lowvm
from lowvm.bench import BenchError, candidates, lowvm_entry, tinygemm
from lowvm.dtypes import pack
from lowvm.kernels.quant_matmul import dequantize_weights, quantize_weights


@pytest.mark.parametrize("wtype, group", [("int4", 64), ("int3", 128), ("e3m2", 64),
                                          ("uint4", 64), ("int8", 128)])
def test_quantize_matches_the_kernels_reference_quantiser(wtype, group):
    w = np.random.default_rng(1).standard_normal((37, 256))
    codes, scales, dequant = lowvm_entry.quantize(w, wtype, group)
    ref_packed, ref_scales = quantize_weights(w, wtype, group)
    assert np.array_equal(pack(codes.reshape(-1), wtype).reshape(ref_packed.shape), ref_packed)
    assert np.array_equal(scales, ref_scales)
    assert np.array_equal(dequant.astype(np.float64),
                          dequantize_weights(ref_packed, ref_scales, wtype, group, 256))


def test_quantize_in_chunks_equals_one_pass(monkeypatch):
    w = np.random.default_rng(2).standard_normal((50, 128))
    whole = lowvm_entry.quantize(w, "int4", 64)
    monkeypatch.setattr(lowvm_entry, "_ROWS_PER_CHUNK", 7)
    for a, b in zip(whole, lowvm_entry.quantize(w, "int4", 64)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("shape, group, needle", [
    ((64, 256), 96, "group=96"),
    ((64, 192), 128, "must divide K=192"),
    ((96, 256), 128, "N=96"),
])
def test_prepare_rejects_what_the_kernel_cannot_run(shape, group, needle):
    w = torch.zeros(shape, dtype=torch.float16)
    with pytest.raises(BenchError, match=needle):
        lowvm_entry.prepare(w, "int4", group)


def test_prepare_rejects_a_non_matrix():
    with pytest.raises(BenchError, match="2-D"):
        lowvm_entry.prepare(torch.zeros(8, dtype=torch.float16), "int4", 64)


def test_tinygemm_quantiser_round_trips_within_half_a_step():
    w = torch.randn(16, 256)
    codes, sz = tinygemm.quantize(w, 128)
    assert codes.dtype == torch.int32 and codes.min() >= 0 and codes.max() <= 15
    assert sz.shape == (2, 16, 2) and sz.dtype == torch.bfloat16
    deq = tinygemm.dequantize(codes, sz, 128)
    step = sz[..., 0].double().t().repeat_interleave(128, dim=1)
    assert ((deq - w.double()).abs() <= 0.5 * step + 0.02 * w.abs().double().max()).all()


def test_pack_nibbles_puts_even_k_in_the_high_nibble():
    codes = torch.tensor([[1, 2, 15, 0]], dtype=torch.int32)
    assert tinygemm.pack_nibbles(codes).tolist() == [[0x12, 0xF0]]


@pytest.mark.skipif(not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"),
                    reason="this torch has no CPU int4 kernel to check the convention with")
def test_tinygemm_convention_agrees_with_torchs_cpu_kernel():
    torch.manual_seed(0)
    w = torch.randn(64, 512)
    x = torch.randn(3, 512).to(torch.bfloat16)
    tg = tinygemm.prepare(w, 128)
    y = tinygemm.run(tg, x).double()
    ref = x.double() @ tinygemm.dequantize(tg.codes, tg.scales_and_zeros, 128).t()
    assert (torch.linalg.vector_norm(y - ref) / torch.linalg.vector_norm(ref)) < 1e-2


def test_tinygemm_limits():
    assert tinygemm.inner_k_tiles(4096) == 8 and tinygemm.inner_k_tiles(96) == 2
    with pytest.raises(BenchError, match="group=100"):
        tinygemm.quantize(torch.zeros(8, 400), 100)
    with pytest.raises(BenchError, match="N=12"):
        tinygemm.quantize(torch.zeros(12, 256), 128)


def test_planned_kernel_names():
    names = candidates.planned_kernels((lowvm.int4, lowvm.float6_e3m2), (64, 128),
                                       ("cublas_fp16", "tinygemm"))
    assert names == ["lowvm_int4_g64", "lowvm_int4_g128", "lowvm_float6_e3m2_g64",
                     "lowvm_float6_e3m2_g128", "cublas_fp16", "tinygemm_int4_g64",
                     "tinygemm_int4_g128"]
    assert candidates.planned_kernels((lowvm.int4,), (128,), (), with_lowvm=False) == []


def test_optional_baselines_are_probed_and_skipped_with_a_note(monkeypatch):
    monkeypatch.setattr(candidates, "OPTIONAL_BASELINES", {
        "absent": ("lowvm_no_such_module_xyz", "gemm"),
        "no_attr": ("json", "gptq_marlin_gemm"),
        "present": ("json", "dumps"),
    })
    absent, no_attr, present = candidates.probe_optional(("absent", "no_attr", "present"))
    assert absent.startswith("absent: skipped") and "does not import" in absent
    assert no_attr.startswith("no_attr: skipped") and "gptq_marlin_gemm" in no_attr
    assert "imports" in present and "not timed" in present
