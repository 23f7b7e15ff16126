"""CPU tests of results' environment, the report, the regression guard and Marlin's absence."""

from __future__ import annotations

import json
import sys

import pytest

from lowvm.bench import (
    BenchError,
    candidates,
    commands,
    compare,
    counting,
    environment,
    marlin_baseline,
    report,
    results,
)
from lowvm.bench.results import load
from lowvm.bench.scenarios import SCENARIOS, Scenario
from lowvm.runtime.timing import summarize

FMT = counting.quant_format(4, 128)


def _doc(us: dict[tuple[str, int], float], scenario: str = "gemm-decode",
         date: str = "2026-12-01T10:00:00+00:00") -> dict:
    rows = [results.measured_row(kernel, "lowvm" if kernel.startswith("lowvm") else
                                 "baseline", "int4", FMT, 4096, 6144, m,
                                 summarize([t] * 30), 3.0, method="graph",
                                 scenario=scenario)
            for (kernel, m), t in us.items()]
    env = environment.collect(["gemm-decode"])
    doc = results.document(rows, gpu="NVIDIA H100 80GB HBM3", date=date,
                           torch_version="2.11", cuda_version="13.0",
                           hbm={"floor_tbps": 3.0}, method={}, environment=env["environment"])
    doc["scenario"] = scenario
    return doc


def test_environment_records_commit_versions_and_command():
    env = environment.collect(["gemm-decode", "--m", "1"])["environment"]
    assert set(env) == set(environment.ENVIRONMENT_KEYS)
    assert env["command"] == "python -m lowvm.bench gemm-decode --m 1"
    assert env["python"] == ".".join(map(str, sys.version_info[:3]))
    assert env["torch"] and env["date"]
    if env["commit"] is not None:  # a git checkout
        assert len(env["commit"]) == 40 and isinstance(env["dirty"], bool)


def test_git_state_outside_a_checkout(tmp_path):
    assert environment.git_state(tmp_path) == (None, None)


def test_results_layout_and_environment_in_the_file(tmp_path):
    doc = _doc({("lowvm_int4_g128", 1): 20.0})
    path = results.write(doc, tmp_path)
    assert path.relative_to(tmp_path).parts == ("2026-12-01", "gemm-decode",
                                                 "nvidia-h100-80gb-hbm3.json")
    saved = json.loads(path.read_text())
    assert saved["environment"]["command"].startswith("python -m lowvm.bench")
    assert saved["rows"][0]["method"] == "graph"
    assert results.gpu_slug("NVIDIA H200") == "nvidia-h200"


def test_outcome_documents_validate_by_their_own_schema(tmp_path):
    doc = {"schema": results.SCHEMA, "kind": "pytest", "scenario": "gpu-suite",
           "date": "2026-12-01", "gpu": "GPU", "ok": True, "rows": []}
    results.validate(doc)
    with pytest.raises(BenchError, match="'ok'"):
        results.validate({k: v for k, v in doc.items() if k != "ok"})


def test_report_writes_tables_between_the_markers_and_keeps_the_prose(tmp_path):
    root = tmp_path / "results"
    results.write(_doc({("lowvm_int4_g128", 1): 20.0}, date="2026-11-30"), root)
    results.write(_doc({("lowvm_int4_g128", 1): 18.0, ("cublas_fp16", 1): 30.0}), root)
    page = tmp_path / "docs" / "performance.md"
    assert report.main(["--results", str(root), "--doc", str(page)]) == 0
    text = page.read_text()
    assert report.BEGIN in text and report.END in text
    assert "python -m lowvm.bench gemm-decode" in text
    assert "| 4096x6144 | 1 | 18.0 | 30.0 |" in text and "20.0" not in text  # newest only
    page.write_text("# Mine\n\nprose\n\n" + text[text.index(report.BEGIN):])
    assert report.main(["--results", str(root), "--doc", str(page)]) == 0
    again = page.read_text()
    assert again.startswith("# Mine\n\nprose") and again.count(report.BEGIN) == 1


