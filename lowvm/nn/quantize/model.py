"""``quantize_model``: replace a model's ``nn.Linear`` layers by ``QuantLinear`` in place.

Every setting is checked for every layer before any layer is touched. Round to nearest
quantizes every layer before the first one is swapped in, so a failure half-way leaves the
model exactly as it was. GPTQ (:mod:`lowvm.nn.quantize.gptq`, fed by
:mod:`lowvm.nn.quantize.calibration`) must swap block by block, since each block's
calibration inputs come from the quantized blocks before it; if it fails half-way, the
layers already swapped are put back before the error propagates. With ``bits``, the
per-layer types are chosen for a bits-per-weight budget (:mod:`lowvm.nn.quantize.bit_budget`).
Per-layer types come from glob patterns on module names (or the budget's plan); the resolved
per-layer formats go to the registered recorder (:mod:`lowvm.nn.quantize.recorder`), which
keeps them in a Hugging Face model's ``config.quantization_config`` so that
``save_pretrained`` / ``from_pretrained`` rebuild the same layers.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

import torch
from torch import nn

from lowvm.nn.errors import QuantizationError
from lowvm.nn.layer.quant_linear import QuantLinear
from lowvm.nn.layer.quantize import rounded_weight
from lowvm.nn.layer.spec import QuantSpec, make_spec
from lowvm.nn.quantize.bit_budget import (
    BudgetPlan,
    check_bits,
    check_budget,
    check_candidates,
    check_sensitivity,
    layer_bytes,
    layer_error,
    solve_budget,
)
from lowvm.nn.quantize.calibration import (
    find_blocks,
    output_fisher,
    prepare_calibration,
    run_blocks,
)
from lowvm.nn.quantize.gptq import gptq_quantize
from lowvm.nn.quantize.recorder import model_recorder
from lowvm.nn.swap import set_module

__all__ = ["quantize_model", "QuantReport", "plan_layers", "name_matches",
           "LayerSkippedWarning"]


class LayerSkippedWarning(UserWarning):
    """Linear layers left dense because a QuantLinear cannot stand in for them."""


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
    method: str = "rtn"  # "rtn" or "gptq"
    #: GPTQ layers: tr(ΔW H ΔWᵀ) on the calibration inputs (H = 2/n Σ x xᵀ)
    errors: dict[str, float] = field(default_factory=dict)
    plan: BudgetPlan | None = None  # the per-layer types chosen for ``bits``
    notes: list[str] = field(default_factory=list)  # e.g. layers rounded without calibration

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


_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _irreplaceable(name: str, module: nn.Linear, modules: Mapping[str, nn.Module]) -> str | None:
    """Why a QuantLinear in place of ``module`` would change what the model computes (None
    when it would not): a subclass's own ``forward`` would be dropped, and torch's own
    composite modules (``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``, ...) read
    their linears' ``weight`` directly."""
    cls = type(module)
    if cls.forward is not nn.Linear.forward:
        return (f"{cls.__module__}.{cls.__qualname__} (an nn.Linear subclass) has its own "
                "forward, which a QuantLinear would drop")
    parent_name, _, child = name.rpartition(".")
    parent = modules.get(parent_name)
    if (parent is not None and parent is not module and not isinstance(parent, _CONTAINERS)
            and type(parent).__module__.startswith("torch.nn.")):
        return (f"its parent, torch's {type(parent).__name__}, reads {child}.weight itself, "
                "which a QuantLinear does not have")
    return None


def _tied_weights(model: nn.Module) -> set[int]:
    """ids of parameters shared by several modules (e.g. lm_head tied to the embedding)."""
    seen: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        seen[id(param)] = seen.get(id(param), 0) + 1
    return {pid for pid, count in seen.items() if count > 1}


