"""What the benchmark compares: float16 and quantized copies of one trained model.

A variant is named by a short key: ``fp16``; ``<type>-<method>`` (``int3-gptq``,
``int4-rtn``: every layer one type, at the run's group size, by round to nearest or
GPTQ); ``bits<N>`` (``bits3.5``: a bit budget, lowvm choosing each layer's type). Each is
applied to a fresh float16 copy through lowvm's public ``quantize_model``; GPTQ and bit
budgets get calibration batches of training sequences, never held-out ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lowvm.errors import LowvmError
from lowvm.evaluation.errors import EvaluationError
from lowvm.nn.layer.spec import weight_type
from lowvm.nn.quantize.model import QuantReport, quantize_model

__all__ = ["METHODS", "DEFAULT_VARIANTS", "Variant", "parse_variant", "parse_variants",
           "quantize_variant", "bits_per_weight", "type_mix"]

METHODS = ("rtn", "gptq")
DEFAULT_VARIANTS = ("fp16", "int8-rtn", "int8-gptq", "int4-rtn", "int4-gptq", "int3-rtn",
                    "int3-gptq", "int2-rtn", "int2-gptq", "bits3.5", "bits3")


@dataclass(frozen=True)
class Variant:
    """One row of the comparison."""

    key: str
    dtype: str | None = None  # one type for every layer (None: float16 or a budget)
    method: str | None = None  # "rtn" / "gptq"; None: float16 or a budget
    bits: float | None = None  # a bit budget
    group_size: int = 128

    @property
    def label(self) -> str:
        if self.bits is not None:
            return f"{self.bits:g} bits g{self.group_size}"
        if self.dtype is None:
            return "float16"
        return f"{self.dtype} g{self.group_size} {self.method}"

    @property
    def needs_calibration(self) -> bool:
        return self.bits is not None or self.method == "gptq"


def parse_variant(key: str, group_size: int = 128) -> Variant:
    """The variant a key names; anything else is an :class:`EvaluationError` listing the
    accepted forms."""
    accepted = ("accepted: fp16, <type>-<method> with method rtn or gptq (e.g. int3-gptq), "
                "bits<N> with N > 0 (e.g. bits3.5)")
    text = key.strip()
    if text == "fp16":
        return Variant("fp16", group_size=group_size)
    if text.startswith("bits"):
        try:
            bits = float(text[4:])
        except ValueError:
            bits = float("nan")
        if not bits > 0:
            raise EvaluationError(f"variant {key!r}: {text[4:]!r} is not a positive number; "
                                  + accepted)
        return Variant(text, bits=bits, group_size=group_size)
    dtype, sep, method = text.rpartition("-")
    if not sep or method not in METHODS:
        raise EvaluationError(f"variant {key!r}: {accepted}")
    try:
        name = weight_type(dtype, f"variant {key!r}").name
    except LowvmError as exc:
        raise EvaluationError(str(exc)) from None
    return Variant(text, dtype=name, method=method, group_size=group_size)


def parse_variants(text: str | Sequence[str], group_size: int = 128) -> list[Variant]:
    """A comma list (or sequence) of keys as variants, float16 first (added when missing:
    every row's increase is measured against it); a repeated key is an error."""
    keys = [k.strip() for k in (text.split(",") if isinstance(text, str) else text)]
    keys = [k for k in keys if k]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise EvaluationError(f"variants {text!r} repeat {', '.join(repeated)}; accepted: "
                              "each key once")
    variants = [parse_variant(k, group_size) for k in keys]
    rest = [v for v in variants if v.key != "fp16"]
    return [Variant("fp16", group_size=group_size), *rest]


def quantize_variant(variant: Variant, model: Any,
                     calibration: Sequence[torch.Tensor]) -> QuantReport | None:
    """Quantize ``model`` in place as ``variant`` says (None for float16)."""
    if variant.bits is not None:
        return quantize_model(model, bits=variant.bits, group_size=variant.group_size,
                              calibration=calibration, progress=False)
    if variant.dtype is None:
        return None
    extra = {"calibration": calibration} if variant.method == "gptq" else {}
    return quantize_model(model, dtype=variant.dtype, group_size=variant.group_size,
                          method=variant.method, progress=False, **extra)


def bits_per_weight(report: QuantReport, dense: Any) -> float:
    """Stored bits per weight of the quantized layers (codes, scales, zeros: every buffer
    the layers keep) against the float16 model's weights of the same layers."""
    weights = sum(dense.get_submodule(name).weight.numel() for name in report.layers)
    return report.bytes_after * 8 / weights


def type_mix(report: QuantReport) -> str:
    """The layers' types: one name, or ``type:count`` pairs (most layers first)."""
    counts = Counter(layer["dtype"] for layer in report.layers.values())
    if len(counts) == 1:
        return next(iter(counts))
    return " ".join(f"{name}:{n}" for name, n in sorted(counts.items(), key=lambda c: -c[1]))
