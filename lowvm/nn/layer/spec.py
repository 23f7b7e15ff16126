"""The format of one quantized layer, and the check that a layer can have it.

A :class:`QuantSpec` says how a weight is stored (type, group size, zero points); the
check runs before any weight is touched so that a bad setting fails early, on the CPU,
with a message naming the layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lowvm.dtypes import DType
from lowvm.dtypes import dtype as as_dtype
from lowvm.errors import DTypeError
from lowvm.nn.errors import QuantizationError
from lowvm.nn.layer import backend

__all__ = ["QuantSpec", "make_spec", "weight_type"]


@dataclass(frozen=True)
class QuantSpec:
    """How one layer is quantized: ``dequant(W)[n, k] = (q - zero) * scale`` per group."""

    wtype: DType
    group_size: int
    zero_point: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (saved in a model's ``quantization_config``)."""
        return {"dtype": self.wtype.name, "group_size": self.group_size,
                "zero_point": self.zero_point}


def weight_type(value: Any, where: str = "dtype") -> DType:
    """A 2..8-bit type (or uint1) usable for weights; anything else is a DTypeError."""
    try:
        wt = as_dtype(value)
    except DTypeError as exc:
        raise DTypeError(f"{where}: {exc}") from None
    if wt.nbits > 8:
        raise DTypeError(f"{where}: {wt.name} is {wt.nbits} bits; quantized weights take a "
                         "1..8-bit type (int2..int8, uint1..uint8, eXmY floats)")
    if wt.name == "int1":
        raise DTypeError(f"{where}: int1 holds only -1 and 0, so symmetric scaling cannot "
                         "use it; use uint1 (with zero points) instead")
    return wt


def make_spec(dtype: Any, group_size: int | None, zero_point: bool | None,
              in_features: int, out_features: int, where: str = "QuantLinear") -> QuantSpec:
    """Check every setting against the layer shape and the kernel; return the spec.

    ``group_size`` None or -1 means one group per row (per-channel scales). ``zero_point``
    None means "what the type needs": on for uintN, off otherwise.
    """
    wt = weight_type(dtype, f"{where}: dtype")
    if zero_point is None:
        zero_point = wt.kind == "uint"
    if wt.kind == "uint" and not zero_point:
        raise QuantizationError(f"{where}: dtype {wt.name} is unsigned and needs zero points "
                                "(zero_point=True or None); signed weights use intN or eXmY")
    if wt.kind != "uint" and zero_point:
        raise QuantizationError(f"{where}: zero_point=True needs an unsigned type (uint1..uint8);"
                                f" got dtype {wt.name}, which is symmetric")
    if group_size is None or group_size == -1:
        group_size = in_features
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
        raise QuantizationError(f"{where}: group_size must be a positive int (or -1/None for "
                                f"one group per row); got {group_size!r}")
    if in_features % group_size:
        raise QuantizationError(f"{where}: group_size={group_size} does not divide "
                                f"in_features={in_features}; pick a divisor of {in_features}")
    problem = backend.shape_problem(in_features, out_features, group_size)
    if problem:
        raise QuantizationError(f"{where}: {problem}")
    return QuantSpec(wt, group_size, bool(zero_point))
