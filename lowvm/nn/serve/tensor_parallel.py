"""Tensor parallelism for lowvm layers: each rank keeps only its shard of every layer.

A ``QuantLinear``'s ``qweight`` is the GPU kernel's repacked layout, not a tensor that
DTensor can slice, so transformers' own tensor parallelism cannot shard it (it fails with
"got mixed torch.Tensor and DTensor"). lowvm shards its layers itself, in the two styles
of the Megatron split transformers' plans name:

* ``colwise``: rank r keeps output rows ``N[r*N/w:(r+1)*N/w]`` (codes, scales, zero
  points, bias); its output is the local slice of the features, as the next rowwise layer
  (or attention, which reshapes heads with ``-1``) expects. ``N/w`` must be a multiple of
  the kernel's N tile (64). Fused q/k/v and gate/up layers shard each part apart, so every
  rank keeps whole heads and matching gate/up rows.
* ``rowwise``: rank r keeps stored input columns ``K[r*K/w:(r+1)*K/w]`` with their groups
  (``K/w`` a multiple of the group size and of 64; one group per row becomes one group per
  shard, the scales unchanged) and the bias only on rank 0; a forward hook all-reduces
  the partial outputs over the process group (NCCL's all-reduce on GPUs, capturable in
  CUDA graphs). GPTQ act-order layers are refused: their input permutation mixes the
  channels of every rank's input slice inside one group.
* ``colwise_gather_output`` (transformers' plan for ``lm_head``): colwise, then the
  shards' outputs are gathered so every rank gets the whole output.

:func:`tensor_parallel` shards every lowvm layer a model's tensor-parallel plan names, in
place, after the model is loaded on every rank; :mod:`lowvm.nn.hf.quantizer` calls it for
``from_pretrained(path, tp_plan="auto")``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lowvm.errors import LowvmError
from lowvm.nn.errors import QuantizationError
from lowvm.nn.layer.backend import IN_FEATURES_MULTIPLE, OUT_FEATURES_MULTIPLE
from lowvm.nn.layer.quant_linear import QuantLinear
from lowvm.nn.layer.spec import make_spec
from lowvm.nn.swap import set_module

__all__ = ["TensorParallelError", "STYLES", "shard_problem", "shard_quant_linear",
           "tensor_parallel", "model_tp_plan", "lowvm_styles", "AllReduceOutput",
           "GatherOutput", "is_sharded", "generic_name"]

#: the plan styles lowvm layers can take
STYLES = ("colwise", "rowwise", "colwise_gather_output")
_SHARD_ATTR = "_lowvm_tp"  # set on a sharded layer: (style, rank, world)
_FUSED_ATTR = "_lowvm_fused"  # lowvm.nn.serve.fuse's record of a fused child's parts


class TensorParallelError(LowvmError, ValueError):
    """A layer that cannot be split as the plan asks, or a bad rank, world or style."""


def generic_name(name: str) -> str:
    """``name`` with its layer numbers as ``*``, as transformers writes plan keys."""
    return re.sub(r"(?:(?<=\.)|^)\d+(?=\.|$)", "*", name)


def is_sharded(layer: nn.Module) -> bool:
    """True for a layer :func:`shard_quant_linear` made (it is never split twice)."""
    return getattr(layer, _SHARD_ATTR, None) is not None


# --------------------------------------------------------------------------------------
# One layer


def _check_rank(rank: Any, world: Any, where: str) -> None:
    for what, value in (("world", world), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TensorParallelError(f"{where}: {what} must be an int; got {value!r}")
    if world < 1 or not 0 <= rank < world:
        raise TensorParallelError(f"{where}: rank must lie in [0, world) with world >= 1; "
                                  f"got rank={rank}, world={world}")


def _colwise_problem(sizes: Sequence[int], world: int) -> str | None:
    for n in sizes:
        if n % world or (n // world) % OUT_FEATURES_MULTIPLE:
            what = "out_features" if len(sizes) == 1 else "a fused part's out_features"
            return (f"colwise: {what}={n} split over {world} ranks must give a multiple of "
                    f"{OUT_FEATURES_MULTIPLE} per rank (the kernel's N tile); "
                    f"{n}/{world} = {n / world:g}")
    return None


def _rowwise_problem(layer: QuantLinear, world: int) -> str | None:
    k, group = layer.in_features, layer.spec.group_size
    if layer.input_perm is not None:
        return ("rowwise: the layer is GPTQ act-order (it permutes its inputs), so its groups "
                "mix input channels of every rank's slice; quantize it without act-order, "
                "or keep it unsplit")
    if k % world:
        return f"rowwise: in_features={k} does not split over {world} ranks"
    local = k // world
    if local % IN_FEATURES_MULTIPLE:
        return (f"rowwise: in_features={k} split over {world} ranks gives {local} per rank, "
                f"not a multiple of {IN_FEATURES_MULTIPLE} (the kernel's K tile)")
    if group != k and local % group:
        return (f"rowwise: in_features={k} split over {world} ranks gives {local} per rank, "
                f"not a whole number of groups of {group}")
    try:
        make_spec(layer.spec.wtype, group if group != k else local, layer.spec.zero_point,
                  local, layer.out_features)
    except QuantizationError as exc:
        return f"rowwise: the shard [{layer.out_features}, {local}] is not a kernel shape ({exc})"
    return None


def _parts(layer: QuantLinear, parts: Sequence[int] | None) -> list[int]:
    sizes = [layer.out_features] if parts is None else [int(n) for n in parts]
    if sum(sizes) != layer.out_features:
        raise TensorParallelError(f"shard_quant_linear: parts {list(sizes)} do not add up to "
                                  f"out_features={layer.out_features}")
    return sizes


def shard_problem(layer: Any, style: str, world: int, parts: Sequence[int] | None = None
                  ) -> str | None:
    """Why ``layer`` cannot be split ``style``-wise over ``world`` ranks (a sentence), or
    None. ``parts``: the out_features of a fused layer's parts, each split on its own."""
    if not isinstance(layer, QuantLinear):
        return f"it is {type(layer).__name__}, not a lowvm QuantLinear"
    if style not in STYLES:
        return f"style {style!r} is not one lowvm layers take ({', '.join(STYLES)})"
    if is_sharded(layer):
        return "it is already a tensor-parallel shard"
    if style == "rowwise":
        if parts is not None and len(parts) > 1:
            return "rowwise: a fused layer is split along its outputs only (colwise)"
        return _rowwise_problem(layer, world)
    return _colwise_problem(_parts(layer, parts), world)


