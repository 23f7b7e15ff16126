"""The quantized checkpoint formats of the Hub that lowvm imports, read from their
``quantization_config``: GPTQ (v1/v2), AWQ (GEMM) and compressed-tensors' pack-quantized.

For each format this module says three things, all before any weight is read:

* :func:`read_format` — which variant a checkpoint is, or a
  :class:`~lowvm.nn.errors.CheckpointImportError` naming the field and value lowvm does
  not import (AWQ ``version: "gemv"``, GPTQ ``checkpoint_format: "marlin"``, activation
  quantization, ...);
* :meth:`HubFormat.tensors` — the tensors one layer stores (name, shape, dtype), so that
  empty holders can take them straight from the checkpoint files;
* :meth:`HubFormat.to_quant_linear` — the layer as a :class:`QuantLinear`, repacked from
  those tensors by the importers of :mod:`lowvm.nn.hf.checkpoint_import` (nothing is
  dequantized).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from lowvm.nn.errors import CheckpointImportError
from lowvm.nn.hf.checkpoint_import import from_awq, from_compressed_tensors, from_gptq
from lowvm.nn.layer.quant_linear import QuantLinear

__all__ = ["HubFormat", "read_format", "format_for", "IMPORTED_METHODS", "QUANTIZED_SUFFIXES"]

IMPORTED_METHODS = ("gptq", "awq", "compressed-tensors")
#: the tensor a quantized layer of each format always stores (how a checkpoint's keys say
#: which layers are quantized)
QUANTIZED_SUFFIXES = {"gptq": "qweight", "awq": "qweight", "compressed-tensors": "weight_packed"}

_GPTQ_BITS = (2, 3, 4, 8)
_GPTQ_FORMATS = ("gptq", "gptq_v2")
_CT_BITS = range(2, 9)
_I32, _F32 = torch.int32, torch.float32  # scales load as float32: bf16/fp16 convert exactly


@dataclass(frozen=True)
class HubFormat:
    """One layer format of a Hub checkpoint (for compressed-tensors: one config group)."""

    method: str
    bits: int
    group_size: int | None       # None: one group per row (per channel)
    checkpoint_format: str = "gptq"  # GPTQ: v1 stores zero - 1, v2 the zero
    symmetric: bool = True       # compressed-tensors: no zero points

    def groups(self, in_features: int, where: str) -> int:
        group = in_features if self.group_size is None else self.group_size
        if in_features % group:
            raise CheckpointImportError(f"{where}: group_size={group} does not divide the "
                                        f"layer's in_features={in_features}")
        return in_features // group

    def tensors(self, in_features: int, out_features: int, present: set[str], where: str
                ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """The tensors one layer of this format stores: ``{name: (shape, dtype)}``; the
        optional ones (bias, g_idx) only when the checkpoint has them (``present``)."""
        k, n, bits = in_features, out_features, self.bits
        g = self.groups(k, where)
        if self.method == "gptq":
            if (k * bits) % 32 or (n * bits) % 32:
                raise CheckpointImportError(f"{where}: GPTQ packs {bits}-bit codes in 32-bit "
                                            f"words; in/out features {k}/{n} do not fill them")
            out = {"qweight": ((k * bits // 32, n), _I32), "qzeros": ((g, n * bits // 32), _I32),
                   "scales": ((g, n), _F32), "g_idx": ((k,), _I32)}
        elif self.method == "awq":
            if n % 8:
                raise CheckpointImportError(f"{where}: AWQ packs 8 outputs per word; "
                                            f"out_features={n}")
            out = {"qweight": ((k, n // 8), _I32), "qzeros": ((g, n // 8), _I32),
                   "scales": ((g, n), _F32)}
        else:
            out = {"weight_packed": ((n, -(-k * bits // 32)), _I32),
                   "weight_scale": ((n, g), _F32), "weight_shape": ((2,), torch.int64),
                   "weight_g_idx": ((k,), _I32)}
            if not self.symmetric:
                out["weight_zero_point"] = ((-(-n * bits // 32), g), _I32)
        out["bias"] = ((n,), torch.float16)
        optional = ("bias", "g_idx", "weight_g_idx", "weight_shape")
        return {name: spec for name, spec in out.items()
                if name not in optional or name in present}

    def to_quant_linear(self, tensors: Mapping[str, torch.Tensor], in_features: int,
                        where: str) -> QuantLinear:
        """The layer from its loaded tensors (the importer checks their shapes)."""
        t = dict(tensors)
        try:
            if self.method == "gptq":
                return from_gptq(t["qweight"], t["qzeros"], t["scales"], t.get("g_idx"),
                                 t.get("bias"), bits=self.bits, group_size=self.group_size,
                                 checkpoint_format=self.checkpoint_format)
            if self.method == "awq":
                return from_awq(t["qweight"], t["qzeros"], t["scales"], t.get("bias"),
                                bits=self.bits, group_size=self.group_size)
            return from_compressed_tensors(
                t["weight_packed"], t["weight_scale"], t.get("weight_zero_point"),
                t.get("weight_g_idx"), t.get("bias"), bits=self.bits,
                in_features=in_features, symmetric=self.symmetric)
        except CheckpointImportError as exc:
            raise CheckpointImportError(f"{where}: {exc}") from None


def _field(config: Mapping[str, Any], key: str, where: str) -> str:
    return f"{where}.{key}={config.get(key)!r}"


def _group_size(value: Any, where: str) -> int | None:
    if value in (None, -1, 0):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CheckpointImportError(f"{where}.group_size={value!r}; expected a positive int "
                                    "or -1 (one group per row)")
    return value


def _gptq(config: Mapping[str, Any], where: str) -> HubFormat:
    bits = config.get("bits")
    if bits not in _GPTQ_BITS:
        raise CheckpointImportError(f"{_field(config, 'bits', where)}; lowvm imports GPTQ "
                                    f"bits {', '.join(map(str, _GPTQ_BITS))}")
    key = "checkpoint_format" if "checkpoint_format" in config else "format"
    fmt = str(config.get(key) or "gptq").lower()
    if fmt not in _GPTQ_FORMATS:
        raise CheckpointImportError(f"{_field(config, key, where)}; lowvm imports the packed "
                                    f"GPTQ formats {', '.join(_GPTQ_FORMATS)} (a '{fmt}' "
                                    "checkpoint stores weights in another kernel's layout)")
    if config.get("dynamic"):
        raise CheckpointImportError(f"{_field(config, 'dynamic', where)}; per-module overrides "
                                    "of bits or group size are not imported")
    return HubFormat("gptq", bits, _group_size(config.get("group_size"), where), fmt)


def _awq(config: Mapping[str, Any], where: str) -> HubFormat:
    version = str(config.get("version") or "gemm").lower()
    if version != "gemm":
        raise CheckpointImportError(f"{_field(config, 'version', where)}; lowvm imports AWQ's "
                                    "'gemm' format (outputs packed 8 to a word); 'gemv' and "
                                    "the exllama/ipex variants pack differently")
    if config.get("bits", config.get("w_bit", 4)) != 4:
        raise CheckpointImportError(f"{_field(config, 'bits', where)}; AWQ's GEMM format packs "
                                    "4 bits")
    if config.get("zero_point", True) is not True:
        raise CheckpointImportError(f"{_field(config, 'zero_point', where)}; lowvm imports AWQ "
                                    "checkpoints with zero points (the GEMM format's default)")
    group = config.get("group_size", config.get("q_group_size"))
    return HubFormat("awq", 4, _group_size(group, where))


def _ct_group(name: str, group: Mapping[str, Any], where: str) -> HubFormat:
    here = f"{where}.config_groups.{name}"
    if group.get("input_activations") or group.get("output_activations"):
        raise CheckpointImportError(f"{here}.input_activations={group.get('input_activations')!r}"
                                    "; lowvm serves weight-only checkpoints (W4A16, W8A16, ...):"
                                    " activations stay float16/bfloat16")
    weights = group.get("weights")
    if not isinstance(weights, Mapping):
        raise CheckpointImportError(f"{here}.weights={weights!r}; expected the weights' "
                                    "quantization arguments")
    here += ".weights"
    if weights.get("type", "int") != "int":
        raise CheckpointImportError(f"{_field(weights, 'type', here)}; lowvm imports integer "
                                    "pack-quantized weights")
    bits = weights.get("num_bits")
    if bits not in _CT_BITS:
        raise CheckpointImportError(f"{_field(weights, 'num_bits', here)}; lowvm imports 2..8 "
                                    "bits")
    strategy = weights.get("strategy")
    if strategy not in ("group", "channel"):
        raise CheckpointImportError(f"{_field(weights, 'strategy', here)}; lowvm imports "
                                    "'group' and 'channel' scales")
    if weights.get("dynamic"):
        raise CheckpointImportError(f"{_field(weights, 'dynamic', here)}; weights need stored "
                                    "scales")
    group_size = _group_size(weights.get("group_size"), here) if strategy == "group" else None
    return HubFormat("compressed-tensors", bits, group_size,
                     symmetric=bool(weights.get("symmetric", True)))


@dataclass(frozen=True)
class _CompressedTensors:
    """compressed-tensors' config groups, each with its targets."""

    groups: tuple[tuple[tuple[str, ...], HubFormat], ...]

    def format_of(self, module: str, where: str) -> HubFormat:
        for targets, fmt in self.groups:
            for target in targets:
                if target == "Linear" or target == module or (
                        target.startswith("re:") and re.match(target[3:], module)):
                    return fmt
        raise CheckpointImportError(f"{where}: layer {module!r} holds packed weights but no "
                                    "config group of quantization_config.config_groups "
                                    "targets it")


