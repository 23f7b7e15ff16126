"""Comparing greedy generations of two numerically different but equivalent paths.

Two correct implementations (lowvm's decode attention and SDPA, say) round differently,
so where a random model's two best next tokens are nearly tied, their greedy choices may
part and every later token then differs. Exact token equality then fails on a draw of the
inputs rather than on a defect (seen on the H100: a tiny random Llama alternating between
two tokens whose logits tied). :func:`assert_same_greedy_up_to_ties` accepts a parting
only where the reference model's own logits call the two tokens a tie; everything before
the parting must be equal, and a wrong kernel, which changes logits by far more than
rounding, still fails.
"""

from __future__ import annotations

import torch

#: the largest gap, relative to the step's largest |logit|, between the reference's choice
#: and the other path's that counts as a tie: about ten float16 roundings at that scale
#: (the tests' tiny random Llamas have logits near 1, and the gap between their two best
#: tokens is 2-40 % of the largest at most steps, measured on the CPU)
TIE_TOLERANCE = 1e-2


@torch.no_grad()
def assert_same_greedy_up_to_ties(reference: torch.nn.Module, want: torch.Tensor,
                                  got: torch.Tensor, prompt_len: int,
                                  tolerance: float = TIE_TOLERANCE) -> int:
    """``got`` (prompt + greedy tokens of the path under test) equals ``want`` (the
    reference's), except that a row may part at a step where ``reference``'s logits over
    ``want``'s own prefix rank the two tokens within ``tolerance`` of each other; after
    that step the row is not compared. Returns how many rows parted (for the caller's
    bookkeeping; a row that parts on a tie is no failure)."""
    assert got.shape == want.shape, (tuple(got.shape), tuple(want.shape))
    assert torch.equal(got[:, :prompt_len], want[:, :prompt_len]), "the prompts differ"
    parted = 0
    differs = (got != want)[:, prompt_len:]
    if not differs.any():
        return 0
    logits = reference(want).logits.float()  # logits[:, j] scores the token at j + 1
    for row in range(want.shape[0]):
        steps = differs[row].nonzero()
        if steps.numel() == 0:
            continue
        at = prompt_len + int(steps[0])
        scores = logits[row, at - 1]
        chosen, other = int(want[row, at]), int(got[row, at])
        gap = float(scores[chosen] - scores[other])
        scale = float(scores.abs().max())
        assert gap <= tolerance * scale, (
            f"row {row} parts at position {at}: the reference scores its token {chosen} "
            f"{gap:.4g} above {other} (largest |logit| {scale:.4g}): not a tie")
        parted += 1
    return parted
