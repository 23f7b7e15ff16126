"""The tensor-parallel half of lowvm's transformers quantizer.

With ``tp_plan="auto"`` (torchrun) transformers shards every planned parameter as a
DTensor, which cannot slice a ``QuantLinear``'s ``qweight`` (the kernel's repacked
layout). :class:`TensorParallelHooks` takes the plan's entries for lowvm layers out of
transformers' hands before loading (``update_tp_plan`` in transformers 5.17,
``update_parallel_plan`` in 5.24) and splits those layers with
:mod:`lowvm.nn.serve.tensor_parallel` once they are loaded (a layer quantized on load, as soon as
it is quantized). :class:`~lowvm.nn.hf.quantizer.LowvmHfQuantizer` mixes it in; it keeps
``tp_styles`` (layer -> style) and ``tp_records`` and provides ``plan`` and ``imported``.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from lowvm.nn.errors import QuantizationError
from lowvm.nn.swap import set_module as _set_module

__all__ = ["TensorParallelHooks", "tp_group", "tp_requested"]


class TensorParallelHooks:
    """Mixed into the quantizer before ``HfQuantizer`` (``super()`` reaches its hooks)."""

    tp_styles: dict[str, str]
    tp_records: dict[str, Any]
    plan: dict[str, Any]
    imported: dict[str, str]

    def _lowvm_layer_names(self, model: nn.Module) -> set[str]:
        """Layers that are (or will be, once their weight is read) lowvm layers."""
        from lowvm.nn.hf.import_shell import ImportShell
        from lowvm.nn.layer.quant_linear import QuantLinear

        names = {name for name, module in model.named_modules()
                 if isinstance(module, QuantLinear | ImportShell)}
        return names | set(self.plan) | set(self.imported)

    def _claim_tp_plan(self, model: nn.Module, plan: dict[str, str] | None = None) -> None:
        """Take the plan's entries for lowvm layers out of ``plan`` (the model's own, in
        place), remembering their styles: lowvm splits those layers itself after loading."""
        from lowvm.nn.serve.tensor_parallel import STYLES, generic_name

        if not tp_requested(model):  # every model has a plan; it is used only under TP
            return
        plan = getattr(model, "tp_plan", None) if plan is None else plan
        if not isinstance(plan, dict) or not plan:
            return
        lowvm = self._lowvm_layer_names(model)
        if not lowvm:
            return
        modules = [name for name, _ in model.named_modules()]
        for key, style in list(plan.items()):
            matched = [name for name in modules if generic_name(name) == key or name == key]
            mine = [name for name in matched if name in lowvm]
            if not mine:
                continue
            others = [name for name in matched if name not in lowvm]
            if others:
                raise QuantizationError(
                    f"tensor parallelism: the plan entry {key!r} covers lowvm layers "
                    f"({mine[0]!r}, ...) and dense ones ({others[0]!r}, ...); lowvm splits its "
                    "layers itself, so quantize all of them or none (LowvmConfig dtype/skip)")
            if style not in STYLES:
                raise QuantizationError(
                    f"tensor parallelism: layer {mine[0]!r} is planned {style!r}, a split "
                    f"lowvm layers do not take (accepted: {', '.join(STYLES)}); skip it in "
                    "LowvmConfig(skip=...) to keep it dense")
            self.tp_styles.update(dict.fromkeys(mine, style))
            del plan[key]
        model._lowvm_tp_styles = dict(self.tp_styles)

    def update_tp_plan(self, config: Any) -> Any:
        """transformers 5.17, before the model exists: which layers lowvm quantizes is
        known only once it is built, so the plan is trimmed in
        ``_process_model_before_weight_loading`` (before transformers applies it)."""
        return config

    def update_parallel_plan(self, model: nn.Module, plan: dict[str, str]) -> None:
        """transformers 5.24: the model's plan without the entries of lowvm layers."""
        parent = getattr(super(), "update_parallel_plan", None)
        if parent is not None:
            parent(model, plan)
        self._claim_tp_plan(model, plan)

    def _shard_now(self, model: nn.Module, name: str) -> None:
        """Split lowvm layer ``name`` if the model is tensor-parallel and the plan names it."""
        style = self.tp_styles.get(name)
        group = tp_group(model)
        if style is None or group is None:
            return
        import torch.distributed as dist

        from lowvm.nn.serve.tensor_parallel import communication_hook, shard_quant_linear

        layer = model.get_submodule(name)
        self.tp_records[name] = layer.layer_config()
        shard = shard_quant_linear(layer, style, dist.get_rank(group),
                                   dist.get_world_size(group), name)
        communication_hook(shard, style, group)
        _set_module(model, name, shard)

    def _shard_loaded(self, model: nn.Module) -> None:
        """After loading: split every planned lowvm layer not split yet (all are checked
        before any is replaced)."""
        group = tp_group(model)
        if group is None or not self.tp_styles:
            return
        import torch.distributed as dist

        from lowvm.nn.layer.quant_linear import QuantLinear
        from lowvm.nn.serve.tensor_parallel import TensorParallelError, is_sharded, shard_problem

        world = dist.get_world_size(group)
        todo = [name for name in self.tp_styles
                if isinstance(model.get_submodule(name), QuantLinear)
                and not is_sharded(model.get_submodule(name))]
        for name in todo:
            problem = shard_problem(model.get_submodule(name), self.tp_styles[name], world)
            if problem:
                raise TensorParallelError(f"layer {name!r} cannot be split over {world} "
                                          f"ranks: {problem}")
        for name in todo:
            self._shard_now(model, name)


def tp_requested(model: nn.Module) -> bool:
    """Whether this load splits the model over ranks. transformers 5.24 records the
    ``distributed_config`` (with its resolved ``tp_size``) on the config before it builds
    the model; before that, tensor parallelism needs torch.distributed over several ranks."""
    distributed = getattr(getattr(model, "config", None), "distributed_config", None)
    if distributed is not None:
        return (getattr(distributed, "tp_size", None) or 1) > 1
    size = getattr(model, "_tp_size", None)
    if isinstance(size, int):
        return size > 1
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def tp_group(model: nn.Module) -> Any:
    """The tensor-parallel process group transformers set the model up with, or None.

    5.17 keeps the TP mesh as ``model._device_mesh`` (a ``"tp"`` dimension when it has
    several); 5.24 a mesh manager, ``model._mesh_manager.get_mesh("tp")``."""
    size = getattr(model, "_tp_size", None)
    if not isinstance(size, int) or size <= 1:
        return None
    manager = getattr(model, "_mesh_manager", None)
    mesh = manager.get_mesh("tp") if manager is not None else getattr(model, "_device_mesh",
                                                                       None)
    if mesh is None:
        return None
    if mesh.ndim > 1:
        mesh = mesh["tp"]
    return mesh.get_group()
