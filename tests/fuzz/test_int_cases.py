"""The fuzzer's runtime integer cases: input rows shifted by ``u * v + t`` through int32
wraps, loop steps of either sign chosen at run time. The interpreter must agree with the
numpy reference (which wraps by its own arithmetic), the checked interpreter must report
exactly the wraps, and on a GPU the kernel must agree with the interpreter."""

from __future__ import annotations

import collections
import dataclasses
import json
import shutil

import pytest

from lowvm.fuzz import reference as reference_module
from lowvm.fuzz.check import check_cpu
from lowvm.fuzz.generate import generate, validate
from lowvm.fuzz.run import FuzzConfig, check_program, default_workers, run
from lowvm.fuzz.shrink import candidates
from lowvm.fuzz.spec import features

INT_SPECS = [s for s in (generate(11, i) for i in range(300)) if s.wrap or s.runtime_step]


def test_integer_cases_are_generated_with_every_feature():
    seen = collections.Counter(f for s in INT_SPECS for f in features(s))
    for feature in ("int:overflow", "int:no_overflow", "int:shift_negative",
                    "int:shift_nonnegative", "int:step_down", "int:step_up"):
        assert seen[feature] > 0, (feature, seen)
    kinds = {(abs(s.ints[0]), abs(s.ints[1])) for s in INT_SPECS if s.wrap}
    assert (65536, 65536) in kinds  # 2^32: 0 in 32 bits
    for spec in INT_SPECS:
        validate(spec)


def test_interpreter_matches_reference_on_integer_cases():
    failed = []
    for spec in INT_SPECS[:40]:
        verdict, _ = check_cpu(spec)
        if not verdict.ok:
            failed.append(f"{verdict.stage}: {verdict.message}\n  {json.dumps(spec.ints)}")
    assert not failed, "\n".join(failed)


def test_a_reference_without_the_wrap_is_caught(monkeypatch):
    """Were the shift taken with unbounded integers, the row offset would leave the tensor
    and the comparison must see it."""
    spec = next(s for s in INT_SPECS if s.wrap and s.shift_overflows and s.row_shift == 0
                and s.family == "tile")
    assert check_cpu(spec)[0].ok
    monkeypatch.setattr(reference_module, "_int32", lambda value: value)
    verdict, _ = check_cpu(spec)
    assert verdict.status == "mismatch" and verdict.stage == "interpreter"


def test_the_checked_interpreter_reports_exactly_the_wraps():
    overflow = next(s for s in INT_SPECS if s.shift_overflows)
    quiet = next(s for s in INT_SPECS if s.wrap and not s.shift_overflows)
    assert check_cpu(overflow)[0].ok and check_cpu(quiet)[0].ok
    # the same data through a program without the wrap: nothing for the checked mode
    assert check_cpu(dataclasses.replace(overflow, ints=(0, 0, overflow.row_shift,
                                                         overflow.ints[3])))[0].ok


def test_the_shrinker_drops_the_integer_features():
    spec = next(s for s in INT_SPECS if s.wrap and s.runtime_step)
    simpler = list(candidates(spec))
    assert any(not c.wrap for c in simpler) and any(not c.runtime_step for c in simpler)
    assert any(c.wrap and c.ints[:2] == (0, 0) for c in simpler)


@pytest.mark.gpu
def test_gpu_matches_the_interpreter_on_integer_cases():
    failed = []
    for spec in INT_SPECS:
        verdict, _ = check_program(spec, "cuda")
        if not verdict.ok:
            failed.append(f"{verdict.stage}: {verdict.message}\n  {json.dumps(spec.ints)}")
    assert not failed, "\n".join(failed)


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_matches_the_interpreter_on_3000_programs():
    """The fuzzer's GPU leg at the size issue 37 asks for, integer cases included."""
    result = run(FuzzConfig(device="cuda", programs=3000, seed=37, share=4,
                            workers=default_workers()), log=print)
    failures = "\n".join(f"#{r['index']} {r['stage']}: {r['message']}" for r in result["rows"])
    assert result["ok"], failures
    for feature in ("int:overflow", "int:shift_negative", "int:step_down"):
        assert result["by_feature"][feature]["programs"] > 0, feature


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_integer_cases_compile_with_ptxas():
    from lowvm.fuzz.check import check_ptxas

    chosen = [s for s in INT_SPECS if s.runtime_step][:2] + [
        s for s in INT_SPECS if s.wrap and any(i.path == "async" for i in s.inputs)][:2]
    for spec in chosen:
        verdict = check_ptxas(spec)
        assert verdict.ok, verdict.message
