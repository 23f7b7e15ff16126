"""What a :class:`~lowvm.nn.layer.quant_linear.QuantLinear` does with a saved ``qweight``:
take it when its format record names the layer's own kernel format, convert it when the
record names an earlier layout this lowvm still derives exactly, refuse anything else.

A layer's ``qweight`` is stored in the kernel's repacked layout, which changes with the
kernel library, so every layer saves its format's fingerprint beside it
(:func:`format_record`, the layer's ``_extra_state``). On loading:

- the layer's own fingerprint: a plain copy;
- an earlier layout of the same type and K tile
  (:func:`~lowvm.nn.layer.kernel_format.earlier_kernel_format`: 3..7-bit floats saved
  before they took the split_pairs order): converted, with a
  :class:`~lowvm.nn.layer.kernel_format.LayoutConvertedWarning`, so that such checkpoints
  need not be quantized again from a dense model their users may no longer have;
- anything else (another format, no record, the plain ``[N, K*bits/8]`` rows of older
  lowvm, a layer of other settings): :class:`~lowvm.nn.errors.WeightFormatError` naming
  what differs, before any buffer changes.

``load_state_dict`` goes through :func:`check_state_dict`. transformers' loader assigns
``qweight`` and the record itself, bypassing it, so there the layer is told the recorded
layout beforehand (:func:`expect_earlier_layout`) and converted afterwards
(:func:`convert_earlier_layouts`).
"""

from __future__ import annotations

import warnings
from collections import ChainMap
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import _EXTRA_STATE_KEY_SUFFIX

from lowvm.dtypes import DType, all_dtypes
from lowvm.nn.errors import WeightFormatError
from lowvm.nn.layer.kernel_format import (
    KernelFormat,
    LayoutConvertedWarning,
    earlier_kernel_format,
    kernel_format,
)

__all__ = ["format_record", "check_record", "check_state_dict", "expect_earlier_layout",
           "convert_earlier_layouts", "describe", "describe_layer"]

# the attribute naming the earlier layout a layer expects its next assigned qweight in
_EXPECTED = "_earlier_layout"


def format_record(fmt: KernelFormat) -> torch.Tensor:
    """The format record saved beside ``qweight``: the fingerprint's 8 bytes."""
    return torch.frombuffer(bytearray.fromhex(fmt.fingerprint), dtype=torch.uint8)


def check_record(layer: nn.Module, record: Any) -> None:
    """A record assigned to ``layer`` (``set_extra_state``): it must name the layer's
    format, or the earlier layout the layer was told to expect."""
    earlier = getattr(layer, _EXPECTED, None)
    if earlier is None:
        _check_format(layer, record, None)
        return
    got = _fingerprint(record)  # transformers' loading of an announced earlier layout
    if got != earlier.fingerprint:
        raise WeightFormatError(
            f"{describe_layer(layer)}: the checkpoint's config records kernel format "
            f"{earlier.fingerprint} for this layer, but its tensors record "
            f"{got if got is not None else describe(record)}; the checkpoint is "
            "inconsistent")


def check_state_dict(layer: nn.Module, state_dict: Mapping[str, Any], prefix: str
                     ) -> Mapping[str, Any]:
    """The state dict ``layer`` loads from ``prefix``: ``state_dict`` itself, or a view
    of it whose ``qweight`` and record are converted from an earlier layout. Checked, and
    converted, before anything is copied, so a refused load changes nothing (the caller's
    state dict is left as it is)."""
    if prefix + "qweight" not in state_dict:
        return state_dict
    setattr(layer, _EXPECTED, None)  # the state dict says its layout itself
    record_key = prefix + _EXTRA_STATE_KEY_SUFFIX
    record = state_dict.get(record_key)
    saved = _fingerprint(record)
    if saved not in (None, layer.kernel_format.fingerprint):
        _check_settings(layer, state_dict, prefix, saved)
        earlier = _earlier_format(layer, saved)
        if earlier is not None:
            qweight = _from_earlier_layout(layer, state_dict[prefix + "qweight"], earlier)
            record = format_record(layer.kernel_format)
            state_dict = ChainMap({prefix + "qweight": qweight, record_key: record},
                                  state_dict)
    _check_format(layer, record, state_dict[prefix + "qweight"])
    return state_dict


