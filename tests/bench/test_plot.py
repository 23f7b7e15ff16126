"""CPU tests of the plot step: its data preparation always, the PNG where matplotlib is."""

from __future__ import annotations

import builtins
import importlib.util

import pytest

from lowvm.bench import counting, plot, results
from lowvm.runtime.timing import summarize


def _doc():
    fmt, fp = counting.quant_format(4, 128), counting.fp_format()
    rows = []
    for m, t in ((1, 10.0), (16, 12.0), (4096, 900.0)):
        timing = summarize([t] * 30)
        rows.append(results.measured_row("lowvm_int4_g128", "lowvm", "int4", fmt, 4096, 6144,
                                         m, timing, 3.0))
        rows.append(results.measured_row("cublas_fp16", "baseline", "fp16", fp, 4096, 6144, m,
                                         summarize([2 * t] * 30), 3.0))
    rows.append(results.unmeasured_row("tinygemm_int4_g128", "baseline", "int4", fmt, 4096,
                                       6144, 1, "failed", "broke", 3.0))
    return results.document(rows, gpu="GPU", date="2026-11-24", torch_version="2.11",
                            cuda_version="13.0", hbm={"read_tbps": 3.0, "floor_tbps": 3.0},
                            method={})


def test_plot_data_splits_decode_and_prefill_and_drops_unmeasured_rows():
    data = plot.plot_data(_doc())
    assert data.decode.categories == ["4096x6144\nM=1", "4096x6144\nM=16"]
    assert data.prefill.categories == ["4096x6144\nM=4096"]
    assert list(data.decode.values) == ["lowvm_int4_g128", "cublas_fp16"]  # lowvm first
    assert "tinygemm_int4_g128" not in data.decode.values
    gbps = data.decode.values["lowvm_int4_g128"]
    assert gbps[0] == pytest.approx(counting.quant_format(4, 128).total_bytes(4096, 6144)
                                    / 10e-6 / 1e9)
    assert gbps[0] > gbps[1]  # 10 us beats 12 us on the same bytes
    assert data.prefill.values["cublas_fp16"][0] == pytest.approx(
        counting.achieved_tflops(4096, 6144, 4096, 1800.0))
    assert data.ceiling_gbps == pytest.approx(3000.0)


def test_missing_matplotlib_is_reported_plainly(tmp_path, monkeypatch, capsys):
    path = results.write(_doc(), tmp_path / "r.json")
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert plot.main([str(path)]) == 1
    assert "matplotlib is not installed" in capsys.readouterr().err
    assert not (tmp_path / "r.png").exists()


def test_plot_rejects_a_file_that_is_not_results(tmp_path, capsys):
    (tmp_path / "x.json").write_text('{"rows": []}')
    assert plot.main([str(tmp_path / "x.json")]) == 1
    assert "schema" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                    reason="matplotlib is not installed here; the data step is tested above")
def test_plot_writes_a_png(tmp_path):
    path = results.write(_doc(), tmp_path / "r.json")
    assert plot.main([str(path)]) == 0
    png = tmp_path / "r.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
