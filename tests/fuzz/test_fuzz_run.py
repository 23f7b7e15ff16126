"""Bounded seeded fuzz runs: the interpreter against the numpy reference on 60 programs,
6 of them compiled by ptxas for sm_80 and sm_90; the command line and its JSON."""

from __future__ import annotations

import json
import shutil

import pytest

from lowvm.fuzz import check
from lowvm.fuzz.__main__ import main
from lowvm.fuzz.run import FuzzConfig, run, summary_table

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def _failures(result):
    return "\n".join(f"#{r['index']} {r['stage']}: {r['message']}\n  {json.dumps(r['spec'])}"
                     for r in result["rows"])


def test_interpreter_matches_reference_on_60_programs():
    result = run(FuzzConfig(programs=60, seed=2024, ptxas_every=0), log=lambda _: None)
    assert result["programs"] == 60 and result["structures"] == 60
    assert result["ok"], _failures(result)
    families = {k for k in result["by_feature"] if k.startswith("family:")}
    assert families == {"family:tile", "family:loop", "family:dot"}
    assert "mismatches 0, errors 0" in summary_table(result)


@pytest.mark.slow
@needs_nvcc
def test_six_programs_compile_with_ptxas_for_sm80_and_sm90():
    result = run(FuzzConfig(programs=6, seed=77, ptxas_every=1), log=lambda _: None)
    assert result["ptxas_compiled"] == 6 and result["ptxas_archs"] == ["sm_80", "sm_90"]
    assert result["ok"], _failures(result)


def test_cli_writes_the_result_json(tmp_path, capsys):
    out = tmp_path / "result.json"
    assert main(["--programs", "4", "--seed", "3", "--workers", "1", "--ptxas-every", "0",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"ok", "programs", "mismatches", "errors", "seed", "device", "by_feature",
            "rows"} <= set(result)
    assert result["ok"] and result["device"] == "cpu" and result["rows"] == []
    assert capsys.readouterr().out.rstrip().endswith("OK")


def test_a_cuda_run_with_a_cpu_stand_in_for_the_gpu(monkeypatch):
    """The cuda run's plumbing (shared structures, the per-program GPU comparison, a
    failure's row and shrink) without a GPU: the stand-in runs the interpreter and, for
    one structure, corrupts a value."""
    import lowvm
    from lowvm.fuzz import run as run_module
    from lowvm.fuzz.build import build_program, program_name
    from lowvm.fuzz.generate import generate

    bad = program_name(generate(5, 4, share=4))

    def launcher(spec, arch):
        program = build_program(spec)

        def launch(arrays):
            lowvm.interpret(program, *arrays.scalars, *arrays.tensors)
            out = check.to_numpy(arrays.tensors[-1])
            if program_name(spec) == bad:
                out[0, 0] = out[0, 0] + 1 if out[0, 0] < 100 else 0
            return out
        return launch

    monkeypatch.setattr(check, "LAUNCHER", launcher)
    monkeypatch.setattr(run_module, "_warm_cache", lambda spec, arch: None)
    result = run(FuzzConfig(device="cuda", programs=8, seed=5, share=4, arch="sm_80",
                            shrink_budget_s=20), log=lambda _: None)
    assert result["structures"] == 2 and result["mismatches"] == 4
    assert {r["stage"] for r in result["rows"]} == {"gpu"}
    first = result["rows"][0]
    assert "shrunk" in first and all(r.get("same_as") == first["index"]
                                     for r in result["rows"][1:])


@pytest.mark.gpu
def test_gpu_matches_the_interpreter_on_48_programs():
    result = run(FuzzConfig(device="cuda", programs=48, seed=31, share=4, workers=1),
                 log=lambda _: None)
    assert result["structures"] == 12
    assert result["ok"], _failures(result)
