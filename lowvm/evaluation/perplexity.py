"""Held-out perplexity per byte: ``exp`` of the mean negative log-likelihood of each next
byte. The log-softmax and the sum run in float64 (from the model's own logits), so that
hundreds of thousands of terms lose nothing to rounding and small differences between
variants are the models', not the arithmetic's."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from lowvm.evaluation.errors import EvaluationError

__all__ = ["Score", "perplexity"]


@dataclass(frozen=True)
class Score:
    """A model's held-out score: total NLL (nats) over ``tokens`` predicted bytes."""

    nll: float
    tokens: int

    @property
    def nll_per_byte(self) -> float:
        return self.nll / self.tokens

    @property
    def bits_per_byte(self) -> float:
        return self.nll_per_byte / math.log(2)

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll_per_byte)


def perplexity(model: Any, sequences: torch.Tensor, batch_size: int = 16) -> Score:
    """Score ``model`` (called as ``model(input_ids=..., use_cache=False)``, returning an
    object with ``.logits``) on ``[n, L]`` int64 ``sequences``: every position but the
    first of each row is predicted from the ones before it. The rows are moved to the
    model's device in batches of ``batch_size``."""
    if sequences.dim() != 2 or sequences.shape[1] < 2 or sequences.shape[0] == 0:
        raise EvaluationError(f"sequences of shape {tuple(sequences.shape)}: accepted: "
                              "[n, L] with n >= 1 and L >= 2")
    if batch_size < 1:
        raise EvaluationError(f"batch_size={batch_size!r}: accepted: a positive int")
    device = next(iter(model.parameters()), torch.empty(0)).device
    total = torch.zeros((), dtype=torch.float64, device=device)
    with torch.no_grad():
        for start in range(0, sequences.shape[0], batch_size):
            ids = sequences[start:start + batch_size].to(device)
            logits = model(input_ids=ids, use_cache=False).logits[:, :-1].double()
            total += torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")
    count = sequences.shape[0] * (sequences.shape[1] - 1)
    return Score(float(total.item()), count)
