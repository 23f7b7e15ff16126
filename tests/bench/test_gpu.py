"""GPU tests of the benchmark harness: timing, bandwidth, adapters, a small full run."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_time_cuda_and_hbm_bandwidth_are_plausible():
    import torch

    from lowvm.runtime.timing import L2Flusher, measure_hbm, time_cuda

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
    small = time_cuda(lambda: a[:64] @ a[:64].t(), runs=30, flush=L2Flusher())
    big = time_cuda(lambda: a @ a, runs=30, flush=L2Flusher())
    assert 0 < small.min_us <= small.median_us <= small.p90_us
    assert big.median_us > small.median_us
    bw = measure_hbm(nbytes=1 << 30)
    assert 0.5 < bw.read_tbps < 10 and 0.5 < bw.copy_tbps < 10


@pytest.mark.parametrize("wtype", ["int4", "int3"])
def test_lowvm_entry_matches_its_dequantised_weight(wtype):
    import torch

    from lowvm.bench import lowvm_entry

    w = (torch.randn(256, 512, device="cuda") / 20).to(torch.float16)
    prep = lowvm_entry.prepare(w, wtype, 128)
    x = torch.randn(7, 512, device="cuda", dtype=torch.float16)
    y = lowvm_entry.run(prep, x)
    ref = x.double() @ lowvm_entry.dequantized(prep).double().t()
    assert y.shape == (7, 256) and y.dtype == torch.float16
    assert (torch.linalg.vector_norm(y.double() - ref) / torch.linalg.vector_norm(ref)) < 3e-3


def test_tinygemm_on_cuda_matches_its_dequantised_weight():
    import torch

    from lowvm.bench import tinygemm

    w = torch.randn(256, 1024, device="cuda")
    tg = tinygemm.prepare(w, 128)
    x = torch.randn(5, 1024, device="cuda", dtype=torch.bfloat16)
    y = tinygemm.run(tg, x).double()
    ref = x.double() @ tinygemm.dequantize(tg.codes, tg.scales_and_zeros, 128).t()
    assert (torch.linalg.vector_norm(y - ref) / torch.linalg.vector_norm(ref)) < 1.6e-2


def test_a_small_run_measures_every_kernel_and_writes_valid_json(tmp_path, capsys):
    from lowvm.bench import cli, results

    out = tmp_path / "r.json"
    # the default baselines, less the optional ones (GemLite where it imports): their own
    # GPU tests cover them, and this set must not depend on what the machine has
    rc = cli.main(["--shape", "1024,512", "--m", "1,16,64", "--dtype", "int4,int3",
                   "--group", "128", "--max-run-ms", "5000", "--out", str(out), "--anchors",
                   "--baselines", "cublas_fp16,cublas_bf16,tinygemm"])
    assert rc == 0
    doc = results.load(out)
    kernels = {r["kernel"] for r in doc["rows"]}
    assert kernels == {"lowvm_int4_g128", "lowvm_int3_g128", "cublas_fp16", "cublas_bf16",
                       "tinygemm_int4_g128"}
    assert len(doc["rows"]) == 15
    bad = [r for r in doc["rows"] if r["status"] != "ok"]
    assert not bad, bad
    assert all(r["rel_err"] is not None and r["pct_floor"] > 0 for r in doc["rows"])
    assert doc["hbm"]["read_tbps"] > 0.5 and doc["gpu"]
    text = capsys.readouterr().out
    assert "lowvm_int3_g128" in text and "recorded 2026-11-22" in text


def test_graph_eager_and_read_flushed_timings_are_plausible():
    import torch

    from lowvm.runtime.timing import time_eager, time_flushed, time_graph

    ws = [torch.randn(4096, 4096, device="cuda", dtype=torch.float16) for _ in range(8)]
    x = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    calls = [lambda w=w: x @ w.t() for w in ws]
    graph = time_graph(calls)
    eager = time_eager(calls)
    read = time_flushed(calls[0], "read-flushed")
    assert graph.runs >= 15 and 0 < graph.median_us < 1000
    assert 0 < eager.median_us < 1000 and 0 < read.median_us < 1000


def test_a_scenario_run_times_every_method_and_writes_the_layout(tmp_path, capsys):
    from lowvm.bench import cli, results

    rc = cli.main(["gemm-decode", "--shape", "1024,512", "--m", "1,16", "--baselines",
                   "cublas_fp16,tinygemm,marlin", "--methods",
                   "graph,eager,read-flushed,write-flushed", "--out", str(tmp_path)])
    assert rc == 0
    (path,) = tmp_path.glob("*/gemm-decode/*.json")
    doc = results.load(path)
    assert doc["environment"]["gpu"] and doc["environment"]["command"]
    ok = [r for r in doc["rows"] if r["status"] == "ok"]
    assert {r["method"] for r in ok} == {"graph", "eager", "read-flushed", "write-flushed"}
    assert all(r["copies"] >= 2 for r in ok if r["method"] in ("graph", "eager"))
    marlin = [r for r in doc["rows"] if r["kernel"] == "marlin_int4_g128"]
    assert marlin and all(r["status"] == "ok" or r["note"] for r in marlin)
    assert "results:" in capsys.readouterr().out


def test_schedules_scenario_times_the_choice_and_its_neighbours(tmp_path):
    from lowvm.bench import cli, results

    rc = cli.main(["schedules", "--shape", "4096,6144", "--m", "1", "--dtype", "int4",
                   "--neighbours", "2", "--out", str(tmp_path)])
    assert rc == 0
    (path,) = tmp_path.glob("*/schedules/*.json")
    doc = results.load(path)
    specs = [r["schedule"] for r in doc["rows"]]
    assert specs[0] == "chosen" and len(specs) == 3
    assert all(r["status"] == "ok" for r in doc["rows"]), doc["rows"]
