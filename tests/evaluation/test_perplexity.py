"""Held-out perplexity against analytic values computed in numpy float64."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from lowvm.evaluation import EvaluationError, perplexity


class _Fixed(torch.nn.Module):
    """Predicts the next byte from the current one with the table ``log_q[current]``."""

    def __init__(self, log_q: np.ndarray):
        super().__init__()
        self.log_q = torch.nn.Parameter(torch.tensor(log_q, dtype=torch.float32),
                                        requires_grad=False)

    def forward(self, input_ids, use_cache=False):
        return SimpleNamespace(logits=self.log_q[input_ids])


def test_a_uniform_model_scores_256():
    model = _Fixed(np.zeros((256, 256)))
    ids = torch.randint(0, 256, (5, 33), generator=torch.Generator().manual_seed(0))
    score = perplexity(model, ids, batch_size=2)
    assert score.tokens == 5 * 32
    assert score.perplexity == pytest.approx(256.0, rel=1e-12)
    assert score.bits_per_byte == pytest.approx(8.0, rel=1e-12)


def test_a_known_conditional_distribution_gives_its_analytic_perplexity():
    rng = np.random.default_rng(1)
    q = rng.dirichlet(np.full(256, 0.3), size=256)  # q[current, next]
    log_q = np.log(q)
    ids = rng.integers(0, 256, size=(7, 20))
    ids[:, 1::2] = (ids[:, 0::2] + 1) % 256  # some structure, so positions matter
    expected = math.exp(-np.mean(log_q[ids[:, :-1], ids[:, 1:]]))
    model = _Fixed(log_q)
    for batch in (1, 3, 7, 16):
        score = perplexity(model, torch.tensor(ids), batch_size=batch)
        assert score.perplexity == pytest.approx(expected, rel=1e-6)
    shifted = math.exp(-np.mean(log_q[ids[:, 1:], ids[:, :-1]]))
    assert not np.isclose(expected, shifted)  # a misaligned scorer would not pass


def test_bad_sequences_are_refused():
    model = _Fixed(np.zeros((256, 256)))
    with pytest.raises(EvaluationError, match=r"shape \(10,\)"):
        perplexity(model, torch.zeros(10, dtype=torch.long))
    with pytest.raises(EvaluationError, match="batch_size=0"):
        perplexity(model, torch.zeros(2, 4, dtype=torch.long), batch_size=0)
