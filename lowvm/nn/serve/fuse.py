"""Serving-time projection fusion: q/k/v into one layer, gate/up into another.

At batch 1 a decode step's GEMMs are small and latency-bound, so each launch and each
kernel's tail cost about as much as the weights they stream. :func:`fuse_projections`
turns the 7 GEMMs of a Llama-family layer into 4 (``qkv_proj``, ``o_proj``,
``gate_up_proj``, ``down_proj``), in place, for quantized (``QuantLinear``) and dense
(``nn.Linear`` in float16, bfloat16 or float32) projections alike: a float16 baseline
fused the same way as a quantized model makes their speed ratio measure the weights, not
the fusion. A block whose projections are not all of one kind is left as it is.

* **Dense layers** concatenate their weights (and biases) along out_features into one
  ``nn.Linear``: each output element is the same dot product as before.
* **Quantized layers: no unpacking.** The kernel's repacked weight stores ``bn x bk``
  tiles one after another, K tile major, then N tile (the order
  :mod:`lowvm.nn.layer.kernel_format` checks against the library), so ``qweight`` viewed as
  ``[K/bk, N/bn, rows, chunk]`` concatenates along N with one ``torch.cat``; scales, zeros
  and bias concatenate by column. Should the library ever store tiles otherwise, the codes
  are unpacked and repacked instead.
* **Exactly the model's arithmetic.** Attention keeps its class (a subclass replaces it,
  so ``isinstance`` checks, hooks and attributes stay) and its forward does what the
  Hugging Face forward does, with the helpers of the class's own modeling module
  (rotary embedding, cache update, the attention function of
  ``config._attn_implementation``). Only classes whose forward lowvm reproduces are
  fused: the forward's source is compared (as a syntax tree, annotations left out, its
  decorators checked apart) with the versions this file was written against
  (transformers 5.17-5.23, and 5.24, which renamed the cache argument); any other is
  skipped with the reason, never run with a forward that might differ.
* **With lowvm's attention** (:func:`lowvm.use_decode_attention`), a Llama-style block's
  decode step on a static cache runs rotary embedding, cache update and attention as one
  kernel after the q/k/v GEMM (:func:`lowvm.nn.serve.attention.fused_decode_step`; the same
  results up to rounding, the rotary embedding in float32); every other call is the
  Hugging Face forward as above.
* **Checkpoints stay unfused.** A fused block's ``state_dict()`` splits its tensors back
  into the original keys and tensors (so ``save_pretrained`` writes the unfused model),
  and ``load_state_dict`` of an unfused state dict merges them.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import inspect
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn.modules.module import _EXTRA_STATE_KEY_SUFFIX

from lowvm.errors import LowvmError
from lowvm.nn.layer.quant_linear import QuantLinear
from lowvm.nn.swap import set_module

__all__ = ["fuse_projections", "FuseReport", "FuseError", "FusedGateUpMLP",
           "concat_out_features", "concat_problem"]


class FuseError(LowvmError, TypeError, ValueError):
    """Something fusion cannot take: a non-module model, or layers of different formats."""


@dataclass
class FuseReport:
    """What :func:`fuse_projections` did. ``attention_fused`` and ``mlps_fused`` count
    every fused block, ``dense_fused`` those of them whose projections are ``nn.Linear``
    (the rest are quantized). ``skipped``: ``(module name, why)`` for every attention/MLP-
    like module left as it was; blocks fused by an earlier call are in ``already_fused``."""

    attention_fused: int = 0
    mlps_fused: int = 0
    already_fused: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    dense_fused: int = 0

    def __str__(self) -> str:
        text = (f"lowvm: fused q/k/v of {self.attention_fused} attention blocks and gate/up "
                f"of {self.mlps_fused} MLPs")
        if self.dense_fused:
            text += f" ({self.dense_fused} of these blocks dense)"
        if self.already_fused:
            text += f" ({self.already_fused} fused before)"
        text += f"; skipped {len(self.skipped)}"
        if self.skipped:
            name, why = self.skipped[0]
            text += f" (first: {name}: {why})"
        return text


# --------------------------------------------------------------------------------------
# Concatenating and splitting layers along out_features

#: dense weight types fused: those torch runs one GEMM of on every device
DENSE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_KINDS = "a lowvm QuantLinear or a torch.nn.Linear"


def _is_dense(layer: Any) -> bool:
    """A plain ``nn.Linear`` (a subclass may compute something else)."""
    return type(layer) is nn.Linear


def _plain(tensor: Any) -> bool:
    """A tensor whose concatenation is its data's (no DTensor or quantized subclass)."""
    return type(tensor) in (nn.Parameter, torch.Tensor)


