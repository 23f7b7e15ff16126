"""Training: the schedule's shape, determinism, and that a tiny run learns."""

from __future__ import annotations

import pytest
import torch

from lowvm.evaluation import EvaluationError, load_corpus, perplexity, recipe, sequences
from lowvm.evaluation.train import build_model, learning_rate, train

TINY = recipe("tiny")


def test_learning_rate_warms_up_then_decays_to_the_floor():
    assert learning_rate(0.0, TINY) == 0.0
    assert learning_rate(TINY.warmup, TINY) == pytest.approx(TINY.learning_rate)
    assert learning_rate(1.0, TINY) == pytest.approx(TINY.final_lr * TINY.learning_rate)
    after = [learning_rate(TINY.warmup + i / 50 * (1 - TINY.warmup), TINY) for i in range(51)]
    assert all(a >= b for a, b in zip(after, after[1:]))


def test_unknown_config_and_bad_budgets_are_refused():
    with pytest.raises(EvaluationError, match="'huge'"):
        recipe("huge")
    tokens = torch.zeros(1000, dtype=torch.uint8)
    with pytest.raises(EvaluationError, match="seconds=0"):
        train(tokens, TINY, "cpu", seconds=0)
    with pytest.raises(EvaluationError, match="max_steps=0"):
        train(tokens, TINY, "cpu", max_steps=0)


@pytest.mark.slow
def test_a_tiny_run_lowers_heldout_perplexity_and_repeats_exactly():
    corpus = load_corpus(max_bytes=200_000)
    held = sequences(corpus.heldout, TINY.seq_len, 16)
    before = perplexity(build_model(TINY, 0, "cpu").half().eval(), held).perplexity
    first = train(corpus.train, TINY, "cpu", seconds=600, max_steps=30, seed=0, log=None)
    after = perplexity(first.model, held).perplexity
    assert first.steps == 30 and first.tokens == 30 * TINY.batch_size * TINY.seq_len
    assert first.model.dtype == torch.float16 and not first.model.training
    assert after < 0.5 * before
    again = train(corpus.train, TINY, "cpu", seconds=600, max_steps=30, seed=0, log=None)
    for (name, a), b in zip(first.model.state_dict().items(), again.model.state_dict().values()):
        assert torch.equal(a, b), name
