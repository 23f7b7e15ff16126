"""Greedy generation with transformers' ``generate``, and the fixed prompts it is fed."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers import CompileConfig

__all__ = ["prompts", "cache_arg", "generate", "sample_tokens", "leading_equal"]


def prompts(batch: int, length: int, vocab: int, device: str, seed: int) -> torch.Tensor:
    """``[batch, length]`` random token ids, the same for a seed whatever the device."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen).to(device)


def cache_arg(model: Any) -> str:
    """The keyword ``model`` takes its KV cache by: ``cache`` from transformers 5.24 on
    (where ``past_key_values`` is deprecated and warns), ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"


def generate(model: Any, ids: torch.Tensor, tokens: int, cache: Any = None,
             compile_cfg: CompileConfig | None = None) -> Any:
    """Greedy generation of exactly ``tokens`` tokens; with a ``StaticCache`` (reset here)
    transformers compiles the decode steps with ``compile_cfg``."""
    kwargs: dict[str, Any] = {}
    if cache is not None:
        cache.reset()
        kwargs.update({cache_arg(model): cache}, compile_config=compile_cfg)
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=0,
                              **kwargs)


def sample_tokens(model: Any, ids: torch.Tensor, tokenizer: Any, count: int) -> Any:
    """The first ``count`` greedy tokens after ``ids`` (one sequence): text with a
    tokenizer, else the token ids."""
    out = generate(model, ids, count)[0, ids.shape[1]:]
    return tokenizer.decode(out) if tokenizer is not None else out.tolist()


def leading_equal(a: torch.Tensor, b: torch.Tensor) -> int:
    """Leading token positions where every sequence of ``a`` and ``b`` agrees."""
    n = min(a.shape[1], b.shape[1])
    same = (a[:, :n] == b[:, :n]).all(dim=0).tolist()
    return n if all(same) else same.index(False)
