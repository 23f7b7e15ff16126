"""Import a Hub quantized checkpoint's layers through transformers' loading.

Before loading, every linear layer the checkpoint stores quantized (it has the format's
packed tensor, e.g. ``<layer>.qweight``; the safetensors headers say so without reading a
weight) becomes an :class:`~lowvm.nn.hf.import_shell.ImportShell` of its format; layers stored
dense stay ``nn.Linear``. After loading, each shell is repacked into a QuantLinear.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from lowvm.nn.errors import CheckpointImportError
from lowvm.nn.hf.hub_formats import QUANTIZED_SUFFIXES, format_for, read_format
from lowvm.nn.hf.import_shell import ImportShell
from lowvm.nn.swap import set_module

__all__ = ["build_import_shells", "convert_import_shells", "checkpoint_keys"]


def build_import_shells(model: nn.Module, source: Mapping[str, Any],
                        checkpoint_files: list[str] | None) -> dict[str, str]:
    """Replace every linear the checkpoint stores quantized by an :class:`ImportShell`
    of its format; returns ``{layer name: method}``. Layers stored dense stay dense."""
    found = read_format(source)
    method = str(source.get("quant_method")).lower()
    keys = checkpoint_keys(checkpoint_files)
    marker = "." + QUANTIZED_SUFFIXES[method]
    linears = {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    prefix = getattr(model, "base_model_prefix", "") + "."
    layers: dict[str, set[str]] = {}
    for key in keys:
        module, _, tensor = key.rpartition(".")
        if module not in linears and module.startswith(prefix):
            module = module[len(prefix):]
        if module in linears:
            layers.setdefault(module, set()).add(tensor)
    quantized = {name: present for name, present in layers.items()
                 if marker[1:] in present}
    if not quantized:
        raise CheckpointImportError(f"the checkpoint's {method} quantization_config names no "
                                    f"layer that it stores quantized (no '*{marker}' tensor "
                                    "matches a linear layer of this model class)")
    shells = {}
    for name, present in quantized.items():
        linear = linears[name]
        fmt = format_for(found, name, "quantization_config")
        shells[name] = ImportShell(fmt, linear.in_features, linear.out_features, present,
                                   name, device=linear.weight.device)
    for name, shell in shells.items():  # every shell built (and checked) before any swap
        set_module(model, name, shell)
    return dict.fromkeys(shells, method)


def convert_import_shells(model: nn.Module) -> dict[str, Any]:
    """Turn every loaded :class:`ImportShell` into a QuantLinear (one at a time, so only
    one layer's unpacked codes exist at once); returns the layers' lowvm records."""
    names = [name for name, m in model.named_modules() if isinstance(m, ImportShell)]
    records = {}
    for name in names:
        layer = model.get_submodule(name).to_quant_linear()
        set_module(model, name, layer)
        records[name] = layer.layer_config()
    return records


def checkpoint_keys(checkpoint_files: list[str] | None) -> list[str]:
    """Every tensor name in the checkpoint's safetensors files (headers only)."""
    if not checkpoint_files:
        raise CheckpointImportError("importing a quantized checkpoint needs its safetensors "
                                    "files; transformers passed none")
    from safetensors import safe_open

    keys: list[str] = []
    for path in checkpoint_files:
        if not str(path).endswith(".safetensors"):
            raise CheckpointImportError(f"{path}: lowvm imports quantized checkpoints stored "
                                        "as safetensors")
        with safe_open(str(path), framework="pt") as f:
            keys.extend(f.keys())
    return keys
