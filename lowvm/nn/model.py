"""``quantize_model``: replace a model's ``nn.Linear`` layers by ``QuantLinear`` in place.

Every layer is checked and quantized before the first one is swapped in, so a bad setting
or a failure half-way leaves the model exactly as it was. Per-layer types come from glob
patterns on module names; the resolved per-layer formats are recorded in the model's
``config.quantization_config`` (a :class:`~lowvm.nn.hf_config.LowvmConfig`) so that
``save_pretrained`` / ``from_pretrained`` rebuild the same layers.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import torch
from torch import nn

from lowvm.nn.errors import QuantizationError
from lowvm.nn.quant_linear import QuantLinear
from lowvm.nn.spec import QuantSpec, make_spec

__all__ = ["quantize_model", "QuantReport", "plan_layers", "name_matches"]


@dataclass
class QuantReport:
    """What :func:`quantize_model` did: layers replaced (with formats), skipped, bytes."""

    replaced: dict[str, QuantSpec] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # name -> why
    bytes_before: int = 0  # the replaced layers' dense weights and biases
    bytes_after: int = 0  # the same layers quantized

    @property
    def layers_replaced(self) -> int:
        return len(self.replaced)

    layers: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> layer_config()

    def modules(self) -> dict[str, dict[str, Any]]:
        """Per-layer formats, JSON-able (what LowvmConfig.modules records)."""
        return dict(self.layers)

    def __str__(self) -> str:
        ratio = self.bytes_before / self.bytes_after if self.bytes_after else float("nan")
        return (f"lowvm: replaced {self.layers_replaced} linear layers "
                f"({self.bytes_before / 2**20:.2f} MiB -> {self.bytes_after / 2**20:.2f} MiB, "
                f"{ratio:.2f}x smaller); skipped {len(self.skipped)}")


def name_matches(name: str, pattern: str) -> bool:
    """Glob ``pattern`` against the full module name or any dotted suffix of it."""
    return fnmatchcase(name, pattern) or fnmatchcase(name, "*." + pattern)


def _dtype_for(name: str, dtype: Any) -> Any:
    """The type for one layer: a single type, or the longest matching pattern's (None: skip)."""
    if not isinstance(dtype, Mapping):
        return dtype
    hits = [pattern for pattern in dtype if name_matches(name, pattern)]
    if not hits:
        return None
    return dtype[max(hits, key=len)]  # longest wins; ties: the first in order


def _tied_weights(model: nn.Module) -> set[int]:
    """ids of parameters shared by several modules (e.g. lm_head tied to the embedding)."""
    seen: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        seen[id(param)] = seen.get(id(param), 0) + 1
    return {pid for pid, count in seen.items() if count > 1}


def plan_layers(model: nn.Module, dtype: Any, group_size: int | None,
                zero_point: bool | None, skip: Iterable[str]
                ) -> tuple[dict[str, QuantSpec], dict[str, str]]:
    """Check every linear layer and return ``(name -> spec, skipped name -> why)``."""
    if isinstance(skip, str):
        skip = (skip,)
    skip = tuple(skip or ())
    if isinstance(dtype, Mapping) and not all(isinstance(p, str) for p in dtype):
        raise QuantizationError(f"quantize_model: dtype patterns must be strings; got "
                                f"{list(dtype)!r}")
    tied = _tied_weights(model)
    plan: dict[str, QuantSpec] = {}
    skipped: dict[str, str] = {}
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    _check_patterns(linears, skip, dtype)
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        if any(name_matches(name, pattern) for pattern in skip):
            skipped[name] = "in skip"
            continue
        layer_dtype = _dtype_for(name, dtype)
        if layer_dtype is None:
            skipped[name] = "no dtype pattern matches"
            continue
        if id(module.weight) in tied:
            skipped[name] = "weight tied to another module"
            continue
        if module.weight.is_meta:
            raise QuantizationError(f"quantize_model: layer {name!r} has no weights yet (meta "
                                    "device); load the model's weights first")
        if module.weight.dtype not in (torch.float16, torch.bfloat16):
            raise QuantizationError(
                f"quantize_model: layer {name!r} is {str(module.weight.dtype).split('.')[-1]}; "
                "lowvm layers compute in float16 or bfloat16: convert the model first "
                "(model.half() or model.to(torch.bfloat16))")
        plan[name] = make_spec(layer_dtype, group_size, zero_point, module.in_features,
                               module.out_features, where=f"quantize_model: layer {name!r}")
    if not plan:
        reasons = sorted(set(skipped.values()))
        raise QuantizationError(
            "quantize_model: nothing to quantize: "
            + (f"the model's {len(linears)} linear layers are all left dense ({', '.join(reasons)})"
               if linears else "the model has no nn.Linear layers (already quantized?)"))
    return plan, skipped


