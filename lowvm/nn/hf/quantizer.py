"""lowvm as a Hugging Face transformers quantization backend.

``LowvmConfig`` is registered as quantization method ``"lowvm"``, so

* ``from_pretrained(path, quantization_config=LowvmConfig(dtype="int4"))`` quantizes a
  dense checkpoint's linear layers (the settings of
  :func:`~lowvm.nn.quantize.model.quantize_model`): each dense weight is quantized the moment
  it is read (transformers' per-parameter hook, :class:`QuantizeOnLoad`), so the dense model
  never exists whole;
* a checkpoint saved from a lowvm model records every layer's format in
  ``config.quantization_config.modules``; a plain ``from_pretrained(path)`` then builds empty
  ``QuantLinear`` layers of those formats before the packed tensors are loaded into them.
  The packed tensors are in the GPU kernel's repacked layout; each entry's
  ``kernel_format`` names that layout's version, and a checkpoint of another version is
  refused (:class:`~lowvm.nn.errors.WeightFormatError`) before any layer is built, unless
  it is an earlier layout this lowvm still derives: those layers are converted once loaded;
* a ``LowvmConfig`` whose ``source`` is a GPTQ/AWQ/compressed-tensors checkpoint's own
  config (what :func:`lowvm.from_pretrained` passes) loads the packed tensors into
  :class:`~lowvm.nn.hf.import_shell.ImportShell` holders and repacks each into a QuantLinear
  (:mod:`lowvm.nn.hf.hub_import`).

After loading, the model's config records every layer (a lowvm checkpoint when saved) and
``save_pretrained`` also writes a model card saying the checkpoint needs lowvm.

With ``tp_plan="auto"`` (torchrun), the tensor-parallel plan's entries for lowvm layers
are taken out of transformers' hands (its DTensor sharding cannot slice the repacked
weights) and every such layer is split by :mod:`lowvm.nn.serve.tensor_parallel` once loaded (a
layer quantized on load, as soon as it is quantized); the rest of the model (embeddings,
``lm_head``, norms) is sharded or replicated by transformers as usual.

Only hooks present in transformers 5.17 to 5.24 are used:
``_process_model_before/after_weight_loading``, ``update_dtype``,
``param_needs_quantization`` with ``get_quantize_ops``, ``param_element_size``,
``_dequantize``,
``is_serializable``, and for tensor parallelism ``update_tp_plan`` (5.17) and
``update_parallel_plan`` (5.24).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from transformers.core_model_loading import ConversionOps
from transformers.quantizers.auto import (
    AUTO_QUANTIZATION_CONFIG_MAPPING,
    AUTO_QUANTIZER_MAPPING,
    register_quantization_config,
    register_quantizer,
)
from transformers.quantizers.base import HfQuantizer

from lowvm.nn.errors import QuantizationError
from lowvm.nn.hf.config import METHOD, LowvmConfig
from lowvm.nn.hf.tensor_parallel import TensorParallelHooks
from lowvm.nn.swap import set_module as _set_module

__all__ = ["LowvmConfig", "LowvmHfQuantizer", "QuantizeOnLoad", "register"]


def _shell(linear: nn.Linear, entry: Mapping[str, Any], name: str) -> nn.Module:
    """An empty QuantLinear of the recorded format, to be filled by the checkpoint."""
    from lowvm.nn.layer.quant_linear import QuantLinear, bias_dtype_for

    return QuantLinear(linear.in_features, linear.out_features, entry["dtype"],
                       entry.get("group_size"), entry.get("zero_point"),
                       bias=bool(entry.get("bias", linear.bias is not None)),
                       act_order=bool(entry.get("act_order", False)),
                       device=linear.weight.device,
                       bias_dtype=bias_dtype_for(linear.weight.dtype))


def _check_recorded_format(shell: nn.Module, entry: Mapping[str, Any], name: str) -> None:
    """The checkpoint's packed weights must be in the kernel format this lowvm stores."""
    from lowvm.nn.errors import WeightFormatError

    expected = shell.kernel_format.fingerprint
    recorded = entry.get("kernel_format")
    if recorded == expected or shell.expect_earlier_layout(recorded):
        return
    why = (f"was saved in kernel format {recorded}" if recorded is not None else
           "records no kernel format (a checkpoint of older lowvm, which saved plain "
           "bit-stream rows)")
    raise WeightFormatError(f"LowvmConfig.modules[{name!r}]: the checkpoint's layer {why}; "
                            f"this lowvm stores {entry.get('dtype')} weights of that group "
                            f"size as format {expected}. Quantize the dense model again, or "
                            "load the checkpoint with the lowvm that saved it and move the "
                            "codes over (QuantLinear.codes() there, set_codes here)")


