"""``ImportShell``: one layer's tensors exactly as a GPTQ/AWQ/compressed-tensors checkpoint
stores them, for the span of a ``from_pretrained``.

transformers loads a checkpoint by assigning each stored tensor to the model's buffer of
the same name. A shell offers those names (``qweight``, ``qzeros``, ``scales``, ...), so the
packed tensors arrive untouched on the layer's device; when loading ends the quantizer
turns each shell into a :class:`~lowvm.nn.layer.quant_linear.QuantLinear` and drops it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lowvm.nn.errors import CheckpointImportError
from lowvm.nn.hf.hub_formats import HubFormat
from lowvm.nn.layer.quant_linear import QuantLinear

__all__ = ["ImportShell"]


class ImportShell(nn.Module):
    """Placeholder for layer ``name`` until its checkpoint tensors are loaded."""

    def __init__(self, fmt: HubFormat, in_features: int, out_features: int,
                 present: set[str], name: str, device: Any = None) -> None:
        super().__init__()
        self.fmt, self.name = fmt, name
        self.in_features, self.out_features = in_features, out_features
        where = f"layer {name!r}"
        self.expected: dict[str, tuple[int, ...]] = {}
        for tensor, (shape, dtype) in fmt.tensors(in_features, out_features, present,
                                                  where).items():
            self.register_buffer(tensor, torch.empty(shape, dtype=dtype, device=device))
            self.expected[tensor] = tuple(shape)

    def to_quant_linear(self) -> QuantLinear:
        """The layer, repacked from the loaded tensors."""
        loaded = dict(self.named_buffers(recurse=False))
        missing = [k for k, v in loaded.items() if v.is_meta]
        if missing:
            raise CheckpointImportError(f"layer {self.name!r}: the checkpoint holds no "
                                        f"{', '.join(missing)} for it")
        for tensor, shape in self.expected.items():  # transformers may load any shape
            got = tuple(loaded[tensor].shape)
            if got != shape:
                raise CheckpointImportError(
                    f"layer {self.name!r}: the checkpoint's {tensor} has shape {got}, but a "
                    f"{self.fmt.method} layer of {self.fmt.bits} bits, group size "
                    f"{self.fmt.group_size or 'per row'} and [{self.out_features}, "
                    f"{self.in_features}] stores {shape}; does quantization_config match "
                    "the tensors?")
        return self.fmt.to_quant_linear(loaded, self.in_features, f"layer {self.name!r}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise CheckpointImportError(f"layer {self.name!r} was not converted from the "
                                    f"checkpoint's {self.fmt.method} tensors (did loading stop "
                                    "early?)")