#: skip patterns that may match nothing: the default, for models without an lm_head
DEFAULT_SKIP = ("lm_head",)


def _check_patterns(linears: list[str], skip: tuple[str, ...], dtype: Any) -> None:
    """Every pattern the caller wrote must match a linear layer: a typo would otherwise
    quantize (or keep dense) what the caller meant to keep (or quantize)."""
    given = [("skip", p) for p in skip if p not in DEFAULT_SKIP]
    if isinstance(dtype, Mapping):
        given += [("dtype", p) for p in dtype]
    for where, pattern in given:
        if not any(name_matches(name, pattern) for name in linears):
            suffixes = sorted({".".join(n.split(".")[i:]) for n in linears
                               for i in range(len(n.split(".")))})
            close = difflib.get_close_matches(pattern, suffixes, n=5, cutoff=0.6)
            raise QuantizationError(
                f"quantize_model: {where} pattern {pattern!r} matches no linear layer; "
                + (f"close names: {close}" if close else
                   f"layers look like {linears[:3]}"))


def _progress(items: list[str], enabled: bool) -> Iterable[str]:
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc="lowvm: quantizing", unit="layer")


def quantize_model(model: nn.Module, dtype: Any = "int4", group_size: int | None = 128,
                   zero_point: bool | None = None, skip: Iterable[str] = ("lm_head",),
                   progress: bool = True) -> QuantReport:
    """Quantize every ``nn.Linear`` of ``model`` in place (round to nearest); return a report.

    ``dtype`` is one type for all layers, or ``{glob: type}`` matched against module names
    (and their dotted suffixes: ``"mlp.down_proj"`` matches every layer's down_proj); the
    longest matching pattern wins, a value of None (or no match) leaves a layer dense.
    ``skip`` globs are never quantized, nor are weights tied to another module.
    """
    skip = (skip,) if isinstance(skip, str) else tuple(skip or ())
    plan, skipped = plan_layers(model, dtype, group_size, zero_point, skip)
    modules = dict(model.named_modules())
    report = QuantReport(skipped=skipped)
    new: dict[str, QuantLinear] = {}
    for name in _progress(list(plan), progress):
        linear = modules[name]
        spec = plan[name]
        new[name] = QuantLinear.from_linear(linear, spec.wtype, spec.group_size, spec.zero_point,
                                            name=name)
        report.bytes_before += sum(p.numel() * p.element_size()
                                   for p in linear.parameters(recurse=False))
        report.bytes_after += new[name].weight_bytes()
        report.layers[name] = new[name].layer_config()
    for name, layer in new.items():  # nothing above touched the model; now swap
        parent_name, _, child = name.rpartition(".")
        setattr(modules[parent_name] if parent_name else model, child, layer)
    report.replaced = plan
    _record_config(model, report, dtype, group_size, zero_point, skip)
    return report


def _record_config(model: nn.Module, report: QuantReport, dtype: Any, group_size: int | None,
                   zero_point: bool | None, skip: Iterable[str]) -> None:
    """Attach a LowvmConfig to a Hugging Face model so save_pretrained records the layers."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict") or not report.replaced:
        return
    from lowvm.nn.hf_config import LowvmConfig

    previous = getattr(config, "quantization_config", None)
    modules = dict(previous.modules) if isinstance(previous, LowvmConfig) else {}
    modules.update(report.modules())
    config.quantization_config = LowvmConfig(dtype=dtype, group_size=group_size,
                                             zero_point=zero_point, skip=skip, modules=modules)