def expect_earlier_layout(layer: nn.Module, fingerprint: str | None) -> bool:
    """Whether ``fingerprint`` names an earlier layout ``layer`` converts from. If so, the
    layer takes the ``qweight`` and record assigned next as being in it, and
    :func:`convert_earlier_layouts` converts them once assigned."""
    earlier = _earlier_format(layer, fingerprint)
    setattr(layer, _EXPECTED, earlier)
    return earlier is not None


def convert_earlier_layouts(model: nn.Module) -> list[str]:
    """Convert the ``qweight`` of every layer of ``model`` told to expect an earlier layout
    (:func:`expect_earlier_layout`) now that it is assigned; the names of the converted
    layers."""
    return [name for name, module in model.named_modules() if _convert_assigned(module)]


def describe(value: Any) -> str:
    """A refused value as an error message names it: a tensor by dtype and shape."""
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} tensor of shape {tuple(value.shape)}"
    return repr(value) if value is None else type(value).__name__


@torch.no_grad()
def _convert_assigned(layer: nn.Module) -> bool:
    """Convert an assigned ``qweight`` of the announced earlier layout; False when none
    was announced."""
    earlier = getattr(layer, _EXPECTED, None)
    if earlier is None:
        return False
    converted = _from_earlier_layout(layer, layer.qweight, earlier)
    setattr(layer, _EXPECTED, None)
    layer.qweight = converted
    return True


def describe_layer(layer: nn.Module) -> str:
    """A layer as error messages name it: its type, group size and shape."""
    spec = layer.spec
    return (f"QuantLinear ({spec.wtype.name}, group_size={spec.group_size}, "
            f"[{layer.out_features}, {layer.in_features}])")


def _earlier_format(layer: nn.Module, fingerprint: str | None) -> KernelFormat | None:
    """The earlier layout of the layer's type and K tile that ``fingerprint`` names."""
    return earlier_kernel_format(layer.spec.wtype, layer.kernel_format.bk, fingerprint)


def _from_earlier_layout(layer: nn.Module, qweight: torch.Tensor, earlier: KernelFormat
                         ) -> torch.Tensor:
    """``qweight`` saved in ``earlier`` -> the layer's current layout, on its device;
    warns."""
    n, k, fmt = layer.out_features, layer.in_features, layer.kernel_format
    own = layer.qweight
    if (not isinstance(qweight, torch.Tensor) or qweight.is_meta
            or qweight.dtype != torch.uint8 or qweight.shape != own.shape):
        raise WeightFormatError(
            f"{describe_layer(layer)}: the saved qweight is in the earlier kernel format "
            f"{earlier.fingerprint}, which this lowvm converts from a uint8 tensor with "
            f"data of shape {tuple(own.shape)}; got {describe(qweight)}"
            + (" on the meta device" if getattr(qweight, "is_meta", False) else ""))
    converted = fmt.repack(earlier.unpack(qweight, n, k))
    warnings.warn(LayoutConvertedWarning(
        f"{layer.spec.wtype.name} weights (K tile {fmt.bk}) saved in an earlier kernel "
        f"layout (format {earlier.fingerprint}) were converted to this lowvm's "
        f"({fmt.fingerprint}) while loading; save the model again to store the current "
        "layout"), stacklevel=2)
    return converted


