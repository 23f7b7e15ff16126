"""The kernel library's public host names in one place, for callers that import them from
here: weights (:mod:`lowvm.kernels.weights`), quantization
(:mod:`lowvm.kernels.quantize`), schedule choice (:mod:`lowvm.kernels.schedules`), launches
(:mod:`lowvm.kernels.dispatch`) and overlapped launches
(:mod:`lowvm.runtime.workspaces`). New code imports from those modules."""

from __future__ import annotations

from lowvm.kernels.dispatch import (
    GemmLaunch,
    is_sm90,
    prefill_quant_linear,
    prepare_quant_linear,
    quant_linear,
    wgmma_quant_linear,
)
from lowvm.kernels.quantize import quantize_to_codes
from lowvm.kernels.schedules import (
    NUM_SMS_DEFAULT,
    PREFILL_KERNEL,
    X_WHOLE_BYTES,
    choose_prefill_schedule,
    choose_schedule,
    choose_wgmma_schedule,
    plan_refusal,
    prefill_split,
    runs_wgmma,
    wgmma_refusal,
)
from lowvm.kernels.weights import (
    WEIGHT_BN,
    WEIGHT_WARPS_N,
    QuantWeight,
    fits_float16,
    prepare_weight,
    weight_bk,
)
from lowvm.runtime.workspaces import overlap_enabled, overlapped_launches

__all__ = ["QuantWeight", "prepare_weight", "quant_linear", "choose_schedule", "WEIGHT_BN",
           "WEIGHT_WARPS_N", "X_WHOLE_BYTES", "weight_bk", "quantize_to_codes",
           "overlapped_launches", "overlap_enabled", "fits_float16",
           "NUM_SMS_DEFAULT", "PREFILL_KERNEL", "prefill_quant_linear",
           "choose_prefill_schedule", "prefill_split", "plan_refusal",
           "choose_wgmma_schedule", "wgmma_quant_linear", "runs_wgmma", "wgmma_refusal",
           "is_sm90", "GemmLaunch", "prepare_quant_linear"]