def plan_layers(model: nn.Module, dtype: Any, group_size: int | None,
                zero_point: bool | None, skip: Iterable[str], *, loaded: bool = True
                ) -> tuple[dict[str, QuantSpec], dict[str, str]]:
    """Check every linear layer and return ``(name -> spec, skipped name -> why)``.

    ``loaded`` False: the model's weights are still on the meta device (quantizing while
    transformers loads them), so only the settings and shapes are checked."""
    if isinstance(skip, str):
        skip = (skip,)
    skip = tuple(skip or ())
    if isinstance(dtype, Mapping) and not all(isinstance(p, str) for p in dtype):
        raise QuantizationError(f"quantize_model: dtype patterns must be strings; got "
                                f"{list(dtype)!r}")
    tied = _tied_weights(model)
    plan: dict[str, QuantSpec] = {}
    skipped: dict[str, str] = {}
    modules = dict(model.named_modules())
    linears = [name for name, m in modules.items() if isinstance(m, nn.Linear)]
    _check_patterns(linears, skip, dtype)
    irreplaceable: dict[str, str] = {}
    for name, module in modules.items():
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
        why = _irreplaceable(name, module, modules)
        if why is not None:
            skipped[name] = irreplaceable[name] = why
            continue
        if loaded and module.weight.is_meta:
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
            + (f"the model's {len(linears)} linear layers are all left dense ({'; '.join(reasons)})"
               if linears else "the model has no nn.Linear layers (already quantized?)"))
    if irreplaceable:
        listed = "; ".join(f"{name!r}: {why}" for name, why in irreplaceable.items())
        warnings.warn(LayerSkippedWarning(
            f"quantize_model: {len(irreplaceable)} linear layer(s) left dense, since a "
            f"QuantLinear cannot stand in for them (report.skipped lists them): {listed}"),
            stacklevel=3)
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


_METHODS = ("rtn", "gptq")


def quantize_model(model: nn.Module, dtype: Any = None, group_size: int | None = 128,
                   zero_point: bool | None = None, skip: Iterable[str] = ("lm_head",),
                   progress: bool = True, *, method: str | None = None,
                   calibration: Iterable[Any] | None = None, act_order: bool = False,
                   damp: float = 0.01, bits: float | None = None,
                   candidates: Iterable[Any] | None = None,
                   sensitivity: str | None = None) -> QuantReport:
    """Quantize every ``nn.Linear`` of ``model`` in place; return a report.

    ``dtype`` (default ``"int4"``) is one type for all layers, or ``{glob: type}`` matched
    against module names (and their dotted suffixes: ``"mlp.down_proj"`` matches every
    layer's down_proj); the longest matching pattern wins, a value of None (or no match)
    leaves a layer dense. ``skip`` globs are never quantized, nor are weights tied to
    another module.

    ``method``: ``"rtn"`` (round to nearest; the default without ``bits``) or ``"gptq"``
    (the default with ``bits``), which needs ``calibration``: an iterable of ``input_ids``
    tensors (``[B, T]`` or ``[T]``) or dicts of model inputs. ``act_order`` (GPTQ): columns
    by decreasing input energy, stored with an input permutation. ``damp`` (GPTQ): fraction
    of ``mean(diag H)`` added to the Hessian's diagonal.

    ``bits``: an average bits-per-weight budget (scales and zero points included, biases
    not) over the quantized layers, instead of ``dtype``: each layer gets one of
    ``candidates`` (default int2..int8), chosen to minimise the summed error measured on
    ``calibration`` (of GPTQ with ``method="gptq"``, of round to nearest with ``"rtn"``);
    ``report.plan`` holds the table (printed with ``progress``). ``sensitivity``:
    ``"fisher"`` (the default) weighs each layer's output error by how much the model's
    output distribution depends on it, estimating the KL increase (one forward and backward
    pass of the whole model per calibration item, see :mod:`lowvm.nn.quantize.bit_budget`);
    ``"hessian"`` sums the layers' ``tr(ΔW H ΔWᵀ)`` (no gradients: memory stays one block's
    activations and Hessians).
    """
    skip = (skip,) if isinstance(skip, str) else tuple(skip or ())
    if method is None:
        method = "rtn" if bits is None else "gptq"
    if method not in _METHODS:
        raise QuantizationError(f"quantize_model: method must be one of {_METHODS}; got "
                                f"{method!r}")
    if method == "gptq":
        _check_gptq_settings(act_order, damp)
    elif act_order is not False:
        raise QuantizationError(f"quantize_model: act_order={act_order!r} needs "
                                "method='gptq' (round to nearest has no column order)")
    if bits is not None:
        return _quantize_to_budget(model, bits, candidates, dtype, group_size, zero_point, skip,
                                   progress, method, calibration, act_order, damp, sensitivity)
    for name, value in (("candidates", candidates), ("sensitivity", sensitivity)):
        if value is not None:
            raise QuantizationError(f"quantize_model: {name}={value!r} is only used with "
                                    f"bits=...; give bits, or drop {name}")
    dtype = "int4" if dtype is None else dtype
    if method == "rtn":
        if calibration is not None:
            raise QuantizationError("quantize_model: calibration was given but method='rtn' "
                                    "does not use it; pass method='gptq' (or bits=...)")
        plan, skipped = plan_layers(model, dtype, group_size, zero_point, skip)
        report = QuantReport(skipped=skipped)
        _round_and_swap(model, plan, report, progress)
    else:
        if calibration is None:
            raise QuantizationError("quantize_model: method='gptq' needs calibration: an "
                                    "iterable of input_ids tensors (or dicts of model inputs)")
        plan, skipped = plan_layers(model, dtype, group_size, zero_point, skip)
        samples = prepare_calibration(calibration)
        find_blocks(model)
        report = QuantReport(skipped=skipped, method="gptq")
        _gptq_and_swap(model, plan, samples, act_order, damp, report, progress)
    report.replaced = plan
    _record_config(model, report, dtype, group_size, zero_point, skip)
    return report