def _dense_problem(name: str, layer: nn.Linear) -> str | None:
    for what, tensor in (("weight", layer.weight), ("bias", layer.bias)):
        if tensor is not None and not _plain(tensor):
            return (f"{name}.{what} is a {type(tensor).__name__}, not a plain tensor; "
                    "only plain weights concatenate into one GEMM")
    if layer.weight.dtype not in DENSE_DTYPES:
        return (f"{name} has dtype {layer.weight.dtype}; dense layers are fused in "
                f"{', '.join(str(d) for d in DENSE_DTYPES)}")
    return None


def _layer_problem(name: str, layer: Any) -> str | None:
    if type(layer) is not QuantLinear and not _is_dense(layer):
        return f"{name} is {type(layer).__name__}, not {_KINDS}"
    if _has_hooks(layer):
        return f"{name} has hooks, which a fused layer would drop"
    return _dense_problem(name, layer) if _is_dense(layer) else None


def _differences(layer: Any, first: Any) -> list[tuple[str, Any, Any]]:
    """(what, this layer's, the first layer's) of every property one GEMM needs equal."""
    if _is_dense(layer):
        return [("in_features", layer.in_features, first.in_features),
                ("dtype", layer.weight.dtype, first.weight.dtype),
                ("device", layer.weight.device, first.weight.device),
                ("bias", None if layer.bias is None else layer.bias.dtype,
                 None if first.bias is None else first.bias.dtype),
                ("requires_grad", layer.weight.requires_grad, first.weight.requires_grad)]
    return [("in_features", layer.in_features, first.in_features),
            ("format (dtype, group_size, zero_point)", layer.spec, first.spec),
            ("device", layer.qweight.device, first.qweight.device),
            ("bias", None if layer.bias is None else layer.bias.dtype,
             None if first.bias is None else first.bias.dtype)]


def concat_problem(layers: Sequence[Any], names: Sequence[str] | None = None) -> str | None:
    """Why ``layers`` cannot be concatenated along out_features (a sentence), or None."""
    if not isinstance(layers, Sequence | nn.ModuleList) or isinstance(layers, str):
        return (f"layers must be a list or tuple of QuantLinear or nn.Linear layers; got "
                f"{type(layers).__name__}")
    layers = list(layers)
    names = list(names) if names is not None else [f"layers[{i}]" for i in range(len(layers))]
    if not layers:
        return "layers is empty; give one or more QuantLinear or nn.Linear layers"
    if len(names) != len(layers):
        return f"names has {len(names)} entries for {len(layers)} layers"
    for name, layer in zip(names, layers, strict=True):
        problem = _layer_problem(name, layer)
        if problem:
            return problem
    first = layers[0]
    for name, layer in zip(names[1:], layers[1:], strict=True):
        if type(layer) is not type(first):
            return (f"{name} is {type(layer).__name__}, {names[0]} is {type(first).__name__}:"
                    " a block of quantized and dense projections has no one GEMM (quantize "
                    "all of them or none)")
        for what, mine, theirs in _differences(layer, first):
            if mine != theirs:
                return f"{name} has {what} {mine!r}, {names[0]} has {theirs!r}"
        if _is_dense(layer):
            continue
        if (layer.input_perm is None) != (first.input_perm is None) or (
                layer.input_perm is not None and first.input_perm is not None
                and not torch.equal(layer.input_perm, first.input_perm)):
            return (f"{name} and {names[0]} permute their inputs differently (GPTQ act-order);"
                    " one GEMM takes one input order")
    return None


def _tile_view_ok(layer: QuantLinear) -> bool:
    """True when ``qweight`` is whole tiles stored K tile major (checked by the format)."""
    fmt = layer.kernel_format
    return bool(fmt.fast) and fmt.format.tile_bytes % fmt.format.chunk == 0


