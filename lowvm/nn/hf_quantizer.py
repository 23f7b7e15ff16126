"""lowvm as a Hugging Face transformers quantization backend.

``LowvmConfig`` is registered as quantization method ``"lowvm"``, so

* ``from_pretrained(path, quantization_config=LowvmConfig(dtype="int4"))`` loads the dense
  weights, then quantizes the linear layers (:func:`~lowvm.nn.model.quantize_model`);
* a checkpoint saved from a lowvm model records every layer's format in
  ``config.quantization_config.modules``; a plain ``from_pretrained(path)`` then builds empty
  ``QuantLinear`` layers of those formats before the packed tensors are loaded into them.
  The packed tensors are in the GPU kernel's repacked layout; each entry's
  ``kernel_format`` names that layout's version, and a checkpoint of another version is
  refused (:class:`~lowvm.nn.errors.WeightFormatError`) before any layer is built.

Only hooks present in transformers 5.17, 5.23 and 5.24 are used:
``_process_model_before/after_weight_loading``, ``update_dtype``, ``is_serializable``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from transformers.quantizers.auto import (
    AUTO_QUANTIZATION_CONFIG_MAPPING,
    AUTO_QUANTIZER_MAPPING,
    register_quantization_config,
    register_quantizer,
)
from transformers.quantizers.base import HfQuantizer

from lowvm.nn.errors import QuantizationError
from lowvm.nn.hf_config import METHOD, LowvmConfig

__all__ = ["LowvmConfig", "LowvmHfQuantizer", "register"]


def _shell(linear: nn.Linear, entry: Mapping[str, Any], name: str) -> nn.Module:
    """An empty QuantLinear of the recorded format, to be filled by the checkpoint."""
    from lowvm.nn.quant_linear import QuantLinear

    dt = linear.weight.dtype
    return QuantLinear(linear.in_features, linear.out_features, entry["dtype"],
                       entry.get("group_size"), entry.get("zero_point"),
                       bias=bool(entry.get("bias", linear.bias is not None)),
                       act_order=bool(entry.get("act_order", False)),
                       device=linear.weight.device,
                       bias_dtype=dt if dt in (torch.float16, torch.bfloat16) else torch.float16)


def _check_recorded_format(shell: nn.Module, entry: Mapping[str, Any], name: str) -> None:
    """The checkpoint's packed weights must be in the kernel format this lowvm stores."""
    from lowvm.nn.errors import WeightFormatError

    expected = shell.kernel_format.fingerprint
    recorded = entry.get("kernel_format")
    if recorded == expected:
        return
    why = (f"was saved in kernel format {recorded}" if recorded is not None else
           "records no kernel format (a checkpoint of older lowvm, which saved plain "
           "bit-stream rows)")
    raise WeightFormatError(f"LowvmConfig.modules[{name!r}]: the checkpoint's layer {why}; "
                            f"this lowvm stores {entry.get('dtype')} weights of that group "
                            f"size as format {expected}. Quantize the dense model again, or "
                            "load the checkpoint with the lowvm that saved it and move the "
                            "codes over (QuantLinear.codes() there, set_codes here)")


class LowvmHfQuantizer(HfQuantizer):
    """Builds lowvm layers for ``from_pretrained`` (see the module docstring)."""

    requires_calibration = False

    def update_dtype(self, dtype: torch.dtype | None) -> torch.dtype:
        """lowvm layers take float16/bfloat16 activations: float32 (or unset) becomes float16."""
        if dtype is None or dtype == torch.float32:
            return torch.float16
        return dtype

    def _process_model_before_weight_loading(self, model: nn.Module, **kwargs: Any) -> nn.Module:
        if not self.pre_quantized:
            return model
        modules = dict(model.named_modules())
        entries = self.quantization_config.modules
        missing = [name for name in entries if not isinstance(modules.get(name), nn.Linear)]
        if missing:
            raise QuantizationError(f"LowvmConfig.modules names layers the model has no "
                                    f"nn.Linear for: {missing[:5]}; the checkpoint does not "
                                    "match this model class")
        shells = {name: _shell(modules[name], entry, name) for name, entry in entries.items()}
        for name, shell in shells.items():  # before any swap: a refusal changes nothing
            _check_recorded_format(shell, entries[name], name)
        for name, shell in shells.items():
            parent, _, child = name.rpartition(".")
            setattr(modules[parent] if parent else model, child, shell)
        return model

    def _process_model_after_weight_loading(self, model: nn.Module, **kwargs: Any) -> nn.Module:
        if not self.pre_quantized:
            from lowvm.nn.model import quantize_model  # loads the kernels: only when used

            settings = self.quantization_config.quantize_kwargs()
            report = quantize_model(model, progress=True, **settings)
            self.quantization_config.modules = report.modules()
            model.config.quantization_config = self.quantization_config
        return model

    def is_serializable(self, *args: Any, **kwargs: Any) -> bool:
        return True

    @property
    def is_trainable(self) -> bool:
        return False

    @property
    def is_compileable(self) -> bool:
        return True


def register() -> None:
    """Add ``"lowvm"`` to transformers' quantization registries (idempotent)."""
    if AUTO_QUANTIZATION_CONFIG_MAPPING.get(METHOD) is not LowvmConfig:
        AUTO_QUANTIZATION_CONFIG_MAPPING.pop(METHOD, None)
        register_quantization_config(METHOD)(LowvmConfig)
    if AUTO_QUANTIZER_MAPPING.get(METHOD) is not LowvmHfQuantizer:
        AUTO_QUANTIZER_MAPPING.pop(METHOD, None)
        register_quantizer(METHOD)(LowvmHfQuantizer)


register()