class QuantizeOnLoad(ConversionOps):
    """transformers' per-weight hook: quantize one dense weight the moment it is read.

    The dense tensor arrives on the layer's target device; the layer is replaced by a
    :class:`QuantLinear` and the dense weight is dropped, so loading never holds more
    than one dense layer at a time beside the quantized model."""

    def __init__(self, quantizer: LowvmHfQuantizer) -> None:
        self.quantizer = quantizer

    def convert(self, input_dict: dict[str, Any], source_patterns: Any = None,
                target_patterns: Any = None, full_layer_name: str | None = None,
                model: nn.Module | None = None, missing_keys: Any = None,
                **kwargs: Any) -> dict[str, torch.Tensor]:
        value = next(iter(input_dict.values()))
        value = value[0] if isinstance(value, list) else value
        name = str(full_layer_name).rpartition(".")[0]
        try:
            self.quantizer.quantize_layer(model, name, value)
        except Exception as exc:  # noqa: BLE001
            # transformers turns a conversion error into a log line (or a generic
            # RuntimeError after its report): keep ours and raise it when loading ends
            self.quantizer.errors.append(exc)
        if missing_keys is not None:
            missing_keys.discard(full_layer_name)
        return {}


class LowvmHfQuantizer(TensorParallelHooks, HfQuantizer):
    """Builds lowvm layers for ``from_pretrained`` (see the module docstring)."""

    requires_calibration = False

    def __init__(self, quantization_config: LowvmConfig, **kwargs: Any) -> None:
        super().__init__(quantization_config, **kwargs)
        self.plan: dict[str, Any] = {}        # quantize-on-load: layer name -> QuantSpec
        self.errors: list[Exception] = []     # raised inside transformers' loading loop
        self.imported: dict[str, str] = {}    # import: layer name -> checkpoint method
        self.tp_styles: dict[str, str] = {}   # lowvm layer name -> tensor-parallel style
        self.tp_records: dict[str, Any] = {}  # quantized-on-load layers split at once

    def update_dtype(self, dtype: torch.dtype | None) -> torch.dtype:
        """lowvm layers take float16/bfloat16 activations: float32 (or unset) becomes
        float16, and an explicit float32 says so."""
        if dtype == torch.float32:
            warnings.warn("lowvm: dtype=torch.float32 requested, but lowvm layers compute in "
                          "float16 or bfloat16: the model loads as torch.float16 (pass "
                          "dtype=torch.bfloat16 for bfloat16)", stacklevel=2)
        if dtype is None or dtype == torch.float32:
            return torch.float16
        return dtype

    def _process_model_before_weight_loading(self, model: nn.Module, **kwargs: Any
                                             ) -> nn.Module:
        config = self.quantization_config
        if config.source is not None:
            from lowvm.nn.hf.hub_import import build_import_shells

            self.imported = build_import_shells(model, config.source,
                                                kwargs.get("checkpoint_files"))
        elif self.pre_quantized:
            _build_lowvm_shells(model, config.modules)
        else:
            if config.method != "rtn":
                raise QuantizationError(
                    f"LowvmConfig: method={config.method!r} cannot run while loading "
                    "(calibration runs the whole model forward); load the dense model, then "
                    "lowvm.quantize_model(model, method='gptq', calibration=batches)")
            from lowvm.nn.quantize.model import plan_layers  # loads the kernels: only when used

            self.plan, _ = plan_layers(model, loaded=False, **config.quantize_kwargs())
        self._claim_tp_plan(model)
        return model

    def param_needs_quantization(self, model: nn.Module, param_name: str, **kwargs: Any
                                 ) -> bool:
        module, _, tensor = param_name.rpartition(".")
        return not self.pre_quantized and tensor == "weight" and module in self.plan

    def param_element_size(self, model: nn.Module, param_name: str, param: torch.Tensor
                           ) -> float:
        """Bytes per weight once quantized (codes, scales, zero points): what transformers
        reserves on the GPU before loading, instead of the dense size."""
        module, _, tensor = param_name.rpartition(".")
        spec = self.plan.get(module) if not self.pre_quantized else None
        if spec is not None and tensor == "weight":
            return spec.wtype.nbits / 8 + (2 + 2 * spec.zero_point) / spec.group_size
        return param.element_size()

    def get_quantize_ops(self) -> QuantizeOnLoad:
        return QuantizeOnLoad(self)

    def quantize_layer(self, model: nn.Module, name: str, weight: torch.Tensor) -> None:
        """Replace the planned linear ``name`` by a QuantLinear of ``weight``."""
        from lowvm.nn.layer.quant_linear import QuantLinear

        spec = self.plan[name]
        layer = QuantLinear.from_weight(weight, spec.wtype, spec.group_size, spec.zero_point,
                                        bias=model.get_submodule(name).bias,
                                        where=f"layer {name!r}")
        _set_module(model, name, layer)
        self._shard_now(model, name)  # tensor-parallel: keep only this rank's shard

    def _process_model_after_weight_loading(self, model: nn.Module, **kwargs: Any) -> nn.Module:
        if self.errors:
            raise self.errors[0]
        config = self.quantization_config
        if config.source is not None:
            from lowvm.nn.hf.hub_import import convert_import_shells

            modules = convert_import_shells(model)
        elif self.pre_quantized:
            from lowvm.nn.layer.layout_migration import convert_earlier_layouts

            modules = dict(config.modules)
            for name in convert_earlier_layouts(model):  # now recorded in the current layout
                modules[name] = {**modules[name], "kernel_format":
                                 model.get_submodule(name).kernel_format.fingerprint}
        else:
            modules = self._finish_quantize_on_load(model)
        self._shard_loaded(model)
        record = LowvmConfig(dtype=config.dtype, group_size=config.group_size,
                             zero_point=config.zero_point, skip=config.skip,
                             modules=modules, method=config.method)
        self.quantization_config = record
        model.config.quantization_config = record
        from lowvm.nn.hf.model_card import attach_model_card

        attach_model_card(model)
        return model

    def _finish_quantize_on_load(self, model: nn.Module) -> dict[str, Any]:
        """Layers whose weight never passed through the hook (a tied or missing weight,
        filled in after loading) are quantized now; returns every layer's record."""
        from lowvm.nn.layer.quant_linear import QuantLinear

        left = [name for name in self.plan
                if isinstance(model.get_submodule(name), nn.Linear)]
        for name in left:
            weight = model.get_submodule(name).weight
            if weight.is_meta:
                raise QuantizationError(f"layer {name!r}: the checkpoint holds no weight for "
                                        "it, so there is nothing to quantize")
            self.quantize_layer(model, name, weight.detach())
        return {name: self.tp_records.get(name) or model.get_submodule(name).layer_config()
                for name in self.plan if isinstance(model.get_submodule(name), QuantLinear)}

    def _dequantize(self, model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
        from lowvm.nn.layer.dequantize import dequantize_model

        return dequantize_model(model, dtype)

    def is_serializable(self, *args: Any, **kwargs: Any) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False

    @property
    def is_compileable(self) -> bool:
        return True


def _build_lowvm_shells(model: nn.Module, entries: Mapping[str, Mapping[str, Any]]) -> None:
    """Empty QuantLinear layers of the formats a lowvm checkpoint records."""
    modules = dict(model.named_modules())
    missing = [name for name in entries if not isinstance(modules.get(name), nn.Linear)]
    if missing:
        raise QuantizationError(f"LowvmConfig.modules names layers the model has no "
                                f"nn.Linear for: {missing[:5]}; the checkpoint does not "
                                "match this model class")
    shells = {name: _shell(modules[name], entry, name) for name, entry in entries.items()}
    for name, shell in shells.items():  # before any swap: a refusal changes nothing
        _check_recorded_format(shell, entries[name], name)
    for name, shell in shells.items():
        _set_module(model, name, shell)


def register() -> None:
    """Add ``"lowvm"`` to transformers' quantization registries (idempotent)."""
    if AUTO_QUANTIZATION_CONFIG_MAPPING.get(METHOD) is not LowvmConfig:
        AUTO_QUANTIZATION_CONFIG_MAPPING.pop(METHOD, None)
        register_quantization_config(METHOD)(LowvmConfig)
    if AUTO_QUANTIZER_MAPPING.get(METHOD) is not LowvmHfQuantizer:
        AUTO_QUANTIZER_MAPPING.pop(METHOD, None)
        register_quantizer(METHOD)(LowvmHfQuantizer)


register()
