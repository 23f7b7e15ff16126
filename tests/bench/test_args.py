"""CPU tests of the benchmark's command line: shapes, M, dtypes, groups, the plan."""

from __future__ import annotations

import pytest

import lowvm
from lowvm.bench import BenchError, cli
from lowvm.bench.shapes import (
    LLAMA_SHAPES,
    Shape,
    parse_dtypes,
    parse_groups,
    parse_int_list,
    parse_shape,
    parse_shapes,
)


def test_parse_shape_accepts_comma_and_x():
    assert parse_shape("4096,6144") == Shape(4096, 6144)
    assert parse_shape("14336x4096") == Shape(14336, 4096)


@pytest.mark.parametrize("text", ["4096", "a,b", "0,16", "-4,8", "1,2,3"])
def test_parse_shape_rejects_bad_text(text):
    with pytest.raises(BenchError, match="--shape"):
        parse_shape(text)


def test_parse_shapes_default_is_the_five_llama_shapes():
    assert parse_shapes(None) == LLAMA_SHAPES
    assert [(s.k, s.n) for s in LLAMA_SHAPES] == [
        (4096, 6144), (4096, 28672), (14336, 4096), (8192, 10240), (28672, 8192)]


def test_parse_shapes_collects_repeats_and_llama_keyword():
    assert parse_shapes(["64,128;256x512", "64,128"]) == (Shape(64, 128), Shape(256, 512))
    assert parse_shapes(["llama", "512,512"])[-1] == Shape(512, 512)
    assert len(parse_shapes(["llama"])) == 5


def test_parse_int_list_and_errors():
    assert parse_int_list("1, 4,16,4", "--m") == (1, 4, 16)
    with pytest.raises(BenchError, match="--m"):
        parse_int_list("1,x", "--m")
    with pytest.raises(BenchError, match="no"):
        parse_int_list(",", "--m")


def test_parse_dtypes_gives_lowvm_types_and_rejects_wide_or_unknown():
    assert parse_dtypes("int4,int3,e3m2") == (lowvm.int4, lowvm.int3, lowvm.float6_e3m2)
    with pytest.raises(BenchError, match="1 to 8 bits"):
        parse_dtypes("float16")
    with pytest.raises(BenchError, match="'int9'"):
        parse_dtypes("int9")


def test_parse_groups_needs_multiples_of_16():
    assert parse_groups("64,128") == (64, 128)
    with pytest.raises(BenchError, match="multiple of 16"):
        parse_groups("100")


def test_defaults_of_the_command_line():
    cfg, opts = cli.parse_config([])
    assert cfg.shapes == LLAMA_SHAPES
    assert cfg.ms == (1, 4, 16, 64, 256, 4096)
    assert cfg.dtypes == (lowvm.int4,)
    assert cfg.groups == (128,)
    assert cfg.baselines == ("cublas_fp16", "cublas_bf16", "tinygemm")
    assert set(cfg.optional) == {"marlin_vllm", "marlin_sgl", "gemlite", "marlin"}
    assert cfg.runs >= 30 and cfg.with_lowvm and cfg.measure_hbm
    assert opts.anchors is None and opts.out == "benchmarks/results/"


def test_options_reach_the_config():
    cfg, opts = cli.parse_config(["--shape", "512,256", "--m", "1,16", "--dtype", "int3,e2m1",
                                  "--group", "64", "--baselines", "cublas_fp16,gemlite",
                                  "--no-lowvm", "--hbm-tbps", "3.0", "--anchors"])
    assert cfg.shapes == (Shape(512, 256),) and cfg.ms == (1, 16)
    assert [d.name for d in cfg.dtypes] == ["int3", "float4_e2m1"]
    assert cfg.groups == (64,) and cfg.baselines == ("cublas_fp16",)
    assert cfg.optional == ("gemlite",) and not cfg.with_lowvm and cfg.hbm_tbps == 3.0
    assert opts.anchors == "auto"
    assert cli.parse_config(["--baselines", "none"])[0].baselines == ()


@pytest.mark.parametrize("argv, needle", [
    (["--m", "0"], "--m"),
    (["--dtype", "int9"], "--dtype"),
    (["--group", "100"], "--group"),
    (["--shape", "1,2,3"], "--shape"),
    (["--baselines", "cutlass"], "cutlass"),
    (["--hbm-tbps", "-1"], "--hbm-tbps"),
])
def test_bad_options_exit_with_a_message(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_config(argv)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_list_prints_the_plan_without_a_gpu(capsys):
    assert cli.main(["--list", "--shape", "4096,6144", "--m", "1,16", "--dtype", "int4,int3",
                     "--group", "64,128", "--baselines", "cublas_fp16,tinygemm"]) == 0
    out = capsys.readouterr().out
    for name in ("lowvm_int4_g64", "lowvm_int3_g128", "cublas_fp16", "tinygemm_int4_g64",
                 "tinygemm_int4_g128"):
        assert name in out
    assert "cublas_bf16" not in out
    assert "rows: 14" in out  # 1 shape x 2 M x (4 lowvm + 1 cuBLAS + 2 tinygemm)


def test_run_without_cuda_fails_cleanly(monkeypatch, capsys, tmp_path):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["--shape", "64,64", "--m", "1", "--out", str(tmp_path)]) == 1
    assert "no CUDA device" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
