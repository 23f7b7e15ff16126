"""The tie-aware greedy comparison the GPU generation tests use (tests/helpers/greedy.py)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.greedy import assert_same_greedy_up_to_ties


class _FixedScores(torch.nn.Module):
    """A 'model' whose logits at every position are one row of scores over 4 tokens."""

    def __init__(self, scores):
        super().__init__()
        self.scores = torch.tensor(scores, dtype=torch.float16)

    def forward(self, ids):
        out = self.scores.expand(*ids.shape, -1)
        return type("Out", (), {"logits": out})()


def test_equal_generations_pass_without_the_model():
    want = torch.tensor([[1, 2, 3, 0]])
    assert assert_same_greedy_up_to_ties(None, want, want.clone(), 2) == 0


def test_a_parting_on_a_tie_passes_and_a_clear_gap_fails():
    want, got = torch.tensor([[1, 2, 3, 3]]), torch.tensor([[1, 2, 0, 1]])
    tied = _FixedScores([4.000, 0.0, 0.0, 4.004])  # tokens 3 and 0 within 1e-3 of 4
    assert assert_same_greedy_up_to_ties(tied, want, got, 2) == 1
    clear = _FixedScores([3.0, 0.0, 0.0, 4.0])
    with pytest.raises(AssertionError, match="parts at position 2.*not a tie"):
        assert_same_greedy_up_to_ties(clear, want, got, 2)


def test_prompts_and_shapes_must_agree():
    want = torch.tensor([[1, 2, 3]])
    with pytest.raises(AssertionError, match="prompts differ"):
        assert_same_greedy_up_to_ties(None, want, torch.tensor([[0, 2, 3]]), 2)
    with pytest.raises(AssertionError):
        assert_same_greedy_up_to_ties(None, want, torch.tensor([[1, 2]]), 2)
