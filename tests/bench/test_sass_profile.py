"""lowvm.bench.sass_profile: the decode GEMM's main loop counted per VM instruction."""

from __future__ import annotations

import shutil

import pytest

import lowvm
from lowvm.driver import generate_cuda
from lowvm.kernels.quant_gemm import GemmSchedule, quant_gemm

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def _tool():
    from lowvm.bench import sass_profile

    return sass_profile


def test_the_decode_loop_is_counted_per_vm_instruction():
    tool = _tool()
    source = generate_cuda(quant_gemm.build(wtype=lowvm.int4, group=128, schedule=GemmSchedule(
        split=8, stages=4))).source
    fast = tool.executed_path(source)
    assert "(k % 8) == 0" in source and "(k % 8) == 0" not in fast
    per_inst, per_op, total = tool.loop_profile(fast, "sm_90")
    assert sum(per_inst.values()) == sum(per_op.values()) == total
    # a warp's K step: 16 columns x 128 deep = 8 k-chunks x 2 n8 halves of m16n8k16
    assert per_op["HMMA"] == 16 and per_inst["dot"] >= 16
    assert per_op["LDSM"] == 8 and per_inst["load_shared"] >= 8  # x's A fragments
    assert per_inst["cast"] > per_inst["dot"]  # the int4 -> f16 conversion dominates
    assert {"copy_async", "load_global", "fma"} <= set(per_inst)
