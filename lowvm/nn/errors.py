"""Errors of the quantized layers: bad quantization settings, bad activations, bad checkpoints.

Each is a :class:`~lowvm.errors.LowvmError` (one ``except`` catches every lowvm error) and
the builtin a generic handler expects. Messages name the argument, the value and what
would be accepted.
"""

from __future__ import annotations

from lowvm.errors import LowvmError

__all__ = ["QuantizationError", "ActivationError", "CheckpointImportError", "WeightFormatError",
           "CheckpointError", "CheckpointNotFoundError"]


class QuantizationError(LowvmError, ValueError):
    """Settings or a layer shape that lowvm cannot quantize (group size, tile, zero points)."""


class ActivationError(LowvmError, TypeError):
    """Activations a quantized layer cannot take: wrong dtype, device or last dimension."""


class CheckpointImportError(LowvmError, ValueError):
    """GPTQ/AWQ tensors whose shapes, dtypes or bit width do not fit the format."""


class WeightFormatError(LowvmError, ValueError):
    """Saved packed weights in a format this lowvm does not store: another version of the
    kernel's repacked layout, or the plain bit-stream rows of older lowvm checkpoints."""


class CheckpointError(LowvmError, ValueError):
    """A checkpoint or state dict whose tensors do not make the layers it records: a tensor
    missing or left over, a layer its config does not name, scales that are not finite, an
    input permutation that is not one."""


class CheckpointNotFoundError(LowvmError, FileNotFoundError):
    """A local checkpoint path that does not exist, or a directory holding no saved model."""
