"""The activation checks every QuantLinear forward path must make, asserted in one place
(the custom op's path and the eager launch path both run them)."""

from __future__ import annotations

import pytest
import torch

from lowvm.nn.errors import ActivationError


def assert_activation_errors(layer: torch.nn.Module) -> None:
    """A wrong dtype, a wrong last dimension and a wrong device each raise the
    ActivationError naming it (``layer``: a QuantLinear with in_features = 256)."""
    with pytest.raises(ActivationError, match=r"torch.float32.*float16 or torch.bfloat16"):
        layer(torch.randn(2, 256))
    with pytest.raises(ActivationError, match="in_features=256"):
        layer(torch.randn(2, 128, dtype=torch.float16))
    with pytest.raises(ActivationError, match="meta"):
        layer(torch.empty(2, 256, dtype=torch.float16, device="meta"))
