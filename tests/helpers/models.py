"""A tiny random Llama: two layers, hidden 128, vocab 256, small enough for CPU tests."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(seed: int = 0, dtype: torch.dtype = torch.float16, tie: bool = False,
               **config_overrides):
    torch.manual_seed(seed)
    fields = {"vocab_size": 256, "hidden_size": 128, "intermediate_size": 256,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 64, **config_overrides}
    config = LlamaConfig(**fields, tie_word_embeddings=tie)
    return LlamaForCausalLM(config).to(dtype).eval()