@torch.no_grad()
def shard_quant_linear(layer: QuantLinear, style: str, rank: int, world: int,
                       name: str = "layer", parts: Sequence[int] | None = None
                       ) -> QuantLinear:
    """A new ``QuantLinear`` holding rank ``rank``'s shard of ``layer`` (see the module
    docstring for the styles); ``layer`` is not changed. ``name`` (the layer's name in its
    model) goes into errors; ``parts``: a fused layer's part sizes, each split apart.
    The shard's dequantized weight is exactly the matching slice of ``layer``'s."""
    _check_rank(rank, world, f"shard_quant_linear({name!r})")
    problem = shard_problem(layer, style, world, parts)
    if problem:
        raise TensorParallelError(f"layer {name!r} cannot be split over {world} ranks: "
                                  f"{problem}")
    spec, codes = layer.spec, layer.codes()
    n, k = layer.out_features, layer.in_features
    scales, zeros, bias = layer.scales, layer.zeros, layer.bias
    group = spec.group_size
    if style == "rowwise":
        local = k // world
        cols = slice(rank * local, (rank + 1) * local)
        codes = codes[:, cols]
        if group == k:  # one group per row: each shard keeps the row's scale
            group = local
        else:
            gsl = slice(rank * local // group, (rank + 1) * local // group)
            scales = scales[gsl]
            zeros = zeros[gsl] if zeros is not None else None
        bias = bias if rank == 0 else None
        shape = (local, n)
    else:
        rows = torch.cat([torch.arange(start + rank * (p // world),
                                       start + (rank + 1) * (p // world))
                          for start, p in zip(_starts(_parts(layer, parts)),
                                              _parts(layer, parts), strict=True)])
        rows = rows.to(codes.device)
        codes = codes.index_select(0, rows)
        scales = scales.index_select(1, rows.to(scales.device))
        zeros = zeros.index_select(1, rows.to(zeros.device)) if zeros is not None else None
        bias = bias.index_select(0, rows.to(bias.device)) if bias is not None else None
        shape = (k, rows.numel())
    shard = QuantLinear(shape[0], shape[1], spec.wtype, group, spec.zero_point,
                        bias=bias is not None, act_order=layer.input_perm is not None,
                        device=layer.qweight.device,
                        bias_dtype=bias.dtype if bias is not None else torch.float16)
    shard.set_codes(codes.contiguous(), scales.contiguous(),
                    zeros.contiguous() if zeros is not None else None, layer.input_perm)
    if bias is not None and shard.bias is not None:
        shard.bias.copy_(bias)
    shard.train(layer.training)
    object.__setattr__(shard, _SHARD_ATTR, (style, rank, world))
    return shard


def _starts(sizes: Sequence[int]) -> list[int]:
    out, total = [], 0
    for n in sizes:
        out.append(total)
        total += n
    return out


# --------------------------------------------------------------------------------------
# Communication


class AllReduceOutput:
    """Forward hook of a rowwise shard: sums the ranks' partial outputs in place.

    ``timer`` (a list, or None): when set, CUDA events around each all-reduce are appended
    to it, so a caller can read the time an eager step spends communicating."""

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self.timer: list[tuple[Any, Any]] | None = None

    def __call__(self, module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        with _timed(self.timer, output):
            dist.all_reduce(output, group=self.group)
        return output


@contextlib.contextmanager
def _timed(timer: list[tuple[Any, Any]] | None, tensor: torch.Tensor) -> Iterator[None]:
    """CUDA events around the body, appended to ``timer`` (nothing when it is None)."""
    if timer is None or not tensor.is_cuda:
        yield
        return
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    yield
    end.record()
    timer.append((start, end))


class GatherOutput:
    """Forward hook of a ``colwise_gather_output`` shard: every rank gets the whole output
    (the shards' outputs side by side along the last dimension)."""

    def __init__(self, group: Any = None) -> None:
        self.group = group
        self.timer: list[tuple[Any, Any]] | None = None  # as AllReduceOutput's

    def __call__(self, module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        world = dist.get_world_size(self.group)
        local = output.contiguous()
        flat = local.new_empty((world * local.shape[0], *local.shape[1:]))
        with _timed(self.timer, local):
            dist.all_gather_into_tensor(flat, local, group=self.group)
        gathered = flat.view(world, *local.shape)
        return gathered.movedim(0, -2).reshape(*local.shape[:-1], world * local.shape[-1])


def communication_hook(layer: nn.Module, style: str, group: Any = None) -> Any:
    """Install the hook ``style`` needs on ``layer`` (none for colwise); return it."""
    if style == "rowwise":
        hook: Any = AllReduceOutput(group)
    elif style == "colwise_gather_output":
        hook = GatherOutput(group)
    else:
        return None
    layer.register_forward_hook(hook)
    return hook


# --------------------------------------------------------------------------------------
# A whole model


def _base_prefix(model: nn.Module) -> str:
    base = getattr(model, "base_model", model)
    if base is model:
        return ""
    for name, module in model.named_children():
        if module is base:
            return name + "."
    return ""


def model_tp_plan(model: nn.Module) -> dict[str, str]:
    """The model's full tensor-parallel plan (keys relative to ``model``, layer numbers as
    ``*``): its config's ``base_model_tp_plan`` under the base model's name, and the plans
    the model classes declare (e.g. ``lm_head``). Read from the config and classes, so
    entries transformers was told to leave to lowvm are still here."""
    plan: dict[str, str] = {}
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    base_plan = getattr(text, "base_model_tp_plan", None) or {}
    prefix = _base_prefix(model)
    plan.update({prefix + key: style for key, style in base_plan.items()})
    for name, module in model.named_modules():
        own = getattr(type(module), "_tp_plan", None)
        if isinstance(own, Mapping):
            lead = f"{name}." if name else ""
            plan.update({lead + key: style for key, style in own.items()})
    return plan


def _style_of(name: str, plan: Mapping[str, str]) -> str | None:
    return plan.get(generic_name(name), plan.get(name))


def _fused_style(module: nn.Module, module_name: str, child: str,
                 plan: Mapping[str, str]) -> str | None:
    """The style of a fused child: its parts' style, which must be one."""
    parts = getattr(module, _FUSED_ATTR)[child]
    lead = f"{module_name}." if module_name else ""
    styles = {_style_of(lead + part, plan) for part, _ in parts}
    if len(styles) != 1:
        raise TensorParallelError(
            f"layer {lead + child!r} fuses {[p for p, _ in parts]}, whose tensor-parallel "
            f"styles differ ({sorted(map(str, styles))}); one GEMM is split one way")
    return styles.pop()


def lowvm_styles(model: nn.Module, plan: Mapping[str, str] | None = None
                 ) -> dict[str, tuple[str, list[int] | None]]:
    """``{layer name: (style, fused part sizes or None)}`` for every lowvm layer of
    ``model`` the plan names (fused q/k/v and gate/up layers through their parts)."""
    plan = model_tp_plan(model) if plan is None else dict(plan)
    found: dict[str, tuple[str, list[int] | None]] = {}
    for name, module in model.named_modules():
        fused = getattr(module, _FUSED_ATTR, None) or {}
        for child_name, child in module.named_children():
            if not isinstance(child, QuantLinear):
                continue
            full = f"{name}.{child_name}" if name else child_name
            if child_name in fused:
                style = _fused_style(module, name, child_name, plan)
                sizes: list[int] | None = [n for _, n in fused[child_name]]
            else:
                style, sizes = _style_of(full, plan), None
            if style is not None:
                found[full] = (style, sizes)
    return found


def _group_rank(group: Any) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise TensorParallelError("tensor_parallel: torch.distributed is not initialized; "
                                  "launch with torchrun (or call init_process_group) first")
    return dist.get_rank(group), dist.get_world_size(group)


def _update_fused_records(model: nn.Module, name: str, world: int) -> None:
    """A fused child split colwise: its parent's records of part sizes become local."""
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name)
    fused = getattr(parent, _FUSED_ATTR, None)
    if not fused or child not in fused:
        return
    fused[child] = tuple((part, n // world) for part, n in fused[child])
    if child == "qkv_proj" and hasattr(parent, "_lowvm_qkv"):
        object.__setattr__(parent, "_lowvm_qkv", tuple(n for _, n in fused[child]))
    if hasattr(parent, "intermediate_size") and child == "gate_up_proj":
        parent.intermediate_size = parent.intermediate_size // world


def tensor_parallel(model: nn.Module, group: Any = None,
                    plan: Mapping[str, str] | None = None) -> dict[str, str]:
    """Shard, in place, every lowvm layer of ``model`` its tensor-parallel plan names.

    Call it on every rank of ``group`` (None: the default process group) after the model is
    loaded there; every rank must hold the same weights. ``plan``: ``{module name (layer
    numbers as *): style}``; None reads the model's own (its config's
    ``base_model_tp_plan``, as transformers does). Every layer is checked before any
    changes, so a layer that cannot be split (:class:`TensorParallelError`, naming it and
    why) leaves the model as it was. Layers the plan does not name, and other modules,
    stay whole (replicated). Returns ``{layer name: style}`` of the layers split.
    """
    if not isinstance(model, nn.Module):
        raise TensorParallelError(f"tensor_parallel: model must be a torch.nn.Module; got "
                                  f"{type(model).__name__}")
    if plan is not None and not isinstance(plan, Mapping):
        raise TensorParallelError(f"tensor_parallel: plan must be a dict of module name to "
                                  f"style; got {type(plan).__name__}")
    rank, world = _group_rank(group)
    targets = {name: entry for name, entry in lowvm_styles(model, plan).items()
               if not is_sharded(model.get_submodule(name))}
    for name, (style, sizes) in targets.items():
        problem = shard_problem(model.get_submodule(name), style, world, sizes)
        if problem:
            raise TensorParallelError(f"layer {name!r} cannot be split over {world} ranks: "
                                      f"{problem}")
    done: dict[str, str] = {}
    for name, (style, sizes) in targets.items():
        shard = shard_quant_linear(model.get_submodule(name), style, rank, world, name, sizes)
        communication_hook(shard, style, group)
        set_module(model, name, shard)
        if style != "rowwise" and sizes is not None:
            _update_fused_records(model, name, world)
        done[name] = style
    return done