def read_format(config: Mapping[str, Any], where: str = "quantization_config"
                ) -> HubFormat | _CompressedTensors:
    """The checkpoint's format (compressed-tensors: one per config group, chosen per
    layer by :func:`format_for`); anything lowvm does not import is an error naming the
    field."""
    if not isinstance(config, Mapping):
        raise CheckpointImportError(f"{where} must be a dict; got {type(config).__name__}")
    method = str(config.get("quant_method", "")).lower()
    if method == "gptq":
        return _gptq(config, where)
    if method == "awq":
        return _awq(config, where)
    if method == "compressed-tensors":
        fmt = config.get("format")
        if fmt != "pack-quantized":
            raise CheckpointImportError(f"{_field(config, 'format', where)}; lowvm imports "
                                        "compressed-tensors' 'pack-quantized' weights")
        groups = config.get("config_groups")
        if not isinstance(groups, Mapping) or not groups:
            raise CheckpointImportError(f"{_field(config, 'config_groups', where)}; expected "
                                        "at least one config group")
        parsed = []
        for name, group in groups.items():
            if not isinstance(group, Mapping):
                raise CheckpointImportError(f"{where}.config_groups.{name}: expected a dict")
            if group.get("format", fmt) != "pack-quantized":
                raise CheckpointImportError(
                    f"{where}.config_groups.{name}.format={group.get('format')!r}; lowvm "
                    "imports 'pack-quantized' weights")
            targets = group.get("targets") or ["Linear"]
            parsed.append((tuple(str(t) for t in targets), _ct_group(name, group, where)))
        return _CompressedTensors(tuple(parsed))
    raise CheckpointImportError(f"{where}.quant_method={config.get('quant_method')!r}; lowvm "
                                f"imports {', '.join(IMPORTED_METHODS)} checkpoints")


def format_for(found: HubFormat | _CompressedTensors, module: str, where: str) -> HubFormat:
    """The format of one layer."""
    if isinstance(found, HubFormat):
        return found
    return found.format_of(module, where)
