"""The fuzz checks: a wrong value, a write into the padding or a build failure is caught;
the GPU path's comparison, with a CPU stand-in for the GPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import lowvm
from lowvm.fuzz import check
from lowvm.fuzz import numerics as nm
from lowvm.fuzz.build import build_program
from lowvm.fuzz.check import check_cpu, check_gpu, gpu_tolerance, read_output
from lowvm.fuzz.generate import POISON, make_arrays, validate
from lowvm.fuzz.spec import Input, Layout, Op, Spec

TILE = Spec("tile", 1, (4, 32), (Input("float16", lo=-4.0, hi=4.0, q=-4),
                                 Input("int4", lo=-8.0, hi=7.0, q=0)),
            (Op("cast", (1,), dtype="float16"), Op("mul", (0, 2)),
             Op("reduce", (3,), reduce="max", dim=1), Op("sub", (3, 4))),
            "float32", layout=Layout((1, 1), (4, 8), (1, 4)), out_pad=3,
            extent=(7, 40, 1), data_seed=5)


def _interpreted(spec: Spec) -> np.ndarray:
    verdict, out = check_cpu(spec)
    assert verdict.ok, verdict
    return out


def _stand_in(transform=None):
    """A LAUNCHER that runs the interpreter on the CPU (then ``transform``s the buffer)."""
    def launcher(spec, arch):
        program = build_program(spec)

        def launch(arrays):
            lowvm.interpret(program, *arrays.scalars, *arrays.tensors)
            out = check.to_numpy(arrays.tensors[-1])
            return transform(out) if transform else out
        return launch
    return launcher


def test_reference_agrees_and_the_output_is_fully_written():
    out = _interpreted(TILE)
    values, padding = read_output(TILE, out)
    assert values.shape == (7, 40) and (padding == POISON).all()
    assert not (values == POISON).any()


def test_a_planted_reference_difference_is_a_mismatch(monkeypatch):
    from lowvm.fuzz import reference

    real = reference._binary
    monkeypatch.setattr(reference, "_binary",
                        lambda name, a, b, i: real("add" if name == "sub" else name, a, b, i))
    verdict, _ = check_cpu(TILE)
    assert verdict.status == "mismatch" and verdict.stage == "interpreter"
    assert "first at" in verdict.message


def test_build_failures_are_errors_not_crashes():
    bad = dataclasses.replace(TILE, layout=Layout((1, 1), (4, 4), (1, 4)))  # 16 threads
    verdict, out = check_cpu(bad)
    assert verdict.status == "error" and verdict.stage == "build" and out is None


def test_gpu_comparison_with_a_cpu_stand_in(monkeypatch):
    out = _interpreted(TILE)
    monkeypatch.setattr(check, "LAUNCHER", _stand_in())
    assert check_gpu(TILE, out, "sm_80").ok

    def one_wrong(buf):
        buf = buf.copy()
        buf[2, 5] += 1
        return buf
    monkeypatch.setattr(check, "LAUNCHER", _stand_in(one_wrong))
    verdict = check_gpu(TILE, out, "sm_80")
    assert verdict.status == "mismatch" and "[2, 5]" in verdict.message

    def padding_written(buf):
        buf = buf.copy()
        buf[0, -1] = 0
        return buf
    monkeypatch.setattr(check, "LAUNCHER", _stand_in(padding_written))
    assert "padding" in check_gpu(TILE, out, "sm_80").message

    def broken(spec, arch):
        raise lowvm.ProgramError("no kernel")
    monkeypatch.setattr(check, "LAUNCHER", broken)
    assert check_gpu(TILE, out, "sm_80").stage == "gpu-compile"


def test_only_approximate_results_get_a_gpu_tolerance(monkeypatch):
    assert gpu_tolerance(TILE) is None
    small = (dataclasses.replace(TILE.inputs[0], lo=-1.0, hi=1.0), TILE.inputs[1])
    exp = dataclasses.replace(TILE, inputs=small, ops=TILE.ops[:2] + (Op("exp", (3,)),),
                              out_dtype="bfloat16")
    assert gpu_tolerance(exp) == lowvm.bfloat16  # the coarser of float16 and bfloat16
    out = _interpreted(exp)

    def shifted(ulps):
        def shift(buf):
            buf = buf.copy()  # the values only: the padding keeps its poison
            buf[:, :40] += ulps * nm.ulp(buf[:, :40], lowvm.bfloat16)
            return buf
        return shift
    monkeypatch.setattr(check, "LAUNCHER", _stand_in(shifted(1)))
    assert check_gpu(exp, out, "sm_80").ok
    monkeypatch.setattr(check, "LAUNCHER", _stand_in(shifted(4)))
    assert check_gpu(exp, out, "sm_80").status == "mismatch"


@pytest.mark.parametrize("dtype", ["int3", "float6_e3m2", "float8_e4m3", "uint8"])
def test_packed_outputs_read_back_as_values(dtype):
    spec = dataclasses.replace(TILE, out_dtype=dtype, ops=TILE.ops[:1], tile=(8, 32),
                               layout=Layout((1, 1), (8, 4), (1, 8)))
    validate(spec)
    out = _interpreted(spec)
    values, padding = read_output(spec, out)
    arrays = make_arrays(spec)
    assert values.shape == (7, 40) and (padding == check._poison(spec)).all()
    assert np.array_equal(values, lowvm.dtypes.round_to(arrays.values[1], dtype))
