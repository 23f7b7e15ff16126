"""The GemLite baseline adapter: its arithmetic and config routing on the CPU, its wiring
into the harness with a stand-in ``gemlite`` module, and (``gpu``) the real kernels."""

from __future__ import annotations

import enum
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lowvm.bench import candidates, gemlite_baseline, plot, results
from lowvm.bench.errors import BenchError
from lowvm.bench.gemlite_baseline import (
    Plan,
    dequantize,
    fma_zeros,
    nearest_key,
    plan_call,
    quantize,
    signature,
)
from lowvm.dtypes import dtype

SHIPPED_H100 = (Path(__file__).resolve().parents[2] / ".carry" / "gemlite_src"
                / "gemlite" / "configs" / "h100.json")


def _weight(n: int = 24, k: int = 256, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=gen) / 16).to(torch.float16)


# --- quantisation arithmetic against numpy ------------------------------------------------

@pytest.mark.parametrize("nbits", [1, 2, 4, 8])
@pytest.mark.parametrize("group", [32, 128])
def test_quantize_matches_numpy_and_stays_within_half_a_step(nbits, group):
    w = _weight()
    codes, scales, zeros = quantize(w, nbits, group)
    n, k = w.shape
    assert codes.dtype == torch.uint8 and codes.shape == (n, k)
    assert scales.dtype == zeros.dtype == torch.float16
    assert scales.shape == zeros.shape == (n, k // group)

    qmax = 2 ** nbits - 1
    wn = w.numpy().astype(np.float32).reshape(n, k // group, group)
    lo, hi = wn.min(axis=2), wn.max(axis=2)
    s = np.maximum((hi - lo) / np.float32(qmax), np.float32(1e-4)).astype(np.float16)
    z = (-lo / s.astype(np.float32)).astype(np.float16)
    q = np.clip(np.round(wn / s.astype(np.float32)[..., None] + z.astype(np.float32)[..., None]),
                0, qmax).astype(np.uint8).reshape(n, k)
    np.testing.assert_array_equal(scales.numpy(), s)
    np.testing.assert_array_equal(zeros.numpy(), z)
    assert np.mean(codes.numpy() != q) < 1e-3  # torch and numpy may differ on exact ties
    assert int(codes.max()) <= qmax

    # HQQ form (q - zero) * scale reconstructs every weight to half a step (plus the
    # fp16 rounding of the zero)
    step = np.repeat(s.astype(np.float64), group, axis=1)
    back = (codes.numpy().astype(np.float64)
            - np.repeat(z.astype(np.float64), group, axis=1)) * step
    assert np.all(np.abs(back - w.numpy().astype(np.float64)) <= 0.5 * step * 1.01 + 1e-6)


def test_fma_zeros_and_dequantize_match_numpy_fp16_fma():
    w = _weight(16, 256, seed=3)
    codes, scales, zeros = quantize(w, 4, 64)
    zf = fma_zeros(scales, zeros)
    want_zf = (-zeros.numpy().astype(np.float32) * scales.numpy().astype(np.float32))
    np.testing.assert_array_equal(zf.numpy(), want_zf.astype(np.float16))

    deq = dequantize(codes, scales, zf, 64)
    assert deq.dtype == torch.float64 and deq.shape == w.shape
    exact = (codes.numpy().astype(np.float64) * np.repeat(scales.numpy().astype(np.float64), 64, 1)
             + np.repeat(zf.numpy().astype(np.float64), 64, 1))
    np.testing.assert_array_equal(deq.numpy(), exact.astype(np.float16).astype(np.float64))
    # the weight GemLite holds is the quantised weight, to an fp16 rounding
    rel = np.linalg.norm(deq.numpy() - w.numpy()) / np.linalg.norm(w.numpy())
    assert rel < 0.15


@pytest.mark.parametrize("n,k,nbits,group,needle", [
    (64, 256, 3, 128, "nbits=3"),
    (64, 256, 5, 128, "1, 2, 4, 8"),
    (64, 256, 4, 48, "group=48"),
    (64, 256, 4, 16, "multiples of 32"),
    (64, 320, 4, 128, "K=320"),
    (64, 272, 4, 16, "group=16"),
    (64, 128, 4, 128, "two groups"),
])
def test_unsupported_arguments_raise_bench_errors_naming_them(n, k, nbits, group, needle):
    with pytest.raises(BenchError, match="gemlite") as info:
        quantize(torch.zeros(n, k, dtype=torch.float16), nbits, group)
    assert needle in str(info.value)


def test_prepare_refuses_cpu_and_non_fp16_weights(monkeypatch):
    monkeypatch.setitem(sys.modules, "gemlite", types.ModuleType("gemlite"))
    with pytest.raises(BenchError, match="CUDA device"):
        gemlite_baseline.prepare(torch.zeros(64, 256, dtype=torch.float16))
    with pytest.raises(BenchError, match="dtype torch.float32 is not supported"):
        gemlite_baseline.prepare(torch.zeros(64, 256, dtype=torch.float32))


# --- config routing --------------------------------------------------------------------------

def test_signature_is_gemlite_config_key():
    assert signature(1, 4096, 4096, 128, 4) == "(1, 4096, 4096, 128, 8, 104)"
    assert signature(16, 6144, 4096, 64, 2) == "(16, 6144, 4096, 64, 16, 102)"


@pytest.mark.skipif(not SHIPPED_H100.is_file(),
                    reason="GemLite's source (the gemlite/ folder of its 0.6.0.post2 sdist) "
                           "is not under .carry/gemlite_src")
def test_signatures_of_llama_8b_shapes_are_in_gemlite_shipped_h100_file():
    cache = json.loads(SHIPPED_H100.read_text())
    assert signature(1, 6144, 4096, 128, 4) in cache["GEMV_REVSPLITK"]
    assert signature(16, 4096, 14336, 128, 4) in cache["GEMM_SPLITK"]
    assert signature(256, 28672, 4096, 128, 4) in cache["GEMM"]
    # the routing gives every default M of the 8B shapes a shipped config, and the 70B
    # shapes a nearest one: nothing autotunes for int4 g128
    buckets = {1: 1, 4: 4, 16: 16, 64: 64, 256: 256, 4096: 4096}
    for k, n in [(4096, 6144), (4096, 28672), (14336, 4096), (8192, 10240), (28672, 8192)]:
        for m, bucket in buckets.items():
            auto = "GEMV_REVSPLITK" if m <= 4 else "GEMM_SPLITK" if m < 64 else "GEMM"
            plan = plan_call(m, bucket, n, k, 128, 4, auto, cache)
            big = (k, n) in [(8192, 10240), (28672, 8192)]
            assert plan.source.startswith("nearest" if big else "shipped"), (k, n, m, plan)


def _fake_cache() -> dict[str, dict[str, Any]]:
    return {
        "GEMV_REVSPLITK": {signature(1, 4096, 4096, 128, 4): {"BLOCK_SIZE_N": 256},
                           signature(1, 14336, 4096, 128, 4): {"BLOCK_SIZE_N": 512}},
        "GEMM_SPLITK": {signature(4, 4096, 4096, 128, 4): {"SPLIT_K": 4},
                        signature(64, 4096, 4096, 128, 4): {"SPLIT_K": 2}},
        "GEMM": {signature(256, 4096, 4096, 128, 4): {"BLOCK_SIZE_M": 64}},
    }


def test_plan_call_prefers_gemlite_choice_then_other_kernel_then_nearest():
    cache = _fake_cache()
    assert plan_call(1, 1, 4096, 4096, 128, 4, "GEMV_REVSPLITK", cache) == Plan(
        "GEMV_REVSPLITK", "shipped")
    # M = 4: GemLite picks its GEMV, the file has GEMM_SPLITK
    assert plan_call(4, 4, 4096, 4096, 128, 4, "GEMV_REVSPLITK", cache) == Plan(
        "GEMM_SPLITK", "shipped")
    # M = 64: GemLite picks GEMM, the file has GEMM_SPLITK
    assert plan_call(64, 64, 4096, 4096, 128, 4, "GEMM", cache).kernel == "GEMM_SPLITK"
    # an unknown shape takes the nearest shape's config, seeded under its own signature
    plan = plan_call(1, 1, 10240, 8192, 128, 4, "GEMV_REVSPLITK", cache)
    assert plan.kernel == "GEMV_REVSPLITK" and plan.source.startswith("nearest")
    assert plan.seed == (signature(1, 10240, 8192, 128, 4), {"BLOCK_SIZE_N": 512})
    assert plan.seed[1] is not cache["GEMV_REVSPLITK"][signature(1, 14336, 4096, 128, 4)]
    # no config for this width or group anywhere: GemLite autotunes
    assert plan_call(1, 1, 4096, 4096, 128, 2, "GEMV_REVSPLITK", cache) == Plan(
        "GEMV_REVSPLITK", "autotune")
    assert plan_call(16, 16, 4096, 4096, 64, 4, "GEMM_SPLITK", cache).source == "autotune"
    # asked to autotune: GemLite's own choice, nothing seeded
    assert plan_call(4, 4, 4096, 4096, 128, 4, "GEMV_REVSPLITK", cache,
                     autotune=True) == Plan("GEMV_REVSPLITK", "autotune")


def test_nearest_key_ignores_other_buckets_groups_and_junk():
    configs = {"junk": {}, "(1, 2, 3)": {}, signature(16, 4096, 4096, 64, 4): {},
               signature(16, 8192, 8192, 128, 4): {}, signature(16, 4096, 4096, 128, 4): {}}
    assert nearest_key(configs, 16, 5000, 4096, 128, 4) == signature(16, 4096, 4096, 128, 4)
    assert nearest_key(configs, 16, 9000, 9000, 128, 4) == signature(16, 8192, 8192, 128, 4)
    assert nearest_key(configs, 1, 4096, 4096, 128, 4) is None


@pytest.mark.parametrize("value,want", [("", False), ("0", False), ("no", False),
                                        ("1", True), ("TRUE", True)])
def test_autotune_environment_variable(monkeypatch, value, want):
    monkeypatch.setenv(gemlite_baseline.AUTOTUNE_ENV, value)
    assert gemlite_baseline.autotune_requested() is want


def test_autotune_environment_variable_rejects_other_values(monkeypatch):
    monkeypatch.setenv(gemlite_baseline.AUTOTUNE_ENV, "maybe")
    with pytest.raises(BenchError, match="LOWVM_GEMLITE_AUTOTUNE='maybe'"):
        gemlite_baseline.autotune_requested()


# --- wiring into the harness ------------------------------------------------------------------

def test_absent_gemlite_is_noted_and_builds_nothing(monkeypatch):
    monkeypatch.setitem(sys.modules, "gemlite", None)  # import raises ImportError
    notes = candidates.probe_optional(("gemlite",))
    assert len(notes) == 1 and notes[0].startswith("gemlite: skipped, gemlite does not import")
    ready, missing = candidates.build_candidates(
        _weight(64, 256), (dtype("int4"),), (128,), (), with_lowvm=False,
        optional=("gemlite",))
    assert ready == [] and missing == []


class _FakeDType(enum.Enum):
    FP16 = 1


class _FakeLayer:
    """Records how the adapter builds and calls a GemLite layer."""

    instances: list[_FakeLayer] = []

    def __init__(self, W_nbits: int, group_size: int, in_features: int, out_features: int,
                 input_dtype: Any, output_dtype: Any, scaled_activations: bool) -> None:
        self.init = dict(W_nbits=W_nbits, group_size=group_size, in_features=in_features,
                         out_features=out_features, input_dtype=input_dtype,
                         output_dtype=output_dtype, scaled_activations=scaled_activations)
        self.in_features, self.out_features = in_features, out_features
        self.calls: list[tuple[int, str]] = []
        _FakeLayer.instances.append(self)

    def pack(self, W_q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
             bias: Any = None) -> _FakeLayer:
        self.packed = (W_q, scales, zeros, bias)
        # what GemLite 0.6 stores in fma mode: [K/group, N] scales and -zero*scale
        self.scales = scales.t().contiguous()
        self.zeros = (-zeros.float() * scales.float()).to(zeros.dtype).t().contiguous()
        self.W_group_mode = 4
        return self

    def forward_manual(self, x: torch.Tensor, matmul_type: str = "GEMM") -> torch.Tensor:
        self.calls.append((x.shape[0], matmul_type))
        return torch.zeros(x.shape[0], self.out_features, dtype=torch.float16)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.append((x.shape[0], "auto"))
        return torch.zeros(x.shape[0], self.out_features, dtype=torch.float16)


def _fake_gemlite(monkeypatch, cache: dict[str, dict[str, Any]]) -> types.ModuleType:
    gl = types.ModuleType("gemlite")
    gl.__version__ = "0.0.fake"
    gl.__file__ = "/nonexistent/gemlite/__init__.py"
    gl.DType = _FakeDType
    gl.GemLiteLinearTriton = _FakeLayer
    gl.load_config = lambda path: pytest.fail("a non-empty config cache must not be reloaded")
    core = types.ModuleType("gemlite.core")
    core.GEMLITE_TRITON_CONFIG_CACHE = cache
    core.get_matmul_type = lambda m, nbits: (
        "GEMM" if m >= 64 else "GEMM_SPLITK" if m > 4 else "GEMV_REVSPLITK")
    tk = types.ModuleType("gemlite.triton_kernels")
    utils = types.ModuleType("gemlite.triton_kernels.utils")
    utils.get_closest_m = lambda m: 1 << (m - 1).bit_length()
    tk.utils = utils
    gl.core, gl.triton_kernels = core, tk
    for name, mod in [("gemlite", gl), ("gemlite.core", core),
                      ("gemlite.triton_kernels", tk), ("gemlite.triton_kernels.utils", utils)]:
        monkeypatch.setitem(sys.modules, name, mod)
    # the CPU stands in for the GPU here; the fake does the packing
    monkeypatch.setattr(gemlite_baseline, "_check_weight", lambda w: None)
    monkeypatch.delenv(gemlite_baseline.AUTOTUNE_ENV, raising=False)
    _FakeLayer.instances = []
    return gl


@pytest.mark.slow
def test_candidates_build_and_call_gemlite_as_recorded(monkeypatch):
    cache = _fake_cache()
    _fake_gemlite(monkeypatch, cache)
    notes = candidates.probe_optional(("gemlite",))
    assert notes[0].startswith("gemlite: gemlite 0.0.fake imports; timed as gemlite_int")

    w = (torch.randn(4096, 4096, generator=torch.Generator().manual_seed(1)) / 64).half()
    ready, missing = candidates.build_candidates(
        w, (dtype("int4"), dtype("int3"), dtype("int2")), (128, 48), (), with_lowvm=False,
        optional=("gemlite",))
    assert [c.kernel for c in ready] == ["gemlite_int2_g128", "gemlite_int4_g128"]
    assert [(u.kernel, u.status) for u in missing] == [("gemlite_int2_g48", "skipped"),
                                                       ("gemlite_int4_g48", "skipped")]
    assert "group=48" in missing[0].note

    c = ready[1]
    assert (c.family, c.wtype, c.act_dtype, c.tol) == ("baseline", "int4", torch.float16,
                                                      candidates.TOL_FP16)
    assert (c.fmt.bits, c.fmt.group, c.fmt.meta_bytes_per_group) == (4, 128, 4)
    layer = _FakeLayer.instances[1]
    assert layer.init == dict(W_nbits=4, group_size=128, in_features=4096, out_features=4096,
                              input_dtype=_FakeDType.FP16, output_dtype=_FakeDType.FP16,
                              scaled_activations=False)
    W_q, scales, zeros, bias = layer.packed
    assert W_q.dtype == torch.uint8 and W_q.shape == (4096, 4096) and bias is None
    assert scales.shape == zeros.shape == (4096, 32) and scales.dtype == torch.float16

    for m in (1, 4, 16, 64):
        y = c.fn(torch.zeros(m, 4096, dtype=torch.float16))
        assert y.shape == (m, 4096)
    assert layer.calls == [(1, "GEMV_REVSPLITK"), (4, "GEMM_SPLITK"), (16, "GEMM_SPLITK"),
                           (64, "GEMM_SPLITK")]
    # M = 16 (bucket 16) is not in the fake file: the nearest bucket-16 GEMM_SPLITK entry
    # does not exist either, so GemLite would autotune it; nothing was seeded for it
    assert signature(16, 4096, 4096, 128, 4) not in cache["GEMM_SPLITK"]

    ref = c.ref_weight()
    assert ref.dtype == torch.float64 and ref.shape == (4096, 4096)
    assert torch.linalg.vector_norm(ref - w.double()) / torch.linalg.vector_norm(w.double()) < 0.15


def test_a_nearest_config_is_seeded_into_gemlite_cache(monkeypatch):
    cache = _fake_cache()
    _fake_gemlite(monkeypatch, cache)
    w = _weight(8192, 256)
    prep = gemlite_baseline.prepare(w, 4, 128)
    gemlite_baseline.run(prep, torch.zeros(4, 256, dtype=torch.float16))
    key = signature(4, 8192, 256, 128, 4)
    assert cache["GEMM_SPLITK"][key] == {"SPLIT_K": 4}
    assert prep.plans[4].source.startswith("nearest") and prep.plans[4].kernel == "GEMM_SPLITK"


def test_autotune_environment_variable_uses_gemlite_own_forward(monkeypatch):
    _fake_gemlite(monkeypatch, _fake_cache())
    monkeypatch.setenv(gemlite_baseline.AUTOTUNE_ENV, "1")
    prep = gemlite_baseline.prepare(_weight(64, 256), 4, 128)
    gemlite_baseline.run(prep, torch.zeros(4, 256, dtype=torch.float16))
    assert _FakeLayer.instances[0].calls == [(4, "auto")]


def test_marlin_probes_are_unchanged(monkeypatch):
    monkeypatch.setitem(sys.modules, "sgl_kernel", types.ModuleType("sgl_kernel"))
    monkeypatch.setitem(sys.modules, "vllm", None)
    notes = candidates.probe_optional(("marlin_vllm", "marlin_sgl"))
    assert notes[0].startswith("marlin_vllm: skipped, vllm._custom_ops does not import")
    assert notes[1] == "marlin_sgl: skipped, sgl_kernel has no gptq_marlin_gemm"


def test_gemlite_rows_fit_the_results_schema_and_the_plot(tmp_path):
    from lowvm.bench import counting
    from lowvm.runtime.timing import Timing

    fmt = counting.quant_format(4, 128, 4)
    t = Timing(median_us=20.0, min_us=19.0, p10_us=19.5, p90_us=21.0, runs=30)
    rows = [results.measured_row("gemlite_int4_g128", "baseline", "int4", fmt, 4096, 4096, 1,
                                 t, 3.0, rel_err=1e-3),
            results.unmeasured_row("gemlite_int4_g128", "baseline", "int4", fmt, 4096, 4096,
                                   256, "failed", "RuntimeError: x", 3.0)]
    doc = results.document(rows, gpu="H100", date="2026-11-24T00:00:00+00:00",
                           torch_version="2.11", cuda_version="13.0",
                           hbm={"floor_tbps": 3.0}, method={})
    loaded = results.load(results.write(doc, tmp_path / "r.json"))
    data = plot.plot_data(loaded)
    assert data.decode.values["gemlite_int4_g128"] == [rows[0].gbps]
    assert rows[0].weight_bytes == 4096 * 4096 // 2 + 4096 * 32 * 4


# --- on the GPU ---------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16])
def test_gemlite_matches_its_dequantised_weight_on_the_gpu(m):
    pytest.importorskip("gemlite", reason="carry .carry/gemlite_src and set PYTHONPATH")
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(4096, 4096, device="cuda", generator=gen) / 64).to(torch.float16)
    prep = gemlite_baseline.prepare(w, 4, 128)
    _, scales, zeros = quantize(w, 4, 128)
    assert torch.equal(prep.scales, scales)
    assert torch.equal(prep.zeros, fma_zeros(scales, zeros))
    x = torch.randn(m, 4096, device="cuda", generator=gen).to(torch.float16)
    y = gemlite_baseline.run(prep, x)
    torch.cuda.synchronize()
    assert y.shape == (m, 4096) and y.dtype == torch.float16
    ref = x.double() @ gemlite_baseline.dequantized(prep).t()
    err = (torch.linalg.vector_norm(y.double() - ref) / torch.linalg.vector_norm(ref)).item()
    assert err < 3e-3, (m, prep.plans[m], err)
    if "h100" in torch.cuda.get_device_name().lower():
        assert prep.plans[m].source == "shipped", prep.plans[m]
