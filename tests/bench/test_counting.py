"""CPU tests of byte and FLOP counting and the HBM floor: the time to read a GEMM's weights
and scales once at the GPU's memory bandwidth."""

from __future__ import annotations

import pytest

from lowvm.bench import BenchError, counting


def test_int4_g128_bytes_of_a_llama_projection():
    fmt = counting.quant_format(4, 128)
    k, n = 4096, 28672
    assert fmt.weight_bytes(k, n) == k * n // 2
    assert fmt.scale_bytes(k, n) == (k // 128) * n * 2
    assert fmt.total_bytes(k, n) == k * n // 2 + 32 * n * 2


def test_floors_of_llama_projections_at_the_measured_h100_bandwidth():
    # int4 g128 weights+scales read once at 3.04 TB/s (counting.NOMINAL_HBM_TBPS, an H100
    # 80GB's measured HBM3 read bandwidth): ~20 us for Llama-3-8B's 4096x28672 gate/up,
    # ~4.3 us for its 4096x6144 qkv.
    fmt = counting.quant_format(4, 128)
    assert counting.floor_us(fmt.total_bytes(4096, 28672), 3.04) == pytest.approx(20, rel=0.03)
    assert counting.floor_us(fmt.total_bytes(4096, 6144), 3.04) == pytest.approx(4.3, rel=0.03)


def test_odd_widths_round_each_row_up_to_whole_bytes():
    fmt = counting.quant_format(3, 64)
    assert fmt.weight_bytes(64, 10) == 10 * 24
    assert fmt.weight_bytes(65, 1) == 25  # 195 bits -> 25 bytes


def test_dense_fp16_has_no_scales():
    fmt = counting.fp_format(16)
    assert fmt.scale_bytes(4096, 4096) == 0
    assert fmt.total_bytes(4096, 4096) == 2 * 4096 * 4096


def test_tinygemm_scales_and_zeros_take_four_bytes_per_group():
    fmt = counting.quant_format(4, 128, meta_bytes_per_group=4)
    assert fmt.scale_bytes(4096, 1000) == 32 * 1000 * 4


def test_flops_and_io_bytes():
    assert counting.flops(3, 5, 7) == 210
    assert counting.io_bytes(3, 5, 7) == 2 * (21 + 15)


def test_derived_figures_agree():
    nbytes, t, bw = 60_000_000, 40.0, 3.0
    gbps = counting.achieved_gbps(nbytes, t)
    assert gbps == pytest.approx(1500.0)
    assert counting.percent_of_floor(nbytes, t, bw) == pytest.approx(100 * gbps / (bw * 1000))
    assert counting.percent_of_floor(nbytes, counting.floor_us(nbytes, bw), bw) == \
        pytest.approx(100.0)
    assert counting.achieved_tflops(4096, 4096, 4096, 1000.0) == pytest.approx(
        2 * 4096**3 / 1e-3 / 1e12)


def test_bad_formats_and_bandwidth_raise():
    with pytest.raises(BenchError, match="bits=9"):
        counting.quant_format(9, 128)
    with pytest.raises(BenchError, match="group=0"):
        counting.quant_format(4, 0)
    with pytest.raises(BenchError, match="hbm_tbps"):
        counting.floor_us(100, 0.0)