def test_report_of_schedules_compares_the_choice_with_the_fastest():
    doc = _doc({("lowvm_int4_g128", 1): 20.0}, scenario="schedules")
    doc["kind"] = "schedules"
    faster = dict(doc["rows"][0], schedule="split=8/x_whole=512", median_us=16.0)
    doc["rows"] = [dict(doc["rows"][0], schedule="chosen"), faster]
    text = report.render_doc(doc)
    assert "split=8/x_whole=512" in text and "| 1.25 |" in text


def test_compare_passes_within_tolerance_and_fails_beyond(tmp_path):
    ref = results.write(_doc({("lowvm_int4_g128", 1): 20.0, ("cublas_fp16", 1): 30.0}),
                        tmp_path / "ref.json")
    ok = results.write(_doc({("lowvm_int4_g128", 1): 21.0, ("cublas_fp16", 1): 29.0}),
                       tmp_path / "ok.json")
    slow = results.write(_doc({("lowvm_int4_g128", 1): 21.6, ("cublas_fp16", 1): 30.0}),
                         tmp_path / "slow.json")
    assert compare.main([str(ok), str(ref), "--tolerance", "0.07"]) == 0
    assert compare.main([str(slow), str(ref), "--tolerance", "0.07"]) == 1
    assert compare.main([str(slow), str(ref), "--tolerance", "0.1"]) == 0


def test_compare_labels_a_median_that_moved_while_the_fastest_runs_did_not(tmp_path, capsys):
    from lowvm.bench.compare import Cell

    ref = _doc({("lowvm_int4_g128", 1): 48.0})
    fresh = _doc({("lowvm_int4_g128", 1): 48.0})
    row = fresh["rows"][0]
    row["median_us"], row["p10_us"] = 55.0, 48.2  # half the runs at 48 us, half at 55
    a, b = results.write(fresh, tmp_path / "fresh.json"), results.write(ref, tmp_path / "r.json")
    assert compare.main([str(a), str(b)]) == 1  # still a failure
    assert "SLOWER (median; p10 +0.4%: runs spread, re-run)" in capsys.readouterr().out
    assert Cell(("k",), 55.0, 48.0, 54.0, 48.0).verdict(0.07) == "SLOWER"
    assert Cell(("k",), 50.0, 48.0, 49.0, 48.0).verdict(0.07) == ""


def test_compare_without_a_reference_takes_the_newest_of_its_scenario_and_gpu(tmp_path,
                                                                              capsys):
    root = tmp_path / "results"
    old = results.write(_doc({("lowvm_int4_g128", 1): 20.0},
                             date="2026-11-20T10:00:00+00:00"), root)
    new = results.write(_doc({("lowvm_int4_g128", 1): 30.0},
                             date="2026-11-25T10:00:00+00:00"), root)
    other = _doc({("lowvm_int4_g128", 1): 99.0}, date="2026-11-26T10:00:00+00:00")
    other["gpu"] = "NVIDIA H200"
    results.write(other, root)
    prefill = _doc({("lowvm_int4_g128", 1): 99.0}, scenario="gemm-prefill",
                   date="2026-11-26T10:00:00+00:00")
    results.write(prefill, root)
    fresh = results.write(_doc({("lowvm_int4_g128", 1): 31.0}), tmp_path / "fresh.json")
    assert compare.newest_reference(load(fresh), fresh, root) == new
    assert compare.main([str(fresh), "--root", str(root)]) == 0  # 31 against 30
    assert f"reference: {new}" in capsys.readouterr().out
    # the newest file itself is left out: it is compared with the one before
    assert compare.newest_reference(load(new), new, root) == old
    assert compare.main([str(new), "--root", str(root)]) == 1  # 30 against 20
    with pytest.raises(BenchError, match="no reference for scenario 'gemm-decode'"):
        compare.newest_reference(load(fresh), fresh, tmp_path / "empty")
    assert compare.main([str(fresh), "--root", str(tmp_path / "empty")]) == 1
    assert "pass the reference file" in capsys.readouterr().err


