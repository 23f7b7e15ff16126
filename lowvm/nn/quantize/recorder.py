"""Who is told the settings :func:`~lowvm.nn.quantize.model.quantize_model` used on a
Hugging Face model.

Such a model keeps them as its ``config.quantization_config`` (so that ``save_pretrained``
records every layer's format) and gets lowvm's model card; both belong to
:mod:`lowvm.nn.hf`, which sits above this wing and imports it. So hf's recorder is
registered from above (``import lowvm`` registers
:func:`lowvm.nn.hf.record.record_quantization`) and ``quantize_model`` calls whichever is
registered. This module imports nothing, so registering costs ``import lowvm`` nothing.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ModelRecorder", "set_model_recorder", "model_recorder"]

#: ``(model, report, dtype, group_size, zero_point, skip) -> None``: record on ``model``
#: (one with a transformers config) what ``quantize_model`` was asked for and what its
#: :class:`~lowvm.nn.quantize.model.QuantReport` says it did
ModelRecorder = Callable[..., None]

_RECORDER: list[ModelRecorder | None] = [None]


def set_model_recorder(recorder: ModelRecorder | None) -> ModelRecorder | None:
    """Make ``recorder`` the one ``quantize_model`` calls (None: record nothing); returns
    the one before."""
    before, _RECORDER[0] = _RECORDER[0], recorder
    return before


def model_recorder() -> ModelRecorder | None:
    """The registered recorder, or None."""
    return _RECORDER[0]
