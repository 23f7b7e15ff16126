"""Replays of the shrunk fuzz failures saved in tests/fuzz/regressions/.

Each file holds a spec and the stage it failed at. A case whose ``xfail`` names a reason
is a known bug, expected to fail (strictly: the test fails once the bug is fixed, so the
reason is removed); every other case must now pass. GPU cases run where a GPU is."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lowvm.fuzz.run import check_program
from lowvm.fuzz.shrink import load_regression

CASES = sorted((Path(__file__).parent / "regressions").glob("*.json"))


def _params():
    for path in CASES:
        _, record = load_regression(path)
        marks = []
        stage = record["stage"]
        if stage.startswith("gpu"):
            marks.append(pytest.mark.gpu)
        if stage.startswith("ptxas"):
            marks.append(pytest.mark.skipif(shutil.which("nvcc") is None,
                                            reason="nvcc is not on PATH"))
        if record.get("xfail"):
            marks.append(pytest.mark.xfail(reason=record["xfail"], strict=True))
        yield pytest.param(path, marks=marks, id=path.stem)


def test_there_are_cases():
    assert CASES, "tests/fuzz/regressions/ holds the shrunk failures the fuzzer found"


@pytest.mark.parametrize("path", list(_params()))
def test_replay(path):
    spec, record = load_regression(path)
    stage = record["stage"]
    device = "cuda" if stage.startswith("gpu") else "cpu"
    verdict, _ = check_program(spec, device, ptxas=stage.startswith("ptxas"))
    assert verdict.ok, f"{verdict.status} at {verdict.stage}: {verdict.message}"