def test_compare_refuses_files_with_nothing_in_common(tmp_path, capsys):
    a = results.write(_doc({("lowvm_int4_g128", 1): 20.0}), tmp_path / "a.json")
    b = results.write(_doc({("lowvm_int4_g128", 16): 20.0}), tmp_path / "b.json")
    assert compare.main([str(a), str(b)]) == 1
    assert "no measured cell" in capsys.readouterr().err
    c = results.write(_doc({("lowvm_int4_g128", 1): 20.0}, scenario="types"),
                      tmp_path / "c.json")
    assert compare.main([str(a), str(c)]) == 1


def test_compare_goes_through_the_bench_command(tmp_path):
    from lowvm.bench import cli

    ref = results.write(_doc({("lowvm_int4_g128", 1): 20.0}), tmp_path / "ref.json")
    assert cli.main(["compare", str(ref), str(ref), "--tolerance", "0.07"]) == 0


def test_marlin_missing_is_a_reason_not_a_failure(monkeypatch):
    monkeypatch.setitem(sys.modules, "marlin", None)  # import marlin raises ImportError
    monkeypatch.delenv(marlin_baseline.SOURCE_ENV, raising=False)
    with pytest.raises(marlin_baseline.MarlinUnavailable, match="MARLIN_SRC is not set"):
        marlin_baseline.load()
    notes = candidates.probe_optional(("marlin",))
    assert notes == [notes[0]] and notes[0].startswith("marlin: not available: ")


def test_marlin_source_folder_must_hold_its_files(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "marlin", None)
    monkeypatch.setenv(marlin_baseline.SOURCE_ENV, str(tmp_path))
    with pytest.raises(marlin_baseline.MarlinUnavailable, match="marlin_cuda.cpp"):
        marlin_baseline.load()


def test_marlin_rows_are_skipped_with_the_reason(monkeypatch):
    import torch

    monkeypatch.setitem(sys.modules, "marlin", None)
    monkeypatch.delenv(marlin_baseline.SOURCE_ENV, raising=False)
    ready, missing = candidates.build_candidates(torch.zeros(256, 128, dtype=torch.float16),
                                                 (), (128,), (), with_lowvm=False,
                                                 optional=("marlin",))
    assert ready == [] and len(missing) == 1
    assert missing[0].kernel == "marlin_int4_g128" and missing[0].status == "skipped"
    assert missing[0].note.startswith("not available: ")


def test_marlin_build_folder_follows_the_sources(tmp_path):
    a, b = tmp_path / "a.cu", tmp_path / "b.cpp"
    a.write_text("x")
    b.write_text("y")
    first = marlin_baseline.build_dir((a, b), tmp_path / "cache")
    assert marlin_baseline.build_dir((a, b), tmp_path / "cache") == first
    a.write_text("changed")
    assert marlin_baseline.build_dir((a, b), tmp_path / "cache") != first


def test_junit_and_sanitizer_summaries():
    xml = ('<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1" '
           'time="2.5"><testcase classname="tests.t" name="a"/><testcase classname="tests.t"'
           ' name="b"><failure message="boom"/></testcase></testsuite></testsuites>')
    totals, problems = commands.parse_junit(xml)
    assert totals == {"tests": 3, "failures": 1, "errors": 0, "skipped": 1, "seconds": 2.5,
                      "passed": 1}
    assert problems == [{"test": "tests.t::b", "outcome": "failure", "message": "boom"}]
    with pytest.raises(BenchError, match="not XML"):
        commands.parse_junit("<")
    text = "...\n========= ERROR SUMMARY: 0 errors\n"
    assert commands.sanitizer_summary(text)["count"] == 0
    assert commands.sanitizer_summary("========= RACECHECK SUMMARY: 2 hazards displayed"
                                      )["count"] == 2
    assert commands.sanitizer_summary("crashed")["count"] is None