def _check_gptq_settings(act_order: Any, damp: Any) -> None:
    if not isinstance(act_order, bool):
        raise QuantizationError(f"quantize_model: act_order must be True or False; got "
                                f"{act_order!r}")
    if (isinstance(damp, bool) or not isinstance(damp, (int, float)) or not 0 <= damp <= 1
            or damp != damp):
        raise QuantizationError(f"quantize_model: damp must be a number in [0, 1] (a "
                                f"fraction of mean(diag H)); got {damp!r}")


def _account(report: QuantReport, name: str, linear: nn.Linear, layer: QuantLinear) -> None:
    report.bytes_before += sum(p.numel() * p.element_size()
                               for p in linear.parameters(recurse=False))
    report.bytes_after += layer.weight_bytes()
    report.layers[name] = layer.layer_config()


def _round_and_swap(model: nn.Module, plan: dict[str, QuantSpec], report: QuantReport,
                    progress: bool) -> None:
    """Round to nearest: every layer is built before the first swap (a failure changes
    nothing)."""
    modules = dict(model.named_modules())
    new: dict[str, QuantLinear] = {}
    for name in _progress(list(plan), progress):
        linear = modules[name]
        spec = plan[name]
        new[name] = QuantLinear.from_linear(linear, spec.wtype, spec.group_size, spec.zero_point,
                                            name=name)
        _account(report, name, linear, new[name])
    for name, layer in new.items():  # nothing above touched the model; now swap
        set_module(model, name, layer)


def _gptq_layer(linear: nn.Linear, hessian: torch.Tensor, spec: QuantSpec, act_order: bool,
                damp: float, name: str) -> tuple[QuantLinear, float]:
    """A QuantLinear holding GPTQ's codes for ``linear`` (which is not changed)."""
    result = gptq_quantize(linear.weight, hessian, spec, act_order=act_order, damp=damp,
                           where=f"quantize_model: layer {name!r}")
    layer = QuantLinear(linear.in_features, linear.out_features, spec.wtype, spec.group_size,
                        spec.zero_point, bias=linear.bias is not None, act_order=act_order,
                        device=linear.weight.device, bias_dtype=linear.weight.dtype)
    layer.set_codes(result.codes, result.scales, result.zeros, result.input_perm)
    if linear.bias is not None:
        assert layer.bias is not None
        layer.bias.copy_(linear.bias.detach())
    return layer, result.error


def _gptq_and_swap(model: nn.Module, plan: dict[str, QuantSpec], samples: list[dict[str, Any]],
                   act_order: bool, damp: float, report: QuantReport, progress: bool) -> None:
    """GPTQ block by block; on any failure the layers already swapped are put back."""
    modules = dict(model.named_modules())
    swapped: dict[str, nn.Module] = {}

    def handle(hessians: dict[str, torch.Tensor | None]) -> bool:
        for name, hessian in hessians.items():
            linear = modules[name]
            spec = plan[name]
            if hessian is None:
                layer = QuantLinear.from_linear(linear, spec.wtype, spec.group_size,
                                                spec.zero_point, name=name)
                report.notes.append(f"{name}: no calibration input reached it; rounded to "
                                    "nearest")
            else:
                layer, report.errors[name] = _gptq_layer(linear, hessian, spec, act_order,
                                                         damp, name)
            set_module(model, name, layer)
            swapped[name] = linear
            _account(report, name, linear, layer)
        return bool(hessians)

    try:
        run_blocks(model, samples, list(plan), handle, progress=progress, desc="lowvm: GPTQ")
    except BaseException:
        for name, linear in swapped.items():
            set_module(model, name, linear)
        report.layers.clear()
        raise