def _tiles(qweight: torch.Tensor, layer: QuantLinear, n: int) -> torch.Tensor:
    """``qweight`` of an ``[n, K]`` weight as ``[K/bk, n/bn, rows per tile, chunk]``."""
    fmt = layer.kernel_format.format
    return qweight.reshape(layer.in_features // fmt.bk, n // fmt.bn, fmt.tile_rows, fmt.chunk)


def _concat_qweight(parts: Sequence[torch.Tensor], sizes: Sequence[int],
                    like: QuantLinear) -> torch.Tensor:
    """The repacked bytes of the weights ``parts`` (each ``[sizes[i], K]``) stacked along N."""
    fmt, k = like.kernel_format, like.in_features
    if _tile_view_ok(like):
        joined = torch.cat([_tiles(p, like, n) for p, n in zip(parts, sizes, strict=True)], 1)
        return joined.reshape(fmt.shape(sum(sizes), k))
    codes = torch.cat([fmt.unpack(p, n, k) for p, n in zip(parts, sizes, strict=True)])
    return fmt.repack(codes)


def _split_qweight(qweight: torch.Tensor, sizes: Sequence[int],
                   like: QuantLinear) -> list[torch.Tensor]:
    """The inverse of :func:`_concat_qweight`: one contiguous tensor per part."""
    fmt, k = like.kernel_format, like.in_features
    if _tile_view_ok(like):
        tiles = _tiles(qweight, like, sum(sizes))
        chunks = tiles.split([n // fmt.format.bn for n in sizes], dim=1)
        return [_own(c).reshape(fmt.shape(n, k)) for c, n in zip(chunks, sizes, strict=True)]
    codes = fmt.unpack(qweight, sum(sizes), k)
    return [fmt.repack(c.contiguous()) for c in codes.split(list(sizes))]


def _own(part: torch.Tensor) -> torch.Tensor:
    """A contiguous copy: a slice may be a view of the fused buffer, and tensors sharing
    storage cannot be saved side by side (safetensors refuses them)."""
    return part.clone(memory_format=torch.contiguous_format)


def _storage_of(layer: nn.Module) -> torch.Tensor:
    """The tensor that says where a layer's weights live."""
    return layer.weight if _is_dense(layer) else layer.qweight


def _concat_dense(layers: list[nn.Linear]) -> nn.Linear:
    first = layers[0]
    weight = first.weight
    fused = nn.Linear(first.in_features, sum(la.out_features for la in layers),
                      bias=first.bias is not None, device="meta", dtype=weight.dtype)
    with torch.no_grad():
        fused.weight = nn.Parameter(torch.cat([la.weight for la in layers]),
                                    requires_grad=weight.requires_grad)
        if first.bias is not None:
            fused.bias = nn.Parameter(torch.cat([la.bias for la in layers]),
                                      requires_grad=first.bias.requires_grad)
    return fused


def concat_out_features(layers: Sequence[Any]) -> Any:
    """One layer whose output is ``torch.cat([l(x) for l in layers], -1)``: a
    ``QuantLinear`` of ``QuantLinear`` layers, an ``nn.Linear`` of ``nn.Linear`` layers.

    The layers must be of one kind and share in_features, format (dense: dtype and
    requires_grad), device, bias presence and dtype, and input permutation (else
    :class:`FuseError`). The originals are not changed; the caller drops them, so only
    one copy of the weights outlives the call.
    """
    problem = concat_problem(layers)
    if problem:
        raise FuseError(f"concat_out_features: {problem}")
    layers = list(layers)
    first = layers[0]
    if _is_dense(first):
        fused = _concat_dense(layers)
        fused.train(first.training)
        return fused
    sizes = [layer.out_features for layer in layers]
    fused = QuantLinear(first.in_features, sum(sizes), first.spec.wtype, first.spec.group_size,
                        first.spec.zero_point, bias=first.bias is not None,
                        act_order=first.input_perm is not None, device="meta",
                        bias_dtype=torch.float16 if first.bias is None else first.bias.dtype)
    with torch.no_grad():
        for key in ("qweight", "scales", "zeros", "bias"):  # joined as a state dict is
            values = [getattr(layer, key) for layer in layers]
            if values[0] is not None:
                setattr(fused, key, _merge_entries(key, values, fused, sizes))
        if first.input_perm is not None:
            fused.input_perm = first.input_perm.clone()
    fused.train(first.training)
    return fused


def _split_entry(key: str, value: Any, layer: nn.Module,
                 sizes: Sequence[int]) -> list[Any]:
    """One state-dict entry of a fused layer as the entries of its parts."""
    if key == "qweight":
        return _split_qweight(value, sizes, layer)
    if key in ("scales", "zeros"):
        return [_own(part) for part in value.split(list(sizes), dim=1)]
    if key in ("bias", "weight"):
        return [_own(part) for part in value.split(list(sizes))]
    return [_own(value) if isinstance(value, torch.Tensor) else value for _ in sizes]


def _merge_entries(key: str, values: list[Any], layer: nn.Module,
                   sizes: Sequence[int]) -> Any:
    """The entries of the parts as the fused layer's entry (inverse of _split_entry)."""
    storage = _storage_of(layer)
    device = values[0].device if storage.is_meta else storage.device
    if key == "qweight":
        return _concat_qweight([v.to(device) for v in values], sizes, layer)
    if key in ("scales", "zeros"):
        return torch.cat([v.to(device) for v in values], 1)
    if key in ("bias", "weight"):
        return torch.cat([v.to(device) for v in values])
    if key == _EXTRA_STATE_KEY_SUFFIX:  # a differing record is passed on: its check refuses
        own = layer.get_extra_state()
        return next((v for v in values if not (isinstance(v, torch.Tensor)
                                               and torch.equal(v.cpu(), own))), values[0])
    return values[0]  # input_perm: the parts' (checked equal by the loader's copy)


def _expected_shape(key: str, layer: nn.Module, n: int) -> tuple[int, ...] | None:
    if key == "qweight":
        return tuple(layer.kernel_format.shape(n, layer.in_features))
    if key in ("scales", "zeros"):
        return (layer.in_features // layer.spec.group_size, n)
    if key == "weight":
        return (n, layer.in_features)
    if key == "bias":
        return (n,)
    return None


# --------------------------------------------------------------------------------------
# State dicts of fused blocks: saved split, loaded merged

_FUSED_ATTR = "_lowvm_fused"  # {fused child: ((part name, out_features), ...)}


def _split_state_dict(module: nn.Module, state_dict: dict[str, Any], prefix: str,
                      local_metadata: dict[str, Any]) -> None:
    """state_dict post-hook: the fused children's entries become the parts' entries, in
    place and in the unfused order (this module's keys are the dict's tail)."""
    fused: dict[str, tuple[tuple[str, int], ...]] = getattr(module, _FUSED_ATTR)
    mine = [key for key in state_dict if key.startswith(prefix)]
    entries = [(key, state_dict.pop(key)) for key in mine]
    metadata = getattr(state_dict, "_metadata", None)
    done: set[str] = set()
    for key, value in entries:
        child = key[len(prefix):].partition(".")[0]
        if child not in fused:
            state_dict[key] = value
            continue
        if child in done:
            continue
        done.add(child)
        layer = getattr(module, child)
        parts = fused[child]
        sizes = [n for _, n in parts]
        own = [(k, v) for k, v in entries if k.startswith(f"{prefix}{child}.")]
        split = {k: _split_entry(k[len(prefix) + len(child) + 1:], v, layer, sizes)
                 for k, v in own}
        for i, (part, _) in enumerate(parts):
            for k, values in split.items():
                state_dict[f"{prefix}{part}.{k[len(prefix) + len(child) + 1:]}"] = values[i]
        if metadata is not None and f"{prefix}{child}" in metadata:
            record = metadata.pop(f"{prefix}{child}")
            for part, _ in parts:
                metadata[f"{prefix}{part}"] = dict(record)


def _merge_state_dict(module: nn.Module, state_dict: dict[str, Any], prefix: str,
                      local_metadata: dict[str, Any], strict: bool, missing_keys: list[str],
                      unexpected_keys: list[str], error_msgs: list[str]) -> None:
    """load_state_dict pre-hook: an unfused state dict's parts become the fused entries.
    Parts missing (a partial state dict) are left alone, to be reported as usual."""
    fused: dict[str, tuple[tuple[str, int], ...]] = getattr(module, _FUSED_ATTR)
    for child, parts in fused.items():
        layer = getattr(module, child)
        locals_ = _state_keys(layer)
        keys = {local: [f"{prefix}{part}.{local}" for part, _ in parts] for local in locals_}
        if not all(k in state_dict for ks in keys.values() for k in ks):
            continue
        bad = [f"size mismatch for {k}: copying a param with shape "
               f"{tuple(state_dict[k].shape)} from checkpoint, the shape in current model is "
               f"{shape}." for local, ks in keys.items()
               for k, (_, n) in zip(ks, parts, strict=True)
               if (shape := _expected_shape(local, layer, n)) is not None
               and tuple(state_dict[k].shape) != shape]
        if "input_perm" in keys and not all(
                torch.equal(state_dict[k], state_dict[keys["input_perm"][0]])
                for k in keys["input_perm"]):
            bad.append(f"{', '.join(keys['input_perm'])} differ; the fused {prefix}{child} "
                       "takes one input permutation")
        sizes = [n for _, n in parts]
        values = {local: [state_dict.pop(k) for k in ks] for local, ks in keys.items()}
        if bad:
            error_msgs.extend(bad)
            continue
        for local, vals in values.items():
            state_dict[f"{prefix}{child}.{local}"] = _merge_entries(local, vals, layer, sizes)


def _state_keys(layer: nn.Module) -> list[str]:
    """The keys of ``layer``'s own state-dict entries (relative to the layer)."""
    keys = [name for name, param in layer._parameters.items() if param is not None]
    keys += [name for name, buf in layer._buffers.items()
             if buf is not None and name not in layer._non_persistent_buffers_set]
    if type(layer).get_extra_state is not nn.Module.get_extra_state:
        keys.append(_EXTRA_STATE_KEY_SUFFIX)
    return keys


def _mark_fused(module: nn.Module, child: str, parts: tuple[tuple[str, int], ...]) -> None:
    """Record a fused child and make the module's state dict split/merge it."""
    fused = getattr(module, _FUSED_ATTR, None)
    if fused is None:
        fused = {}
        object.__setattr__(module, _FUSED_ATTR, fused)
        module.register_state_dict_post_hook(_split_state_dict)
        module.register_load_state_dict_pre_hook(_merge_state_dict)
    fused[child] = parts


def _replace_children(module: nn.Module, parts: Sequence[str], name: str,
                      new: nn.Module) -> None:
    """Put ``new`` where the first of ``parts`` was and drop the parts (keeps key order)."""
    children = {}
    for child, sub in module._modules.items():
        if child == parts[0]:
            children[name] = new
        elif child not in parts:
            children[child] = sub
    module._modules.clear()
    module._modules.update(children)


def _forward_replaced(module: nn.Module) -> bool:
    """A forward set on the instance (accelerate's offloading hooks do that)."""
    return "forward" in vars(module) or "_hf_hook" in vars(module)


def _has_hooks(module: nn.Module) -> bool:
    """Hooks, or a forward set on the instance."""
    if _forward_replaced(module):
        return True
    return any(getattr(module, attr, None) for attr in (
        "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
        "_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks"))


# --------------------------------------------------------------------------------------
# Which Hugging Face classes lowvm reproduces

class _Style(NamedTuple):
    """How a known attention forward differs from Llama's (the same in every version)."""

    sliding: str | None  # None: no sliding_window argument; "config" / "attr": where from
    qk_norm: bool  # q_norm/k_norm on each head before the rotary embedding (Qwen3)


class _CacheApi(NamedTuple):
    """How one transformers version's attention forward takes and updates the KV cache
    (the same for all four classes of that version, so one per version)."""

    name: str  # the parameter, which the decoder layer passes by keyword
    update_kwargs: bool  # update(..., kwargs=kwargs): the call's kwargs reach the cache
    renamed_from: tuple[str, str] | None  # (old name, removal version) of the forward's
    # ``@deprecate_kwarg(old, version, new_name=name)``; None: not decorated


# 5.17-5.23: ``past_key_values.update(k, v, layer_idx)``, no decorator
_CACHE_517 = _CacheApi("past_key_values", False, None)
# 5.24: ``@deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")``, argument
# ``cache`` (passed so by the decoder layer), ``cache.update(k, v, layer_idx, kwargs=kwargs)``
_CACHE_524 = _CacheApi("cache", True, ("past_key_values", "5.40.0"))


_TF = "transformers.models"
_ATTENTION: dict[tuple[str, str], _Style] = {
    (f"{_TF}.llama.modeling_llama", "LlamaAttention"): _Style(None, False),
    (f"{_TF}.mistral.modeling_mistral", "MistralAttention"): _Style("config", False),
    (f"{_TF}.qwen2.modeling_qwen2", "Qwen2Attention"): _Style("attr", False),
    (f"{_TF}.qwen3.modeling_qwen3", "Qwen3Attention"): _Style("attr", True),
}
_MLP = {(f"{_TF}.llama.modeling_llama", "LlamaMLP"),
        (f"{_TF}.mistral.modeling_mistral", "MistralMLP"),
        (f"{_TF}.qwen2.modeling_qwen2", "Qwen2MLP"),
        (f"{_TF}.qwen3.modeling_qwen3", "Qwen3MLP")}
_VERSIONS = "transformers 5.17-5.24"  # what _KNOWN_FORWARDS holds, for messages
# _forward_fingerprint of each class's forward (the same on Python 3.8-3.13) -> the cache
# API of that forward (None for MLPs): transformers 5.17.0 and 5.23.0 (equal there), 5.24.0
_KNOWN_FORWARDS: dict[str, dict[str, _CacheApi | None]] = {
    "LlamaAttention": {"c2ef3fbb30977e41": _CACHE_517, "62783768143eb34a": _CACHE_524},
    "MistralAttention": {"477db29ff9c14780": _CACHE_517, "f74f529b2bc43155": _CACHE_524},
    "Qwen2Attention": {"a7628cbae0ae1f4a": _CACHE_517, "7d88bcb0170ca9e5": _CACHE_524},
    "Qwen3Attention": {"534e89fa12a5c240": _CACHE_517, "bb3bef4e9c69b49f": _CACHE_524},
    **{name: {"189facc23dad2ca3": None}  # unchanged in 5.24
       for name in ("LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP")},
}


def _canonical(node: Any) -> str:
    """A syntax tree as text that is the same on every Python >= 3.10 (ast.dump's form
    changed in 3.13): node names and fields, empty fields left out."""
    if isinstance(node, ast.AST):
        fields = [f"{name}={_canonical(value)}" for name, value in ast.iter_fields(node)
                  if value is not None and value != [] and name != "type_comment"]
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return "[" + ",".join(_canonical(item) for item in node) + "]"
    return repr(node)


def _forward_tree(cls: type) -> ast.FunctionDef | None:
    """``cls.forward``'s source as a syntax tree (through decorators that ``functools.wraps``
    it); None when its source cannot be read."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.forward)))
    except (OSError, TypeError, SyntaxError):
        return None
    func = tree.body[0]
    return func if isinstance(func, ast.FunctionDef) else None


@functools.cache
def _forward_fingerprint(cls: type) -> str | None:
    """A hash of ``cls.forward``'s code, annotations and decorators left out; None when
    its source cannot be read."""
    func = _forward_tree(cls)
    if func is None:
        return None
    for node in ast.walk(func):
        if isinstance(node, ast.arg):
            node.annotation = None
    text = _canonical(func.args) + _canonical(func.body)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@functools.cache
def _forward_decorators(cls: type) -> str | None:
    """``cls.forward``'s decorators, canonical (the fingerprint leaves them out)."""
    func = _forward_tree(cls)
    return None if func is None else _canonical(func.decorator_list)


def _expected_decorators(api: _CacheApi | None) -> str:
    """The decorators of a forward of cache API ``api``: those the fused forward repeats."""
    if api is None or api.renamed_from is None:
        return _canonical([])
    old, version = api.renamed_from
    return _canonical([ast.parse(f"deprecate_kwarg({old!r}, {version!r}, new_name="
                                 f"{api.name!r})", mode="eval").body])


def _known(cls: type, table: Any) -> str | None:
    """Why ``cls`` is not a class lowvm fuses (None when it is)."""
    if (cls.__module__, cls.__name__) not in table:
        return (f"class {cls.__name__} is not one whose forward lowvm reproduces "
                "(Llama, Mistral, Qwen2, Qwen3)")
    known = _KNOWN_FORWARDS[cls.__name__]
    fingerprint = _forward_fingerprint(cls)
    if fingerprint not in known or \
            _forward_decorators(cls) != _expected_decorators(known[fingerprint]):
        import transformers

        return (f"{cls.__name__}.forward of transformers {transformers.__version__} differs "
                f"from the one lowvm reproduces ({_VERSIONS})")
    return None


# --------------------------------------------------------------------------------------
# The fused modules


class FusedGateUpMLP(nn.Module):
    """A Llama-style MLP with gate and up in one GEMM: ``down(act(gate) * up)``."""

    def __init__(self, gate_up_proj: QuantLinear | nn.Linear, down_proj: nn.Module,
                 act_fn: Callable[[torch.Tensor], torch.Tensor],
                 intermediate_size: int) -> None:
        super().__init__()
        # its state dict splits gate_up_proj's entries in two halves, which only these
        # layers' entries do (by out_features)
        kind_ok = type(gate_up_proj) is QuantLinear or _is_dense(gate_up_proj)
        if not kind_ok or gate_up_proj.out_features != 2 * intermediate_size:
            raise FuseError(f"FusedGateUpMLP: gate_up_proj must be {_KINDS} with "
                            f"out_features 2 * intermediate_size = {2 * intermediate_size}; got "
                            f"{type(gate_up_proj).__name__}"
                            + (f" with out_features {gate_up_proj.out_features}"
                               if kind_ok else ""))
        self.gate_up_proj = gate_up_proj
        self.down_proj = down_proj
        self.act_fn = act_fn
        self.intermediate_size = intermediate_size
        _mark_fused(self, "gate_up_proj", (("gate_proj", intermediate_size),
                                           ("up_proj", intermediate_size)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


def _attention_forward(module: Any, style: _Style, api: _CacheApi) -> Callable[..., Any]:
    """The fused forward of one attention class: the HF forward with q/k/v split out of
    one GEMM, using that class's own modeling helpers, looked up in ``module`` at each call
    as the HF forward does (a helper patched into the modeling module later, e.g. a fused
    rotary kernel, is used). ``api`` gives the cache argument's name and update call of
    the installed version, and its ``deprecate_kwarg`` (from ``module``) is repeated."""
    sliding, qk_norm = style
    from lowvm.nn.serve import attention

    lowvm_steps = sliding is None and not qk_norm  # Llama-style: what the kernel computes

    def fused(self: Any, hidden_states: torch.Tensor,
              position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
              attention_mask: torch.Tensor | None, cache: Any,
              kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        if lowvm_steps and self.config._attn_implementation == attention.ATTENTION_NAME:
            step = attention.fused_decode_step(self, hidden_states, position_embeddings,
                                               attention_mask, cache, kwargs)
            if step is not None:  # a decode step as one kernel after the q/k/v GEMM
                return step
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)

        query, key, value = self.qkv_proj(hidden_states).split(self._lowvm_qkv, dim=-1)
        if qk_norm:
            query_states = self.q_norm(query.view(hidden_shape)).transpose(1, 2)
            key_states = self.k_norm(key.view(hidden_shape)).transpose(1, 2)
        else:
            query_states = query.view(hidden_shape).transpose(1, 2)
            key_states = key.view(hidden_shape).transpose(1, 2)
        value_states = value.view(hidden_shape).transpose(1, 2)

        cos, sin = position_embeddings  # type: ignore[misc]
        query_states, key_states = module.apply_rotary_pos_emb(query_states, key_states, cos,
                                                               sin)

        if cache is not None:
            if api.update_kwargs:
                key_states, value_states = cache.update(key_states, value_states,
                                                        self.layer_idx, kwargs=kwargs)
            else:
                key_states, value_states = cache.update(key_states, value_states,
                                                        self.layer_idx)

        attention_interface = module.ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, module.eager_attention_forward)
        dropout = 0.0 if not self.training else self.attention_dropout
        if sliding is None:
            attn_output, attn_weights = attention_interface(
                self, query_states, key_states, value_states, attention_mask,
                dropout=dropout, scaling=self.scaling, **kwargs)
        else:
            window = (getattr(self.config, "sliding_window", None) if sliding == "config"
                      else self.sliding_window)
            attn_output, attn_weights = attention_interface(
                self, query_states, key_states, value_states, attention_mask,
                dropout=dropout, scaling=self.scaling, sliding_window=window, **kwargs)

        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        attn_output = self.o_proj(attn_output)
        return attn_output, attn_weights

    # The HF signature, cache parameter named as the installed decoder layer passes it
    if api.name == "cache":
        def forward(self: Any, hidden_states: torch.Tensor,
                    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                    attention_mask: torch.Tensor | None = None, cache: Any = None,
                    **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
            return fused(self, hidden_states, position_embeddings, attention_mask, cache,
                         kwargs)
    elif api.name == "past_key_values":
        def forward(self: Any, hidden_states: torch.Tensor,
                    position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
                    attention_mask: torch.Tensor | None = None, past_key_values: Any = None,
                    **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
            return fused(self, hidden_states, position_embeddings, attention_mask,
                         past_key_values, kwargs)
    else:  # a new _CacheApi needs its signature here
        raise AssertionError(f"no fused forward taking the cache as {api.name!r}")
    if api.renamed_from is not None:  # the old name still works, with HF's warning
        old, version = api.renamed_from
        forward = module.deprecate_kwarg(old, version, new_name=api.name)(forward)
    return forward


@functools.cache
def _fused_attention_class(cls: type) -> type:
    """``Fused<cls>``: ``cls`` with q/k/v fused (a subclass, so isinstance checks hold).
    Refused (:class:`FuseError`) for a forward lowvm does not reproduce, e.g. a pickle of
    a fused model loaded under another transformers."""
    why = _known(cls, _ATTENTION)
    if why:
        raise FuseError(f"cannot make Fused{cls.__name__}: {why}")
    forward = _attention_forward(sys.modules[cls.__module__],
                                 _ATTENTION[(cls.__module__, cls.__name__)],
                                 _KNOWN_FORWARDS[cls.__name__][_forward_fingerprint(cls)])
    forward.__signature__ = inspect.signature(cls.forward)  # type: ignore[attr-defined]
    name = f"Fused{cls.__name__}"
    fused = type(name, (cls,), {
        "forward": forward, "__module__": __name__, "__qualname__": name,
        "__doc__": f"{cls.__name__} with q_proj/k_proj/v_proj fused into qkv_proj (lowvm)."})
    globals()[name] = fused  # importable by name (pickle)
    return fused


def __getattr__(name: str) -> Any:
    """``Fused<Attention>`` classes are made on demand, so pickles of fused models load."""
    for module_name, cls_name in _ATTENTION:
        if name == f"Fused{cls_name}":
            return _fused_attention_class(getattr(importlib.import_module(module_name),
                                                  cls_name))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --------------------------------------------------------------------------------------
# The transform


def _is_attention_like(module: nn.Module) -> bool:
    return all(hasattr(module, n) for n in ("q_proj", "k_proj", "v_proj"))


def _is_mlp_like(module: nn.Module) -> bool:
    return all(hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj"))


_DENSE_OFF = ("dense projections; fuse_projections(model, dense=True) fuses them too "
              "(dense=False: quantized blocks only)")


def _dense_off(parts: Sequence[Any], dense: bool) -> str | None:
    return _DENSE_OFF if not dense and all(_is_dense(p) for p in parts) else None


def _attention_problem(attn: nn.Module, shared: set[int], dense: bool) -> str | None:
    why = _known(type(attn), _ATTENTION)
    if why:
        return why
    if _forward_replaced(attn):
        return "the attention's forward is replaced on the instance (accelerate hooks?)"
    parts = [attn.q_proj, attn.k_proj, attn.v_proj]
    if any(id(p) in shared for p in parts):
        return "q_proj/k_proj/v_proj is shared with another module"
    return concat_problem(parts, ["q_proj", "k_proj", "v_proj"]) or _dense_off(parts, dense)


def _mlp_problem(mlp: nn.Module, shared: set[int], dense: bool) -> str | None:
    why = _known(type(mlp), _MLP)
    if why:
        return why
    if id(mlp) in shared or id(mlp.gate_proj) in shared or id(mlp.up_proj) in shared:
        return "the MLP or its gate_proj/up_proj is shared with another module"
    if _has_hooks(mlp):
        return "the MLP has hooks, which its replacement would not have"
    parts = [mlp.gate_proj, mlp.up_proj]
    return (concat_problem(parts, ["gate_proj", "up_proj"]) or _dense_off(parts, dense)
            or (None if mlp.gate_proj.out_features == mlp.up_proj.out_features else
                f"gate_proj has out_features {mlp.gate_proj.out_features}, up_proj "
                f"{mlp.up_proj.out_features}"))


def _shared_modules(model: nn.Module) -> set[int]:
    """ids of modules registered under more than one name."""
    seen: dict[int, int] = {}
    for _, module in model.named_modules(remove_duplicate=False):
        seen[id(module)] = seen.get(id(module), 0) + 1
    return {mid for mid, count in seen.items() if count > 1}


def _fuse_attention(attn: nn.Module) -> None:
    parts = ("q_proj", "k_proj", "v_proj")
    layers = [getattr(attn, p) for p in parts]
    sizes = tuple(layer.out_features for layer in layers)
    fused = concat_out_features(layers)
    attn.__class__ = _fused_attention_class(type(attn))
    _replace_children(attn, parts, "qkv_proj", fused)
    object.__setattr__(attn, "_lowvm_qkv", sizes)
    _mark_fused(attn, "qkv_proj", tuple(zip(parts, sizes, strict=True)))


def _fuse_mlp(mlp: nn.Module) -> FusedGateUpMLP:
    gate_up = concat_out_features([mlp.gate_proj, mlp.up_proj])
    new = FusedGateUpMLP(gate_up, mlp.down_proj, mlp.act_fn, mlp.gate_proj.out_features)
    for attr in ("config", "hidden_size"):
        if attr in vars(mlp):
            setattr(new, attr, vars(mlp)[attr])
    new.train(mlp.training)
    return new


def fuse_projections(model: nn.Module, *, dense: bool = True) -> FuseReport:
    """Fuse the q/k/v and the gate/up projections of ``model``'s blocks, in place.

    A block is fused when its projections are all ``QuantLinear`` of one format or, with
    ``dense`` (the default: a float16 model gets the same fewer, larger GEMMs as a
    quantized one), all ``nn.Linear`` of one dtype (float16, bfloat16 or float32) and
    device; ``dense=False`` leaves dense blocks alone. Every candidate (an attention with
    q/k/v projections, an MLP with gate/up/down) is checked first; those that cannot be
    fused exactly, mixed quantized/dense blocks among them, are listed in the report with
    the reason, and nothing about them changes. Idempotent: fused blocks are recognised
    and left alone. Each fused block's weights are built before its originals are
    dropped, so at most one block's q/k/v (or gate/up) exists twice at any moment.
    """
    if not isinstance(model, nn.Module):
        raise FuseError(f"fuse_projections: model must be a torch.nn.Module; got "
                        f"{type(model).__name__}")
    if not isinstance(dense, bool):
        raise FuseError(f"fuse_projections: dense must be True or False; got {dense!r}")
    report = FuseReport()
    shared = _shared_modules(model)
    attentions: list[nn.Module] = []
    mlps: list[str] = []  # names only: a held module would keep its weights alive
    for name, module in model.named_modules():
        if getattr(module, _FUSED_ATTR, None) is not None:
            report.already_fused += 1
        elif _is_attention_like(module):
            why = _attention_problem(module, shared, dense)
            if why:
                report.skipped.append((name, why))
            else:
                attentions.append(module)
        elif _is_mlp_like(module):
            why = ("the model itself is the MLP; fuse_projections replaces MLPs inside a "
                   "model") if not name else _mlp_problem(module, shared, dense)
            if why:
                report.skipped.append((name, why))
            else:
                mlps.append(name)
    for attn in attentions:
        report.dense_fused += _is_dense(attn.q_proj)
        _fuse_attention(attn)
        report.attention_fused += 1
    for name in mlps:
        mlp = model.get_submodule(name)
        report.dense_fused += _is_dense(mlp.gate_proj)
        set_module(model, name, _fuse_mlp(mlp))  # the old MLP is dropped
        del mlp
        report.mlps_fused += 1
    return report