def _check_format(layer: nn.Module, record: Any, qweight: Any) -> None:
    """Raise WeightFormatError unless ``record`` names the layer's kernel format."""
    fmt = layer.kernel_format
    got = _fingerprint(record)
    if got == fmt.fingerprint:
        return
    where = describe_layer(layer)
    fix = ("quantize the dense model again, or load the checkpoint with the lowvm that "
           "saved it and move the codes over (QuantLinear.codes() there, set_codes here)")
    if got is not None:
        raise WeightFormatError(f"{where}: the saved qweight is in kernel format {got}, but"
                                f" this lowvm stores these weights as {fmt.fingerprint} "
                                f"(the GPU kernel's repacked layout changed since the "
                                f"checkpoint was saved); {fix}")
    plain = (layer.out_features, layer.in_features * layer.spec.wtype.nbits // 8)
    if isinstance(qweight, torch.Tensor) and tuple(qweight.shape) == plain:
        found = (f"a qweight of shape {plain}: plain bit-stream rows, the format of lowvm "
                 "checkpoints before weights were stored repacked")
    else:
        found = f"a qweight without a format record (got {describe(record)})"
    raise WeightFormatError(f"{where}: the state dict holds {found}; this lowvm stores "
                            f"qweight in the kernel's repacked layout, format "
                            f"{fmt.fingerprint}, recorded as '{_EXTRA_STATE_KEY_SUFFIX}';"
                            f" {fix}")


def _check_settings(layer: nn.Module, state_dict: Mapping[str, Any], prefix: str,
                    saved: str) -> None:
    """Raise WeightFormatError naming how the saved layer's settings differ from the
    layer's (zero points, group size, shape, bits, type), where they do: a checkpoint of
    another type or group size is a different layer, not a changed kernel layout."""
    n, k = layer.out_features, layer.in_features
    own = layer.spec
    qweight = state_dict[prefix + "qweight"]
    scales, zeros = state_dict.get(prefix + "scales"), state_dict.get(prefix + "zeros")
    diffs = []
    if (zeros is None) != (layer.zeros is None):
        diffs.append("zero points: the checkpoint has " + (
            "none (a symmetric type)" if zeros is None else "them (an asymmetric uintN)")
            + f", this layer's {own.wtype.name} " + ("has them" if layer.zeros is not None
                                                      else "has none"))
    if isinstance(scales, torch.Tensor) and scales.dim() == 2:
        groups, rows = scales.shape
        if rows != n:
            diffs.append(f"shape: the checkpoint's layer has {rows} outputs, this one {n}")
        elif groups != k // own.group_size and k % groups == 0:
            diffs.append(f"group size: the checkpoint's is {k // groups}, this layer's "
                         f"{own.group_size}")
    if isinstance(qweight, torch.Tensor) and qweight.numel() != layer.qweight.numel():
        bits = qweight.numel() * 8 / (n * k)
        diffs.append(f"bits per weight: the checkpoint's codes take {bits:g}, this layer's "
                     f"{own.wtype.name} {own.wtype.nbits}")
    if not diffs and _earlier_format(layer, saved) is None:  # else it is own type's
        same = _type_of_fingerprint(saved, own.wtype.nbits, layer.kernel_format.bk)
        if same is not None and same != own.wtype:
            diffs.append(f"type: the checkpoint holds {same.name}, this layer "
                         f"{own.wtype.name}")
    if diffs:
        raise WeightFormatError(
            f"{describe_layer(layer)}: the checkpoint's layer differs in {'; '.join(diffs)}; build "
            "the layer with the checkpoint's settings (its config.json's "
            "quantization_config)")


def _type_of_fingerprint(fingerprint: str, nbits: int, bk: int) -> DType | None:
    """The ``nbits``-bit type whose kernel format of K tile ``bk``, current or earlier,
    has ``fingerprint``."""
    for wtype in all_dtypes():
        if wtype.nbits == nbits and (kernel_format(wtype, bk).fingerprint == fingerprint
                                     or earlier_kernel_format(wtype, bk, fingerprint)):
            return wtype
    return None


def _fingerprint(record: Any) -> str | None:
    """The hex fingerprint a saved format record holds, or None if it holds none."""
    if isinstance(record, str):
        return record
    if (isinstance(record, torch.Tensor) and record.dtype == torch.uint8 and record.dim() == 1
            and not record.is_meta):
        return bytes(record.tolist()).hex()
    return None
