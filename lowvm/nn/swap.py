"""Replace one submodule of a model by name (the one way lowvm swaps layers in)."""

from __future__ import annotations

from torch import nn

__all__ = ["set_module"]


def set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """``model.<name> = module`` for a dotted ``name``."""
    parent, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, child, module)
