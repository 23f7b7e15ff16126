"""Quantized layers for PyTorch and Hugging Face models.

``QuantLinear`` (a low-bit ``nn.Linear``), ``quantize_model`` (replace a model's linears),
``LowvmConfig`` (quantize while ``from_pretrained`` loads), ``from_pretrained`` (any
checkpoint, GPTQ/AWQ/compressed-tensors included, onto lowvm layers),
``dequantize_model``, the per-layer GPTQ/AWQ/compressed-tensors importers and
``fuse_projections`` (q/k/v and gate/up in one GEMM each, for serving),
``use_decode_attention`` (decode steps' attention on a VM program) and
``shard_quant_linear`` (one rank's tensor-parallel shard of a layer; the whole-model
``tensor_parallel`` function is ``lowvm.nn.serve.tensor_parallel.tensor_parallel``, also
``lowvm.tensor_parallel``).
Names load lazily so that ``import lowvm`` does not pay for torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

from lowvm.extras import reraise_missing

__all__ = ["QuantLinear", "quantize_model", "QuantReport", "LowvmConfig", "from_gptq",
           "from_awq", "QuantizationError", "ActivationError", "CheckpointImportError",
           "WeightFormatError", "LowvmFallbackWarning", "fuse_projections", "FuseReport",
           "FuseError", "FusedGateUpMLP", "concat_out_features", "use_decode_attention",
           "AttentionError", "from_pretrained", "dequantize_model", "from_compressed_tensors",
           "shard_quant_linear", "TensorParallelError", "CheckpointError",
           "CheckpointNotFoundError", "LayerSkippedWarning"]

_WHERE = {
    "QuantLinear": "lowvm.nn.layer.quant_linear",
    "quantize_model": "lowvm.nn.quantize.model",
    "QuantReport": "lowvm.nn.quantize.model",
    "LowvmConfig": "lowvm.nn.hf.quantizer",
    "from_gptq": "lowvm.nn.hf.checkpoint_import",
    "from_awq": "lowvm.nn.hf.checkpoint_import",
    "from_compressed_tensors": "lowvm.nn.hf.checkpoint_import",
    "from_pretrained": "lowvm.nn.hf.loading",
    "dequantize_model": "lowvm.nn.layer.dequantize",
    "QuantizationError": "lowvm.nn.errors",
    "ActivationError": "lowvm.nn.errors",
    "CheckpointImportError": "lowvm.nn.errors",
    "WeightFormatError": "lowvm.nn.errors",
    "CheckpointError": "lowvm.nn.errors",
    "CheckpointNotFoundError": "lowvm.nn.errors",
    "LayerSkippedWarning": "lowvm.nn.quantize.model",
    "LowvmFallbackWarning": "lowvm.nn.layer.backend",
    **dict.fromkeys(("fuse_projections", "FuseReport", "FuseError", "FusedGateUpMLP",
                     "concat_out_features"), "lowvm.nn.serve.fuse"),
    **dict.fromkeys(("use_decode_attention", "AttentionError"), "lowvm.nn.serve.attention"),
    **dict.fromkeys(("shard_quant_linear", "TensorParallelError"),
                    "lowvm.nn.serve.tensor_parallel"),
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        try:
            module = importlib.import_module(_WHERE[name])
        except ModuleNotFoundError as exc:  # torch or transformers not installed
            reraise_missing(exc, f"lowvm.nn.{name}",
                            "hf" if _WHERE[name] == "lowvm.nn.hf.quantizer" else None)
            raise
        return getattr(module, name)
    raise AttributeError(f"module 'lowvm.nn' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