def test_serving_command_is_expanded_with_the_interpreter_and_scratch_folder(tmp_path):
    cmd = commands.expand(SCENARIOS["serving-loop"].command, tmp_path)
    assert cmd[0] == sys.executable and cmd[1:3] == ["-m", "lowvm.serving"]
    assert cmd[-2:] == ["--json", f"{tmp_path}/serving.json"]


def test_lowvm_commit_names_the_code_of_a_copied_tree(monkeypatch):
    monkeypatch.setenv(environment.COMMIT_VARIABLE, "abc1234")
    env = environment.collect(["gemm-decode"])["environment"]
    assert (env["commit"], env["commit_source"], env["dirty"]) == ("abc1234", "LOWVM_COMMIT",
                                                                   None)
    monkeypatch.delenv(environment.COMMIT_VARIABLE)
    assert environment.collect(["gemm-decode"])["environment"]["commit_source"] == "git"


def test_reproducing_command_drops_where_the_run_wrote():
    assert (report.reproducing_command("python -m lowvm.bench gemm-decode --out /x/y.json "
                                       "--m 1") == "python -m lowvm.bench gemm-decode --m 1")
    assert (report.reproducing_command("python -m lowvm.bench types --out=/x")
            == "python -m lowvm.bench types")


def _serving_doc() -> dict:
    speed = [{"model": model, "batch": 1, "mode": "loop", "decode_tokens_per_s": tps,
              "forward_ms": ms} for model, tps, ms in (("float16", 100.0, 7.0),
                                                        ("int4", 260.0, 2.7))]
    run = {"speed": speed, "models": {"int4": {
        "weight_bytes": {"stored": 5 * 2**30},
        "quality": {"layer_rel_error_median": 0.117}}}}
    return {"schema": results.SCHEMA, "date": "2026-12-01", "gpu": "NVIDIA H100 80GB HBM3",
            "scenario": "serving-loop", "kind": "serving", "ok": True, "rows": [run],
            "environment": {"command": "python -m lowvm.bench serving-loop --out /tmp/s"}}


def test_summary_takes_marlin_cublas_and_the_serving_speed_up(tmp_path):
    gemm = _doc({("lowvm_int4_g128", 1): 9.0, ("marlin_int4_g128", 1): 11.0,
                 ("cublas_fp16", 1): 21.0, ("lowvm_int4_g128", 64): 30.0})
    paths = []
    for doc in (gemm, _serving_doc()):
        path = tmp_path / f"{doc['scenario']}.json"
        path.write_text(json.dumps(doc))
        paths.append(path)
    text = report.summary(report.load_all(paths))
    assert "| 4096x6144 | 1 | 9.0 | 11.0 | 21.0 |" in text
    assert "| 64 |" not in text  # only M = 1 and 16
    assert "| int4 | 1 | loop | 260.0 | 2.60 | 2.7 | 5120 | 0.117 |" in text
    assert "float16 | 1" not in text
    assert "--out" not in text


