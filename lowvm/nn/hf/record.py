"""What a Hugging Face model keeps of :func:`~lowvm.nn.quantize.model.quantize_model`'s
settings: a :class:`~lowvm.nn.hf.config.LowvmConfig` as its ``quantization_config`` (every
replaced layer's format, so that ``from_pretrained`` rebuilds the same layers) and the
model card ``save_pretrained`` writes. ``import lowvm`` registers
:func:`record_quantization` with :mod:`lowvm.nn.quantize.recorder`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import nn

from lowvm.nn.hf.config import LowvmConfig
from lowvm.nn.hf.model_card import attach_model_card

__all__ = ["record_quantization"]


def record_quantization(model: nn.Module, report: Any, dtype: Any, group_size: int | None,
                        zero_point: bool | None, skip: Iterable[str]) -> None:
    """Attach a LowvmConfig (the layers of an earlier call kept, this ``report``'s added)
    and the model card to ``model``, which has a transformers config."""
    config = model.config
    previous = getattr(config, "quantization_config", None)
    modules = dict(previous.modules) if isinstance(previous, LowvmConfig) else {}
    modules.update(report.modules())
    config.quantization_config = LowvmConfig(dtype=dtype, group_size=group_size,
                                             zero_point=zero_point, skip=skip, modules=modules,
                                             method=report.method)
    attach_model_card(model)  # save_pretrained also writes the "needs import lowvm" card
