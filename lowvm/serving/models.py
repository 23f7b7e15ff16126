"""The models a serving measurement compares: random Llamas of preset shapes, built where
they run, and quantized copies that share every tensor they do not quantize."""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

from lowvm.dtypes import dtype as lowvm_dtype
from lowvm.nn.layer.quant_linear import QuantLinear
from lowvm.nn.quantize.model import quantize_model
from lowvm.serving.errors import ServingError

__all__ = ["PRESETS", "SHAPE_FIELDS", "random_config", "init_random", "load_pretrained",
           "shared_copy", "quantized_copy", "weight_bytes"]

#: random Llama shapes by name: ``tiny`` (CI) and Llama-3-8B's (nothing is downloaded)
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"hidden": 128, "intermediate": 256, "layers": 2, "heads": 4, "kv_heads": 2,
             "vocab": 512, "max_positions": 1024, "rope_theta": 10000.0},
    "llama3-8b": {"hidden": 4096, "intermediate": 14336, "layers": 32, "heads": 32,
                  "kv_heads": 8, "vocab": 128256, "max_positions": 8192,
                  "rope_theta": 500000.0},
}
#: the preset fields :func:`random_config` lets a caller override
SHAPE_FIELDS = ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab")


def random_config(preset: str = "tiny", **overrides: int | None) -> LlamaConfig:
    """The Llama config of ``preset`` with any :data:`SHAPE_FIELDS` overridden (None: the
    preset's value)."""
    if preset not in PRESETS:
        raise ServingError(f"random_config: preset {preset!r} is not one of "
                           f"{', '.join(sorted(PRESETS))}")
    shape = dict(PRESETS[preset])
    for key, value in overrides.items():
        if key not in SHAPE_FIELDS:
            raise ServingError(f"random_config: shape field {key!r} is not one of "
                               f"{', '.join(SHAPE_FIELDS)}")
        if value is not None:
            shape[key] = value
    return LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                       intermediate_size=shape["intermediate"],
                       num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                       num_key_value_heads=shape["kv_heads"],
                       max_position_embeddings=shape["max_positions"], rms_norm_eps=1e-5,
                       rope_parameters={"rope_type": "default",
                                        "rope_theta": shape["rope_theta"]},
                       tie_word_embeddings=False)


def init_random(config: LlamaConfig, device: str | torch.device) -> Any:
    """A float16 model of ``config`` built where it will run (``meta``: nothing allocated).

    Every tensor is created on ``device`` in float16 and initialised there by transformers
    (normal(0, 0.02) linears and embeddings, unit norms): building 8B parameters on the CPU
    in float32 and casting would take minutes and 32 GB of host memory.
    """
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    model.requires_grad_(False)
    return model.eval()


def load_pretrained(path: str, device: str | torch.device) -> tuple[Any, Any]:
    """(float16 model of ``path``, a local path or Hugging Face id, on ``device``; its
    tokenizer, or None where it has none)."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float16)
    model.requires_grad_(False)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        tokenizer = None
    return model.to(device).eval(), tokenizer


def shared_copy(dense: Any) -> Any:
    """A copy of ``dense``'s module tree (and config) that shares every parameter and
    buffer: what a variant of the model changes is then its only new memory."""
    shared = {id(t): t for t in (*dense.parameters(), *dense.buffers())}
    return copy.deepcopy(dense, shared)


def quantized_copy(dense: Any, dtype: str, group_size: int, skip: tuple[str, ...],
                   lm_head: str | None = None) -> tuple[Any, Any]:
    """``(model, report)``: ``dense`` with its linears quantized (``lm_head`` to its own
    type when given); ``dense`` is unchanged.

    The copy shares every parameter and buffer of ``dense`` (only the module tree is
    copied), so the layers left dense and the embedding cost no memory twice; the
    quantized layers are the only new tensors.
    """
    model = shared_copy(dense)
    types = dtype if lm_head is None else {"lm_head": lm_head, "*": dtype}
    report = quantize_model(model, dtype=types, group_size=group_size, skip=skip,
                            progress=False)
    head = model.get_output_embeddings()
    if lm_head is not None and not (isinstance(head, QuantLinear)
                                    and head.spec.wtype == lowvm_dtype(lm_head)):
        raise ValueError(f"--lm-head {lm_head}: lm_head was left dense (tied to the "
                         f"embeddings, or matched by --skip {','.join(skip)!r})")
    return model, report


def weight_bytes(model: torch.nn.Module) -> dict[str, int]:
    """``stored``: state-dict tensors; ``resident``: every parameter and buffer (each once)."""
    stored: dict[int, int] = {}
    resident: dict[int, int] = {}
    for module in model.modules():
        tensors = [(t, True) for t in module._parameters.values() if t is not None]
        tensors += [(t, name not in module._non_persistent_buffers_set)
                    for name, t in module._buffers.items() if t is not None]
        for t, persistent in tensors:
            size = t.numel() * t.element_size()
            resident[id(t)] = size
            if persistent:
                stored[id(t)] = size
    return {"stored": sum(stored.values()), "resident": sum(resident.values())}
