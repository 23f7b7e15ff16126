"""One row of the comparison: a fresh float16 copy of the trained model, quantized as a
variant says, scored on the held-out bytes and compared layer by layer with float16.

Every variant starts from the same kept float16 state dict, so no variant sees another's
rounding. A variant that fails gives a row with an ``error`` instead of figures.
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from lowvm.evaluation.configs import ModelRecipe, llama_config
from lowvm.evaluation.perplexity import perplexity
from lowvm.evaluation.variants import Variant, bits_per_weight, quantize_variant, type_mix
from lowvm.serving.quality import layer_errors, logit_errors

__all__ = ["Reference", "fresh_copy", "evaluate_variant"]


@dataclass
class Reference:
    """What every variant is measured with: the trained float16 model and its kept state
    dict, the held-out sequences, calibration batches (training sequences) and a probe
    batch of held-out sequences for the per-layer and top-1 comparisons. Scoring,
    calibration and the probe all run ``batch_size`` sequences per forward: one call shape
    per layer, so on a GPU each lowvm kernel specialisation is built once."""

    recipe: ModelRecipe
    device: torch.device
    dense: Any
    state_dict: dict[str, torch.Tensor]
    heldout: torch.Tensor
    calibration: list[torch.Tensor]
    probe: torch.Tensor
    batch_size: int = 8


def fresh_copy(ref: Reference) -> Any:
    """A new float16 model on the reference's device holding the kept weights."""
    with torch.device(ref.device):
        model = AutoModelForCausalLM.from_config(llama_config(ref.recipe), dtype=torch.float16)
    model.load_state_dict(ref.state_dict)
    return model.eval().requires_grad_(False)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def evaluate_variant(variant: Variant, ref: Reference, fp16_perplexity: float | None
                     ) -> dict[str, Any]:
    """The row of ``variant``: type(s), method, stored bits per weight, held-out perplexity
    and its relative increase over ``fp16_perplexity``, per-layer errors and top-1
    agreement."""
    row: dict[str, Any] = {"variant": variant.label, "key": variant.key,
                           "dtype": variant.dtype or ("float16" if variant.bits is None
                                                      else None),
                           "method": variant.method,
                           "group_size": None if variant.key == "fp16" else variant.group_size,
                           "bits_budget": variant.bits}
    model = None
    try:
        model = fresh_copy(ref)
        started = time.perf_counter()
        report = quantize_variant(variant, model, ref.calibration)
        _sync(ref.device)
        row["quantize_s"] = round(time.perf_counter() - started, 2)
        if report is None:
            row["bits_per_weight"] = 16.0
        else:
            row["dtype"] = type_mix(report)
            row["method"] = report.method
            if report.notes:
                row["notes"] = list(report.notes)
            row["layers_quantized"] = len(report.layers)
            row["weight_bytes"] = report.bytes_after
            row["bits_per_weight"] = round(bits_per_weight(report, ref.dense), 4)
        started = time.perf_counter()
        score = perplexity(model, ref.heldout, ref.batch_size)
        _sync(ref.device)
        row["eval_s"] = round(time.perf_counter() - started, 2)
        if not math.isfinite(score.nll):
            raise FloatingPointError(f"the held-out NLL is {score.nll} (non-finite logits)")
        row.update(perplexity=score.perplexity, bits_per_byte=score.bits_per_byte,
                   heldout_tokens=score.tokens)
        if variant.key == "fp16":
            row["increase_vs_fp16"] = 0.0
        else:  # None where float16 itself could not be scored
            row["increase_vs_fp16"] = (score.perplexity / fp16_perplexity - 1.0
                                       if fp16_perplexity else None)
        if report is not None:
            row.update(layer_errors(ref.dense, model, ref.probe))
            row["top1_agreement"] = logit_errors(ref.dense, model, ref.probe)["top1_agreement"]
    except Exception as exc:  # every failure becomes the row's error, reported, never hidden
        row["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
    finally:
        del model
        if ref.device.type == "cuda":
            torch.cuda.empty_cache()
    return row
