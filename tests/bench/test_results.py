"""CPU tests of result rows, the JSON schema, timing statistics, table and anchors."""

from __future__ import annotations

import json

import pytest

from lowvm.bench import BenchError, counting, results, table
from lowvm.bench.anchors import default_anchor_path, load_anchors
from lowvm.runtime.timing import TimingError, summarize

FMT = counting.quant_format(4, 128)


def _doc(rows):
    return results.document(rows, gpu="NVIDIA H100 80GB HBM3", date="2026-11-24T10:00:00+00:00",
                            torch_version="2.11.0", cuda_version="13.0",
                            hbm={"read_tbps": 3.0, "floor_tbps": 3.0,
                                 "floor_source": "measured read bandwidth"},
                            method={"runs": 30})


def _rows():
    t = summarize([float(v) for v in range(20, 51)])
    ok = results.measured_row("lowvm_int4_g128", "lowvm", "int4", FMT, 4096, 6144, 1, t, 3.0,
                              rel_err=1e-3)
    failed = results.unmeasured_row("cublas_fp16", "baseline", "fp16", counting.fp_format(),
                                    4096, 6144, 1, "failed", "relative error 1e-1 > 3e-3", 3.0)
    return ok, failed


def test_summarize_median_and_percentiles():
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (t.median_us, t.min_us, t.runs) == (3.0, 1.0, 5)
    assert t.p10_us <= t.median_us <= t.p90_us
    assert summarize([7.0, 1.0]).median_us == 4.0
    with pytest.raises(TimingError):
        summarize([])


def test_measured_row_derives_every_figure_from_the_median():
    ok, _ = _rows()
    assert ok.status == "ok" and ok.median_us == 35.0 and ok.runs == 31
    assert ok.weight_bytes == FMT.total_bytes(4096, 6144)
    assert ok.gbps == pytest.approx(ok.weight_bytes / 35e-6 / 1e9)
    assert ok.tflops == pytest.approx(2 * 6144 * 4096 / 35e-6 / 1e12)
    assert ok.floor_us == pytest.approx(ok.weight_bytes / 3e12 * 1e6)
    assert ok.pct_floor == pytest.approx(100 * ok.floor_us / 35.0)


def test_unmeasured_rows_must_say_why():
    _, failed = _rows()
    assert failed.median_us is None and failed.floor_us > 0
    with pytest.raises(BenchError, match="note"):
        results.unmeasured_row("x", "baseline", "fp16", FMT, 64, 64, 1, "skipped", "", 3.0)
    with pytest.raises(BenchError, match="status"):
        results.unmeasured_row("x", "baseline", "fp16", FMT, 64, 64, 1, "ok", "why", 3.0)


def test_document_has_the_required_keys_and_validates():
    doc = _doc(list(_rows()))
    results.validate(doc)
    for key in ("gpu", "date", "torch", "cuda", "hbm", "rows"):
        assert key in doc
    assert doc["schema"] == results.SCHEMA and len(doc["rows"]) == 2
    json.dumps(doc)  # plain JSON


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d.pop("gpu"), "'gpu'"),
    (lambda d: d["rows"][0].update(status="great"), "status"),
    (lambda d: d["rows"][0].update(median_us=None), "no median_us"),
    (lambda d: d["rows"][1].update(note=""), "no note"),
    (lambda d: d["rows"][0].update(k="4096"), "rows[0].k"),
    (lambda d: d["rows"][0].pop("pct_floor"), "lacks"),
    (lambda d: d.update(hbm={}), "floor_tbps"),
])
def test_validate_names_each_problem(mutate, needle):
    doc = _doc(list(_rows()))
    mutate(doc)
    with pytest.raises(BenchError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        results.validate(doc)


def test_write_to_a_folder_uses_the_results_layout_and_round_trips(tmp_path):
    doc = _doc(list(_rows()))
    doc["scenario"] = "gemm-decode"
    path = results.write(doc, tmp_path)
    assert path == tmp_path / "2026-11-24" / "gemm-decode" / "nvidia-h100-80gb-hbm3.json"
    assert path.name == results.default_filename(doc)
    assert results.load(path) == doc
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


def test_write_refuses_an_invalid_document_and_leaves_the_old_file(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old")
    bad = _doc(list(_rows()))
    bad["rows"][0]["status"] = "?"
    with pytest.raises(BenchError):
        results.write(bad, target)
    assert target.read_text() == "old"


def test_load_errors(tmp_path):
    with pytest.raises(BenchError, match="does not exist"):
        results.load(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(BenchError, match="not JSON"):
        results.load(tmp_path / "bad.json")


def test_table_shows_figures_and_failure_notes():
    doc = _doc(list(_rows()))
    text = table.format_rows(doc["rows"])
    lines = text.splitlines()
    assert "% HBM floor" in lines[0]
    assert "lowvm_int4_g128" in lines[2] and "35.0" in lines[2]  # lowvm first
    assert "failed: relative error" in lines[3]
    assert f"{doc['rows'][0]['pct_floor']:.1f}" in lines[2]


def test_hbm_line_says_what_the_floor_uses():
    line = table.format_hbm({"copy_tbps": 2.9, "read_tbps": 3.01, "floor_tbps": 3.01,
                             "floor_source": "measured read bandwidth"})
    assert "copy 2.90" in line and "read 3.01" in line and "floor uses 3.01" in line


def test_anchors_load_with_their_date_and_are_labelled(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"gpu": "H100", "date": "2026-11-22", "method": "m"}\n'
                    '{"kernel": "marlin_int4_g128", "k": 4096, "n": 6144, "m": 1, '
                    '"median_us": 14.96}\n'
                    '{"kernel": "marlin_int4_g128", "k": 4096, "n": 6144, "m": 16, '
                    '"median_us": 15.3}\n')
    anchors = load_anchors(path)
    assert anchors.label == "recorded 2026-11-22"
    assert [a.median_us for a in anchors.matching(4096, 6144, 16)] == [15.3]
    text = table.format_anchors(anchors, [(4096, 6144, 1)])
    assert "recorded 2026-11-22" in text and "NOT measured" in text
    assert "15.0" in text and "15.3" not in text


def test_bad_anchor_files(tmp_path):
    with pytest.raises(BenchError, match="no anchor file"):
        load_anchors(tmp_path / "missing.jsonl")
    (tmp_path / "a.jsonl").write_text('{"kernel": "x", "k": 1, "n": 1, "m": 1, "median_us": 1}\n')
    with pytest.raises(BenchError, match="recording date"):
        load_anchors(tmp_path / "a.jsonl")
    (tmp_path / "b.jsonl").write_text('{"date": "d"}\n{"kernel": "x"}\n')
    with pytest.raises(BenchError, match=":2"):
        load_anchors(tmp_path / "b.jsonl")


def test_the_repository_copy_of_the_anchors_loads():
    path = default_anchor_path()
    if path is None:
        pytest.skip("run from the repository root to find benchmarks/anchors-h100.jsonl")
    anchors = load_anchors(path)
    assert anchors.date == "2026-11-22"
    assert {a.kernel for a in anchors.matching(4096, 28672, 1)} >= {
        "marlin_int4_g128", "cublas_fp16", "tinygemm_int4_g128"}