def test_report_fills_the_readme_summary_only_where_it_has_markers(tmp_path):
    root = tmp_path / "results" / "2026-12-01" / "serving-loop"
    root.mkdir(parents=True)
    (root / "gpu.json").write_text(json.dumps(_serving_doc()))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.SUMMARY_BEGIN}\nold\n{report.SUMMARY_END}\nrest\n")
    doc = tmp_path / "performance.md"
    assert report.main(["--results", str(tmp_path / "results"), "--doc", str(doc),
                        "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert "old" not in text and "2.60" in text and text.endswith("rest\n")
    plain = tmp_path / "PLAIN.md"
    plain.write_text("no markers\n")
    assert report.main(["--results", str(tmp_path / "results"), "--doc", str(doc),
                        "--readme", str(plain)]) == 0
    assert plain.read_text() == "no markers\n"


def test_a_report_written_elsewhere_leaves_the_checkouts_readme_alone(tmp_path, monkeypatch):
    root = tmp_path / "results" / "2026-12-01" / "serving-loop"
    root.mkdir(parents=True)
    (root / "gpu.json").write_text(json.dumps(_serving_doc()))
    monkeypatch.chdir(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"{report.SUMMARY_BEGIN}\nold\n{report.SUMMARY_END}\n")
    assert report.main(["--results", "results", "--doc", "elsewhere.md"]) == 0
    assert "old" in readme.read_text()


def test_a_json_scenario_fails_when_its_command_reports_not_ok(tmp_path, monkeypatch):
    from lowvm.bench import commands

    sc = Scenario("probe", "json", "writes result.json",
                  command=("{python}", "-c", "import json, sys; json.dump({'ok': False, "
                           "'programs': 3, 'rows': [{'a': 1}]}, open(sys.argv[1], 'w'))",
                           "{out}/result.json"))
    ok, rows, extra = commands._json(sc, tmp_path)
    assert not ok and rows == [{"a": 1}] and extra["summary"] == {"ok": False, "programs": 3}


def _quality_doc() -> dict:
    rows = [{"variant": "float16", "dtype": "float16", "method": None, "bits_per_weight": 16.0,
             "perplexity": 2.5, "increase_vs_fp16": 0.0},
            {"variant": "int4 g128 rtn", "dtype": "int4", "method": "rtn",
             "bits_per_weight": 4.125, "perplexity": 2.6, "increase_vs_fp16": 0.04,
             "layer_rel_error_median": 0.0812, "top1_agreement": 0.97},
            {"variant": "int2 g128 gptq", "dtype": "int2", "method": "gptq",
             "error": "QuantizationError: a|b"}]
    model = {"layers": 8, "hidden": 512, "parameters": 24_117_248, "train_seconds": 180.2,
             "steps": 5000, "train_loss": 0.91, "device": "NVIDIA H100", "seq_len": 512,
             "heldout_sequences": 512, "corpus": {"python": "3.12.3", "heldout_files": 90}}
    return {"schema": results.SCHEMA, "kind": "json", "scenario": "quality",
            "date": "2026-12-01", "gpu": "NVIDIA H100", "ok": False, "rows": rows,
            "summary": {"ok": False, "finished": True, "model": model},
            "environment": {"command": "python -m lowvm.bench quality --out /tmp/q"}}


def test_report_renders_a_quality_document_as_a_perplexity_table(tmp_path):
    root = tmp_path / "results" / "2026-12-01" / "quality"
    root.mkdir(parents=True)
    (root / "gpu.json").write_text(json.dumps(_quality_doc()))
    page = tmp_path / "performance.md"
    assert report.main(["--results", str(tmp_path / "results"), "--doc", str(page)]) == 0
    text = page.read_text()
    assert "python -m lowvm.bench quality\n" in text and "Outcome: **failed**" in text
    assert "24.1 M parameters" in text and "5000 steps" in text and "Python 3.12.3" in text
    assert "| variant | types | method | bits / weight | perplexity / byte |" in text
    assert "| float16 | float16 |  | 16.000 | 2.5000 | +0.00 % |  |  |  |" in text
    assert "| int4 g128 rtn | int4 | rtn | 4.125 | 2.6000 | +4.00 % | 0.0812 | 0.9700 |  |" in text
    assert "| int2 g128 gptq | int2 | gptq |  |  |  |  |  | QuantizationError: a/b |" in text


def test_a_load_memory_document_renders_peak_against_goal():
    from lowvm.bench.report import render_doc

    mib = 2**20
    row = {"device": "cuda", "case": "int4 on load", "peak_mib": 705.0, "model_mib": 503.0,
           "goal_mib": 753.0, "within_goal": True, "cpu_hwm_before_bytes": 900 * mib,
           "cpu_hwm_used_bytes": 2400 * mib, "seconds": 0.5}
    doc = {"kind": "json", "scenario": "load-memory", "ok": True, "rows": [row],
           "summary": {"checkpoint": {"bytes": 1230 * mib, "largest_dense_bytes": 125 * mib}}}
    text = render_doc(doc)
    assert "| cuda | int4 on load | 705 | 503 | 753 | yes | 900 | 2400 | 0.5 |  |" in text
    assert "1230 MiB" in text and "python -m lowvm.bench load-memory" in text


def test_a_tensor_parallel_document_renders_ratios_and_goals():
    from lowvm.bench.report import render_doc
    from lowvm.serving.tp_scaling import summarise

    rows = [{"dtype": "int4", "tp": 1, "batch": 1, "tok_s": 40.0, "step_ms": 25.0,
             "mem_gib_per_gpu": 36.5, "allreduce_ms_per_step": None, "allreduces_per_step": 0},
            {"dtype": "int4", "tp": 2, "batch": 1, "tok_s": 70.0, "step_ms": 14.3,
             "mem_gib_per_gpu": 18.6, "allreduce_ms_per_step": 1.25,
             "allreduce_graph_ms_per_step": 0.5, "allreduces_per_step": 160},
            {"dtype": "float16", "tp": 2, "batch": 1, "tok_s": 20.0, "step_ms": 50.0,
             "mem_gib_per_gpu": 66.0, "allreduce_ms_per_step": 1.5, "allreduces_per_step": 160},
            {"dtype": "float16", "tp": 1, "batch": 1, "skipped": "131.4 GiB do not fit"}]
    doc = {"kind": "json", "scenario": "tensor-parallel", "ok": True, "rows": rows,
           "summary": {**summarise(rows), "shape": {"hidden": 8192, "layers": 80}}}
    text = render_doc(doc)
    assert "python -m lowvm.bench tensor-parallel" in text and "hidden 8192" in text
    assert "| int4 | 2 | 1 | 70.0 | 14.30 | 1.75 | 3.50 | 18.6 | 0.500 | 1.250 | 160 |  |" in text
    assert "| float16 | 1 | 1 |  |  |  |  |  |  |  |  | 131.4 GiB do not fit |" in text
    assert "int4_tp2_over_tp1_batch1 1.75 (target 1.7: met)" in text
    assert "int4_over_float16 3.50 (target 2.5: met)" in text
    # 25 = X + Y, 14.3 - 0.5 = X + Y / 2: Y = 22.4, X = 2.6
    assert "X = 2.60 ms that does not shrink with TP, Y = 22.40 ms that does." in text


def test_a_profile_document_renders_the_counters_and_what_was_not_profiled():
    from lowvm.bench.report import render_doc

    row = {"shape": "4096x28672", "m": 1, "kernel": "lowvm_int4_g128", "time_us": 26.66,
           "dram_pct": 70.5, "dram_tbps": 2.36, "sm_pct": 25.7, "top_pipe": "alu 26%",
           "occupancy_pct": 21.1, "registers": 84, "grid": 448,
           "top_stalls": "long_scoreboard 7.1, wait 1.1"}
    doc = {"kind": "json", "scenario": "profile", "ok": True, "rows": [row],
           "skipped": [{"kernel": "marlin_int4_g128", "shape": "4096x28672",
                        "note": "not available: MARLIN_SRC not set"}]}
    text = render_doc(doc)
    assert "python -m lowvm.bench profile" in text
    assert ("| 4096x28672 | 1 | lowvm_int4_g128 | 26.7 | 70.5 | 2.36 | 25.7 | alu 26% | 21.1 "
            "| 84 | 448 | long_scoreboard 7.1, wait 1.1 |") in text
    assert "Not profiled: marlin_int4_g128 at 4096x28672 (not available" in text


def test_lowvm_types_float16_cannot_hold_are_timed_on_bfloat16_activations():
    import torch

    from lowvm.dtypes import dtype

    weight = torch.randn(128, 256).to(torch.float16)
    ready, missing = candidates.build_candidates(
        weight, (dtype("int4"), dtype("float7_e5m1"), dtype("float8_e6m1")), (128,), ())
    assert missing == []
    acts = {c.wtype: (c.act_dtype, c.tol) for c in ready}
    assert acts["int4"] == (torch.float16, candidates.TOL_FP16)
    assert acts["float7_e5m1"] == acts["float8_e6m1"] == (torch.bfloat16, candidates.TOL_BF16)