def _quantize_to_budget(model: nn.Module, bits: Any, candidates: Any, dtype: Any,
                        group_size: int | None, zero_point: bool | None, skip: tuple[str, ...],
                        progress: bool, method: str, calibration: Any, act_order: bool,
                        damp: float, sensitivity: Any) -> QuantReport:
    """Measure every candidate on every layer (with ``"fisher"``, output gradients first:
    one pass of the whole model; then one dense pass block by block), plan, then quantize.
    """
    bits = check_bits(bits)
    sensitivity = check_sensitivity("fisher" if sensitivity is None else sensitivity)
    if dtype is not None:
        raise QuantizationError(f"quantize_model: dtype={dtype!r} and bits={bits:g} both given;"
                                " bits chooses each layer's type: drop dtype (the types to "
                                "choose from are candidates=...)")
    if calibration is None:
        raise QuantizationError(f"quantize_model: bits={bits:g} needs calibration (an iterable "
                                "of input_ids tensors) to measure each type's error per layer")
    names = check_candidates(candidates)
    plans = {c: plan_layers(model, c, group_size, zero_point, skip) for c in names}
    layers, skipped = plans[names[0]]
    modules = dict(model.named_modules())
    weights = {name: modules[name].weight.numel() for name in layers}
    sizes = {name: {c: layer_bytes(modules[name].in_features, modules[name].out_features,
                                   plans[c][0][name], act_order) for c in names}
             for name in layers}
    check_budget(sizes, weights, bits)
    samples = prepare_calibration(calibration)
    find_blocks(model)
    fisher: dict[str, torch.Tensor | None] = {}
    if sensitivity == "fisher":
        fisher = output_fisher(model, samples, list(layers), progress=progress)
    options: dict[str, dict[str, tuple[int, float]]] = {}
    traces: dict[str, dict[str, float]] = {}

    def measure(hessians: dict[str, torch.Tensor | None]) -> bool:
        for name, hessian in hessians.items():
            linear = modules[name]
            k = linear.in_features
            h = hessian if hessian is not None else torch.zeros(k, k, device=linear.weight.device)
            # a layer no gradient reaches does not move the output: no error at any type
            channels = None
            if sensitivity == "fisher":
                channels = fisher.get(name)
                if channels is None:
                    channels = torch.zeros(linear.out_features, device=linear.weight.device)
            options[name], traces[name] = {}, {}
            for cand in names:
                spec = plans[cand][0][name]
                if method == "gptq" and hessian is not None:
                    quantized = gptq_quantize(linear.weight, h, spec, act_order=act_order,
                                              damp=damp,
                                              where=f"quantize_model: layer {name!r}").weight
                else:
                    quantized = rounded_weight(linear.weight, spec, f"layer {name!r}")
                error, traces[name][cand] = layer_error(linear.weight, quantized, h, channels)
                options[name][cand] = (sizes[name][cand], error)
        return False

    run_blocks(model, samples, list(layers), measure, progress=progress,
               desc="lowvm: measuring types")
    budget = solve_budget({name: options[name] for name in layers}, weights, bits,
                          sensitivity=sensitivity,
                          hessian_errors=traces if sensitivity == "fisher" else None)
    chosen = {name: plans[t][0][name] for name, t in budget.dtypes().items()}
    report = QuantReport(skipped=skipped, method=method, plan=budget)
    if method == "gptq":
        _gptq_and_swap(model, chosen, samples, act_order, damp, report, progress)
    else:
        _round_and_swap(model, chosen, report, progress)
    report.replaced = chosen
    if progress:
        print(budget)
    _record_config(model, report, budget.dtypes(), group_size, zero_point, skip)
    return report


def _record_config(model: nn.Module, report: QuantReport, dtype: Any, group_size: int | None,
                   zero_point: bool | None, skip: Iterable[str]) -> None:
    """Hand the settings to the registered recorder (:mod:`lowvm.nn.quantize.recorder`:
    a LowvmConfig for save_pretrained, and the model card) where ``model`` is a Hugging
    Face model, i.e. has a transformers config."""
    config = getattr(model, "config", None)
    recorder = model_recorder()
    if (recorder is None or config is None or not hasattr(config, "to_dict")
            or not report.replaced):
        return
    recorder(model, report, dtype, group_size, zero_point, skip)
