"""GemmSchedule refuses, when it is made, the combinations of fields no kernel runs,
naming the field, its value and what is accepted."""

from __future__ import annotations

import dataclasses

import pytest

from lowvm import LowvmError
from lowvm.kernels.gemm_schedule import GemmSchedule, ScheduleError, with_fields
from lowvm.kernels.quant_gemm_prefill import PREFILL_SCHEDULE, PREFILL_SCHEDULE_SM80
from lowvm.kernels.quant_gemm_wgmma import WGMMA_SCHEDULE

WGMMA = dict(bm=128, bn=128, bk=128, warps_m=8, warps_n=1, stages=3, wgmma=True)


@pytest.mark.parametrize("fields, field, accepted", [
    (dict(split=0), "split=0", ">= 1"),
    (dict(bm=-16), "bm=-16", ">= 1"),
    (dict(min_blocks=0), "min_blocks=0", ">= 1"),
    (dict(l2_ahead=-2), "l2_ahead=-2", "0 \\(off\\) or a positive"),
    (dict(stages=0), "stages=0", "None"),
    (dict(k_slice=24), "k_slice=24", "multiple of 16 dividing bk=128"),
    (dict(bk=32, k_slice=64), "k_slice=64", "dividing bk=32"),
    (dict(prefetch=2, x_steps=3), "x_steps=3", "multiple of prefetch=2"),
    (dict(x_rows=1), "x_rows=1", "1 with x_whole"),
    (dict(x_rows=4, x_whole=512), "x_rows=4", "0 or bm=16"),
    (dict(x_whole=200), "x_whole=200", "multiple of bk=128"),
    (dict(x_whole=512, stages=2), "x_whole=512", "no weights_shared, x_steps or stages"),
    (dict(x_whole=512, x_steps=2, prefetch=2), "x_whole=512", "x_steps"),
    (dict(x_whole=512, weights_shared=True), "x_whole=512", "weights_shared"),
    (dict(weights_shared=True, stages=2, prefetch=2), "weights_shared=True", "prefetch=1"),
    (dict(weights_shared=True, stages=2, x_steps=2), "weights_shared=True", "x_steps 0 or 1"),
    (dict(weights_shared=True, stages=2, l2_ahead=1), "weights_shared=True", "l2_ahead=0"),
    (dict(swap_ab=True), "swap_ab=True", "x_rows=1, warps_m=1 and k_slice=0, got x_rows=0"),
    (dict(swap_ab=True, x_whole=512, x_rows=1, k_slice=32), "swap_ab=True", "k_slice=32"),
    (dict(WGMMA, warps_n=2), "warps_m=8", "warps_n=1, got warps_n=2"),
    (dict(WGMMA, warps_m=2), "warps_m=2", "4 or 8"),
    (dict(WGMMA, bm=100), "bm=100", "multiple of 8 in 8..256"),
    (dict(WGMMA, bn=96), "bn=96", "multiple of 64 x warpgroups \\(128\\)"),
    (dict(WGMMA, bk=32), "bk=32", "64 or 128"),
    (dict(WGMMA, x_whole=512, stages=None), "wgmma=True", "got x_whole=512"),
    (dict(WGMMA, min_blocks=2), "wgmma=True", "got min_blocks=2"),
])
def test_a_combination_no_kernel_runs_is_refused_naming_the_field(fields, field, accepted):
    with pytest.raises(ScheduleError, match=f"GemmSchedule {field}: .*{accepted}") as info:
        GemmSchedule(**fields)
    assert isinstance(info.value, LowvmError) and isinstance(info.value, ValueError)


def test_replace_resplit_and_with_fields_are_checked_too():
    s = GemmSchedule(split=2, prefetch=2, x_whole=512, x_rows=1, swap_ab=True)
    with pytest.raises(ScheduleError, match="swap_ab=True"):
        dataclasses.replace(s, warps_m=2, bm=32)
    with pytest.raises(ScheduleError, match="x_whole=512"):
        s.resplit(1024, stages=2)
    with pytest.raises(ScheduleError, match="k_slice=8"):
        with_fields(GemmSchedule(), "k_slice=8")


def test_the_schedules_the_library_names_are_accepted():
    """What the kernels and the built-in choices use passes (else importing them would
    have raised); with and without each option that combines with the defaults."""
    assert PREFILL_SCHEDULE.bm == 256 and PREFILL_SCHEDULE_SM80 and WGMMA_SCHEDULE
    GemmSchedule(**WGMMA)
    GemmSchedule(bm=16, bn=64, bk=128, warps_m=4, warps_n=1, split=4, stages=2, prefetch=2,
                 wgmma=True)
    GemmSchedule(x_whole=4096, x_rows=1, swap_ab=True, prefetch=4)
    GemmSchedule(x_whole=512, x_rows=1, l2_ahead=4)   # x held whole, weights into the L2
    GemmSchedule(bm=64, warps_m=1, k_slice=16, stages=2, fused_split=False)
    GemmSchedule(weights_shared=True, stages=3, x_steps=1)
    GemmSchedule(prefetch=2, x_steps=4, stages=2, l2_ahead=1)
