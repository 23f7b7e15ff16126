"""``LowvmConfig``: the quantization settings of a model, and the record of a saved one.

Kept apart from the transformers quantizer (:mod:`lowvm.nn.hf.quantizer`) so that
recording the config of :func:`~lowvm.nn.quantize.model.quantize_model`
(:mod:`lowvm.nn.hf.record`) does not import the quantizer, which itself calls
``quantize_model``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from transformers.utils.quantization_config import QuantizationConfigMixin

from lowvm.nn.errors import QuantizationError
from lowvm.nn.layer.spec import weight_type

__all__ = ["LowvmConfig", "METHOD", "METHODS", "DEFAULT_DTYPE"]

METHOD = "lowvm"


#: a None (keep the layer dense) of a dtype mapping as config.json holds it: transformers
#: writes every value of a mapping under a "dtype" key through str()
SAVED_NONE = "None"


def _type_name(value: Any, where: str) -> str | None:
    if value is None:
        return None
    return weight_type(value, where).name


#: the type quantizing a dense checkpoint uses when LowvmConfig names none
DEFAULT_DTYPE = "int4"
#: quantization methods quantize_model knows; only round to nearest can run while loading
METHODS = ("rtn", "gptq")


class LowvmConfig(QuantizationConfigMixin):
    """Settings for quantizing while loading, and the record of a saved lowvm model.

    ``dtype``: one type, or ``{glob: type}`` per module name (longest match wins, None
    keeps a layer dense); None: int4 for a dense checkpoint, and for a GPTQ/AWQ/
    compressed-tensors checkpoint (through :func:`lowvm.from_pretrained`) the checkpoint's
    own quantization. ``group_size`` (-1 or None: one group per row); ``zero_point``
    (None: on for uintN only); ``skip``: globs never quantized. ``method``: "rtn" (round
    to nearest, the only method that runs while loading) or "gptq" (recorded by
    ``quantize_model``; calibration needs the loaded model). ``modules`` is filled in by
    lowvm (the resolved per-layer formats) and is what a pre-quantized load follows;
    ``source`` is the checkpoint's own ``quantization_config`` when lowvm imports one.
    """

    def __init__(self, dtype: Any = None, group_size: int | None = 128,
                 zero_point: bool | None = None, skip: Iterable[str] = ("lm_head",),
                 modules: Mapping[str, Mapping[str, Any]] | None = None,
                 method: str = "rtn", source: Mapping[str, Any] | None = None,
                 **kwargs: Any) -> None:
        self.quant_method = METHOD
        if isinstance(dtype, Mapping):
            self.dtype: str | dict[str, str | None] | None = {
                str(k): None if v == SAVED_NONE else _type_name(v, f"LowvmConfig: dtype[{k!r}]")
                for k, v in dtype.items()}
        else:
            self.dtype = _type_name(dtype, "LowvmConfig: dtype")
        if method not in METHODS:
            raise QuantizationError(f"LowvmConfig: method={method!r}; accepted: "
                                    f"{', '.join(METHODS)}")
        if source is not None and not isinstance(source, Mapping):
            raise QuantizationError(f"LowvmConfig: source must be a checkpoint's "
                                    f"quantization_config dict; got {type(source).__name__}")
        self.group_size = group_size
        self.zero_point = zero_point
        self.skip = [skip] if isinstance(skip, str) else list(skip or ())
        self.modules = {name: dict(entry) for name, entry in (modules or {}).items()}
        self.method = method
        self.source = dict(source) if source is not None else None

    def quantize_kwargs(self) -> dict[str, Any]:
        """The arguments of quantize_model these settings stand for."""
        return {"dtype": DEFAULT_DTYPE if self.dtype is None else self.dtype,
                "group_size": self.group_size, "zero_point": self.zero_point,
                "skip": tuple(self.skip)}
