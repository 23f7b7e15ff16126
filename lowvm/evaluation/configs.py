"""The models the benchmark trains, by name: shapes and the training recipe.

Every linear dimension is a multiple of 128 so that group size 128 divides each layer's
input features and every lowvm kernel tile fits; ``tiny`` is for CPU tests (seconds),
``small`` (about 24 M parameters) for the GPU benchmark.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from transformers import LlamaConfig

from lowvm.evaluation.errors import EvaluationError

__all__ = ["ModelRecipe", "RECIPES", "recipe", "llama_config"]

VOCAB = 256  # byte-level tokens


@dataclass(frozen=True)
class ModelRecipe:
    """A Llama shape plus how to train it."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    seq_len: int  # training and evaluation sequence length (bytes)
    batch_size: int  # sequences per training step
    learning_rate: float  # peak
    train_seconds: float  # default wall-clock budget
    eval_sequences: int  # default number of held-out sequences scored
    weight_decay: float = 0.1
    warmup: float = 0.05  # fraction of training spent warming up
    final_lr: float = 0.1  # fraction of the peak reached at the end (cosine decay)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


RECIPES: dict[str, ModelRecipe] = {
    "tiny": ModelRecipe(hidden=128, layers=2, heads=4, kv_heads=2, intermediate=256,
                        seq_len=64, batch_size=8, learning_rate=3e-3, train_seconds=10.0,
                        eval_sequences=16),
    "small": ModelRecipe(hidden=512, layers=8, heads=8, kv_heads=2, intermediate=1536,
                         seq_len=512, batch_size=64, learning_rate=1e-3, train_seconds=180.0,
                         eval_sequences=1024),
}


def recipe(name: str) -> ModelRecipe:
    """The recipe called ``name``; an unknown name is an :class:`EvaluationError`."""
    if name not in RECIPES:
        raise EvaluationError(f"config {name!r} is not one of {', '.join(sorted(RECIPES))}")
    return RECIPES[name]


def llama_config(r: ModelRecipe) -> LlamaConfig:
    """The transformers config of ``r``: untied embeddings (lm_head is its own layer, left
    dense by ``quantize_model``'s default), byte vocabulary, positions up to ``seq_len``."""
    return LlamaConfig(vocab_size=VOCAB, hidden_size=r.hidden, intermediate_size=r.intermediate,
                       num_hidden_layers=r.layers, num_attention_heads=r.heads,
                       num_key_value_heads=r.kv_heads, max_position_embeddings=r.seq_len,
                       rms_norm_eps=1e-5, tie_word_embeddings=False,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)
