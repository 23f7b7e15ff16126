"""``lowvm.from_pretrained``: load any checkpoint onto lowvm layers in one call.

* a **GPTQ, AWQ or compressed-tensors** checkpoint (the Hub's layout: ``config.json`` with
  its ``quantization_config``, sharded safetensors) loads with every quantized layer
  repacked into a :class:`~lowvm.nn.layer.quant_linear.QuantLinear`; layers it stores dense
  stay dense;
* a **lowvm** checkpoint loads as saved;
* a **dense** checkpoint is quantized while it loads (``quantization_config``, default
  int4 with groups of 128).

Why a function and not ``AutoModel….from_pretrained(path,
quantization_config=LowvmConfig())``: transformers prefers a checkpoint's own
``quantization_config`` over the one passed, and refuses a config of another class (a
``ValueError``: "The model is quantized with GPTQConfig but you are passing a
LowvmConfig"). Routing a GPTQ checkpoint to lowvm that way would mean patching
transformers' internals. Instead this function reads the checkpoint's config, puts a
:class:`~lowvm.nn.hf.config.LowvmConfig` that records the original as ``source`` in its
place, and calls the ordinary ``from_pretrained`` with that config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lowvm.nn.errors import CheckpointImportError, QuantizationError
from lowvm.nn.hf.config import METHOD, LowvmConfig

__all__ = ["from_pretrained"]


def _auto_class(auto_class: Any) -> Any:
    import transformers

    if auto_class is None:
        return transformers.AutoModelForCausalLM
    if isinstance(auto_class, str):
        found = getattr(transformers, auto_class, None)
        if found is None or not hasattr(found, "from_pretrained"):
            raise QuantizationError(f"from_pretrained: auto_class={auto_class!r} is not a "
                                    "transformers model class (e.g. 'AutoModelForCausalLM')")
        return found
    if not hasattr(auto_class, "from_pretrained"):
        raise QuantizationError(f"from_pretrained: auto_class={auto_class!r} has no "
                                "from_pretrained (pass e.g. transformers.AutoModel)")
    return auto_class


def _as_dict(qconfig: Any) -> dict[str, Any]:
    if isinstance(qconfig, Mapping):
        return dict(qconfig)
    if hasattr(qconfig, "to_dict"):
        return dict(qconfig.to_dict())
    raise CheckpointImportError(f"the checkpoint's quantization_config is a "
                                f"{type(qconfig).__name__}; expected a dict")


def from_pretrained(path: Any, quantization_config: LowvmConfig | None = None, *,
                    auto_class: Any = None, **kwargs: Any) -> Any:
    """Load ``path`` (a directory or Hub id) onto lowvm layers; returns the model.

    ``quantization_config``: for a dense checkpoint, how to quantize it (None: int4, group
    128); for a GPTQ/AWQ/compressed-tensors checkpoint only ``None`` or a LowvmConfig
    without ``dtype`` (the checkpoint's own quantization is kept); for a lowvm checkpoint
    only ``None``. ``auto_class``: the transformers class to load with (default
    ``AutoModelForCausalLM``; a class or its name). Other keyword arguments go to
    ``from_pretrained`` unchanged (``dtype``, ``device_map``, ``revision``, ...).
    """
    from transformers import AutoConfig

    import lowvm.nn.hf.quantizer  # noqa: F401  (registers the "lowvm" method)

    if quantization_config is not None and not isinstance(quantization_config, LowvmConfig):
        raise QuantizationError(f"from_pretrained: quantization_config must be a "
                                f"lowvm.LowvmConfig or None; got "
                                f"{type(quantization_config).__name__}")
    if "config" in kwargs:
        raise QuantizationError("from_pretrained: config= is not accepted; lowvm builds the "
                                "config from the checkpoint's own")
    cls = _auto_class(auto_class)
    config_keys = ("revision", "token", "cache_dir", "trust_remote_code", "local_files_only",
                   "subfolder")
    config = AutoConfig.from_pretrained(path, **{k: kwargs[k] for k in config_keys
                                                 if k in kwargs})
    found = getattr(config, "quantization_config", None)
    if found is None:  # dense: quantize while loading
        return cls.from_pretrained(path, config=config,
                                   quantization_config=quantization_config or LowvmConfig(),
                                   **kwargs)
    source = _as_dict(found)
    method = str(source.get("quant_method", "")).lower()
    if method == METHOD:
        if quantization_config is not None:
            raise QuantizationError(f"from_pretrained: {path} is already a lowvm checkpoint; "
                                    "pass no quantization_config")
        return cls.from_pretrained(path, config=config, **kwargs)
    if quantization_config is not None and quantization_config.dtype is not None:
        raise QuantizationError(
            f"from_pretrained: {path} is a {method} checkpoint and keeps its own "
            f"quantization; LowvmConfig(dtype={quantization_config.dtype!r}) cannot change "
            "it (pass LowvmConfig() or nothing; to requantize, dequantize first)")
    from lowvm.nn.hf.hub_formats import read_format

    read_format(source)  # an unsupported variant fails here, before any weight is read
    config.quantization_config = LowvmConfig(source=source).to_dict()
    return cls.from_pretrained(path, config=config, **kwargs)
