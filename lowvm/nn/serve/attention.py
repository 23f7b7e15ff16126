"""Decode attention on lowvm's VM program, plugged in through transformers' attention interface.

:func:`use_decode_attention` registers an attention implementation named ``"lowvm"``
with transformers (``AttentionInterface`` and ``AttentionMaskInterface``, the extension
points out-of-tree kernels use) and switches a model to it. A decode step (one query
position) on a CUDA device in float16/bfloat16 then runs
:mod:`lowvm.kernels.decode_attention`: one launch per layer that reads each KV head once
for its whole query group. Everything else — prefill, a CPU, head sizes or groups the
program does not take, dropout in training, softcapping, attention sinks, a position
bias, caches longer than :data:`MAX_LENGTH` — goes to transformers' own SDPA path,
unchanged, so switching is never a change of results beyond float rounding.

The kernel sits behind the custom op ``torch.ops.lowvm.decode_attention`` (with a fake
implementation), so ``torch.compile(fullgraph=True)`` and CUDA-graph capture see one
opaque call.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from lowvm.errors import LowvmError
from lowvm.kernels.decode_attention import GROUP_MAX, HEAD_DIMS

__all__ = ["use_decode_attention", "decode_attention", "decode_attention_rope",
           "fused_decode_step", "decode_attention_problem",
           "ATTENTION_NAME", "MAX_LENGTH", "AttentionError"]

#: the name the implementation is registered under (``config._attn_implementation``)
ATTENTION_NAME = "lowvm"
#: longest cache the kernel serves: the longest measured, faster than transformers'
#: compiled SDPA path at every length up to it, batch 1 and 16
#: (`python -m lowvm.bench attention`). One block per (sequence, KV head) walks the whole
#: cache, so long caches at batch 1 use few SMs; splitting the cache over blocks is not
#: done yet.
MAX_LENGTH = 8192


class AttentionError(LowvmError, ValueError):
    """Tensors the decode-attention op cannot take (named with the value and the rule)."""


def decode_attention_problem(query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor) -> str | None:
    """Why the kernel cannot serve this call (a sentence), or None when it can.

    ``query [batch, heads, q_len, head_dim]``, ``key``/``value`` ``[batch, kv_heads,
    length, head_dim]`` as transformers passes them."""
    if query.dim() != 4:
        return f"query must be 4-d; got {list(query.shape)}"
    return shape_problem(tuple(query.shape), query.dtype, query.device, key, value)


def shape_problem(query_shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                  key: torch.Tensor, value: torch.Tensor) -> str | None:
    """:func:`decode_attention_problem` for a query not yet computed: its
    ``[batch, heads, q_len, head_dim]``, dtype and device."""
    if key.dim() != 4 or value.shape != key.shape:
        return (f"key/value must be 4-d of one shape; got key {list(key.shape)}, value "
                f"{list(value.shape)}")
    batch, heads, q_len, head_dim = query_shape
    kv_heads, length = key.shape[1], key.shape[2]
    if q_len != 1:
        return f"query length {q_len}: the kernel serves decode steps (1 position)"
    if torch.device(device).type != "cuda":
        return f"query on {device}: the kernel runs on CUDA devices"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"query dtype {dtype}: the kernel takes float16 or bfloat16"
    if key.dtype != dtype or value.dtype != dtype:
        return f"key/value dtype {key.dtype}/{value.dtype} differs from query's {dtype}"
    if key.device != torch.device(device) or value.device != torch.device(device):
        return "query, key and value are on different devices"
    if head_dim not in HEAD_DIMS or key.shape[3] != head_dim:
        return f"head_dim {head_dim}: the kernel takes {HEAD_DIMS}"
    if kv_heads < 1 or heads % kv_heads or not 1 <= heads // kv_heads <= GROUP_MAX:
        return (f"{heads} query heads over {kv_heads} KV heads: the kernel takes groups "
                f"of 1..{GROUP_MAX} query heads per KV head")
    if key.shape[0] != batch:
        return f"key batch {key.shape[0]} differs from query batch {batch}"
    if not 1 <= length <= MAX_LENGTH:
        return f"cache length {length}: the kernel serves 1..{MAX_LENGTH} positions"
    return None


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
               scale: float) -> torch.Tensor:
    """The op's semantics in float32 (CPU and fake-free fallback)."""
    batch, heads, dim = q.shape
    kv_heads, length = k.shape[1], k.shape[2]
    qg = q.float().reshape(batch, kv_heads, heads // kv_heads, dim)
    s = torch.einsum("bhgd,bhtd->bhgt", qg, k.float()) * scale
    s = s.masked_fill(mask.reshape(batch, 1, 1, length) == 0, float("-inf"))
    out = torch.einsum("bhgt,bhtd->bhgd", torch.softmax(s, -1), v.float())
    return out.reshape(batch, heads, dim).to(q.dtype)


def _check(name: str, t: torch.Tensor, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...],
           device: torch.device) -> None:
    """Raise :class:`AttentionError` naming ``name`` unless ``t`` is a contiguous tensor of
    ``shape`` (-1: any size), one of ``dtypes``, on ``device`` (the kernel reads raw memory)."""
    if not isinstance(t, torch.Tensor):
        raise AttentionError(f"{name} must be a tensor, got {type(t).__name__}")
    if len(t.shape) != len(shape) or any(w != -1 and g != w for g, w in zip(t.shape, shape)):
        want = ", ".join("*" if w == -1 else str(w) for w in shape)
        raise AttentionError(f"{name} has shape {list(t.shape)}; expected [{want}]")
    if t.dtype not in dtypes:
        raise AttentionError(f"{name} has dtype {t.dtype}; accepted: "
                             f"{', '.join(str(d) for d in dtypes)}")
    if t.device != device:
        raise AttentionError(f"{name} is on {t.device}; expected {device} (where q is)")
    if not t.is_contiguous():
        raise AttentionError(f"{name} must be contiguous (strides {list(t.stride())})")


def _check_heads(heads: int, kv_heads: int, dim: int, length: int) -> None:
    if kv_heads < 1 or heads % kv_heads or not 1 <= heads // kv_heads <= GROUP_MAX:
        raise AttentionError(f"{heads} query heads over {kv_heads} KV heads: the kernel "
                             f"takes groups of 1..{GROUP_MAX} query heads per KV head")
    if dim not in HEAD_DIMS:
        raise AttentionError(f"head_dim {dim}: the kernel takes {HEAD_DIMS}")
    if length < 1:
        raise AttentionError(f"cache length {length}: at least 1 position needed")


_PROGRAMS: dict[tuple, Any] = {}


def _compiled(dtype: torch.dtype, kv_heads: int, group: int, head_dim: int,
              rope: bool = False) -> Any:
    key = (dtype, kv_heads, group, head_dim, rope)
    if key not in _PROGRAMS:
        from lowvm.driver import compile as compile_program
        from lowvm.dtypes import dtype as as_dtype
        from lowvm.kernels import decode_attention as programs

        program = programs.decode_attention_rope if rope else programs.decode_attention
        # 3 K/V tiles in flight measured 2-7 % faster than 2 (head_dim 128); 256-wide
        # heads keep 2 (3 would need 197 KB of shared memory, more than an A100 has)
        _PROGRAMS[key] = compile_program(program, adtype=as_dtype(dtype), kv_heads=kv_heads,
                                         group=group, head_dim=head_dim,
                                         stages=3 if head_dim <= 128 else 2)
    return _PROGRAMS[key]


@torch.library.custom_op("lowvm::decode_attention", mutates_args=())
def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """``q [batch, heads, head_dim]``, ``k``/``v`` ``[batch, kv_heads, length, head_dim]``,
    ``mask [batch, length]`` bool or uint8 (nonzero: attend) -> ``[batch, heads, head_dim]``:
    ``softmax(q k^T * scale, masked) v`` per head, query head ``h`` reading KV head
    ``h // (heads // kv_heads)``. CUDA float16/bfloat16: the VM program; else float32
    reference math."""
    batch, heads, dim = q.shape
    kv_heads, length = k.shape[1], k.shape[2]
    if not q.is_cuda:
        return _reference(q, k, v, mask, scale)
    from lowvm.kernels.library import overlap_enabled

    floats = (torch.float16, torch.bfloat16)
    _check("q", q, (-1, -1, -1), floats, q.device)
    _check("k", k, (batch, -1, -1, dim), (q.dtype,), q.device)
    _check("v", v, tuple(k.shape), (q.dtype,), q.device)
    _check("mask", mask, (batch, length), (torch.bool, torch.uint8), q.device)
    _check_heads(heads, kv_heads, dim, length)

    if mask.dtype == torch.bool:  # same bytes, read as the kernel's uint8: no conversion
        mask = mask.view(torch.uint8)
    out = torch.empty_like(q)
    program = _compiled(q.dtype, kv_heads, heads // kv_heads, dim)
    program(batch, length, q, k, v, mask, out, float(scale), overlap=overlap_enabled())
    return out


def _rotated(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x cos + rotate_half(x) sin`` in float32, ``x [batch, n, dim]``, ``cos [batch, dim]``."""
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * cos.float()[:, None] + turned * sin.float()[:, None]


@torch.library.custom_op("lowvm::decode_attention_rope", mutates_args=("k_cache", "v_cache"))
def decode_attention_rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                          k_cache: torch.Tensor, v_cache: torch.Tensor, position: torch.Tensor,
                          mask: torch.Tensor, scale: float, heads: int) -> torch.Tensor:
    """A decode step's attention from the fused q/k/v projection: ``qkv [batch, (heads +
    2 kv_heads) head_dim]``, ``cos``/``sin [batch, head_dim]``, caches ``[batch, kv_heads,
    length, head_dim]``, ``position`` (one int32/int64: the cache row this step writes, as
    a transformers ``StaticLayer``'s ``cumulative_length``), ``mask [batch, length]``.
    Rotates q and k, writes k and v into the caches at ``position``, returns
    :func:`decode_attention` of the rotated q -> ``[batch, heads, head_dim]``."""
    batch, kv_heads, length, dim = k_cache.shape
    if not qkv.is_cuda and not k_cache.is_cuda:
        x = qkv.float().view(batch, heads + 2 * kv_heads, dim)
        row = int(position.reshape(-1)[0])
        k_cache[:, :, row] = _rotated(x[:, heads:heads + kv_heads], cos, sin).to(k_cache.dtype)
        v_cache[:, :, row] = x[:, heads + kv_heads:].to(v_cache.dtype)
        q = _rotated(x[:, :heads], cos, sin).to(qkv.dtype)
        return _reference(q, k_cache, v_cache, mask, scale)
    from lowvm.kernels.library import overlap_enabled

    floats = (torch.float16, torch.bfloat16)
    _check("k_cache", k_cache, (-1, -1, -1, -1), floats, qkv.device)
    _check("qkv", qkv, (batch, (heads + 2 * kv_heads) * dim), (k_cache.dtype,), qkv.device)
    for name, t in (("cos", cos), ("sin", sin)):
        _check(name, t, (batch, dim), (k_cache.dtype,), qkv.device)
    _check("v_cache", v_cache, tuple(k_cache.shape), (k_cache.dtype,), qkv.device)
    _check("position", position.reshape(-1), (1,), (torch.int32, torch.int64), qkv.device)
    _check("mask", mask, (batch, length), (torch.bool, torch.uint8), qkv.device)
    _check_heads(heads, kv_heads, dim, length)
    if mask.dtype == torch.bool:
        mask = mask.view(torch.uint8)
    if position.dtype == torch.int64:  # little-endian: the low word comes first
        position = position.reshape(1).view(torch.int32)
    out = qkv.new_empty(batch, heads, dim)
    program = _compiled(qkv.dtype, kv_heads, heads // kv_heads, dim, rope=True)
    program(batch, length, qkv, cos, sin, k_cache, v_cache, position, mask, out, float(scale),
            overlap=overlap_enabled())
    return out


@decode_attention_rope.register_fake
def _decode_attention_rope_fake(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                                k_cache: torch.Tensor, v_cache: torch.Tensor,
                                position: torch.Tensor, mask: torch.Tensor, scale: float,
                                heads: int) -> torch.Tensor:
    return qkv.new_empty(qkv.shape[0], heads, k_cache.shape[3])


@decode_attention.register_fake
def _decode_attention_fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           mask: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(q)


def _keep_mask(attention_mask: torch.Tensor | None, batch: int, length: int,
               device: torch.device) -> torch.Tensor:
    """transformers' SDPA mask (bool, True = attend, or additive float) of one query
    position as a contiguous ``[batch, length]`` bool tensor; None attends everywhere."""
    if attention_mask is None:
        return torch.ones(batch, length, dtype=torch.bool, device=device)
    mask = attention_mask.expand(batch, 1, 1, length).reshape(batch, length)
    if mask.dtype != torch.bool:
        mask = mask == 0  # additive masks: 0 attends, -inf (or min) does not
    return mask.contiguous()  # bool: the op views it as uint8 (inductor cannot lower that)


def lowvm_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, attention_mask: torch.Tensor | None,
                            dropout: float = 0.0, scaling: float | None = None,
                            **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function: the kernel for decode steps it serves, SDPA for
    the rest (same signature and result layout, ``[batch, q_len, heads, head_dim]``)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    unsupported = any(kwargs.get(name) is not None for name in
                      ("softcap", "s_aux", "sinks", "position_bias", "sliding_window"))
    training = dropout != 0.0 and module.training
    if (unsupported or training or kwargs.get("output_attentions", False)
            or decode_attention_problem(query, key, value) is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    batch, heads, _, dim = query.shape
    length = key.shape[2]
    scale = scaling if scaling is not None else 1.0 / math.sqrt(dim)
    mask = _keep_mask(attention_mask, batch, length, query.device)
    out = torch.ops.lowvm.decode_attention(query.reshape(batch, heads, dim).contiguous(),
                                           key.contiguous(), value.contiguous(), mask, scale)
    return out.reshape(batch, 1, heads, dim), None


def _static_layer(cache: Any, index: int) -> Any:
    """The cache's layer ``index`` if it is a transformers ``StaticLayer`` (its own
    ``update``: writes at ``cumulative_length``, then adds to it), initialised; else None."""
    from transformers.cache_utils import StaticLayer

    if getattr(cache, "offloading", False):  # update() prefetches and offloads layers
        return None
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, (list, tuple)) or not 0 <= index < len(layers):
        return None
    layer = layers[index]
    if (not isinstance(layer, StaticLayer) or type(layer).update is not StaticLayer.update
            or not getattr(layer, "is_initialized", False)
            or not isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)):
        return None
    return layer


def fused_decode_step(attn: torch.nn.Module, hidden_states: torch.Tensor,
                      position_embeddings: Any, attention_mask: torch.Tensor | None,
                      cache: Any, kwargs: dict[str, Any]) -> tuple[torch.Tensor, None] | None:
    """The attention block of a decode step as one kernel after the q/k/v GEMM, for a
    fused Llama-style attention (:func:`lowvm.fuse_projections`) set to ``"lowvm"``:
    rotary embedding, the static cache's update and attention in
    ``torch.ops.lowvm.decode_attention_rope``, then ``o_proj``. None where that does not
    apply (the caller then runs the Hugging Face steps): not a one-token step, not a
    ``StaticLayer`` cache, what :func:`decode_attention_problem` refuses, attention
    weights asked for, dropout in training. Results equal the step-by-step path up to
    rounding (the rotary embedding is computed in float32, rounded once)."""
    if (cache is None or position_embeddings is None or hidden_states.dim() != 3
            or hidden_states.shape[1] != 1 or kwargs.get("output_attentions", False)
            or (attn.training and attn.attention_dropout)):
        return None
    layer = _static_layer(cache, attn.layer_idx)
    if layer is None:
        return None
    batch, dim = hidden_states.shape[0], attn.head_dim
    q_size, k_size, _ = attn._lowvm_qkv
    heads = q_size // dim
    if shape_problem((batch, heads, 1, dim), hidden_states.dtype, hidden_states.device,
                     layer.keys, layer.values) is not None:
        return None
    qkv = attn.qkv_proj(hidden_states).reshape(batch, -1)
    # [1, 1, dim] when the caller gave no position_ids: transformers broadcasts it
    cos, sin = (t.expand(batch, -1, -1) for t in position_embeddings)
    mask = _keep_mask(attention_mask, batch, layer.keys.shape[2], hidden_states.device)
    out = torch.ops.lowvm.decode_attention_rope(
        qkv, cos.reshape(batch, dim), sin.reshape(batch, dim), layer.keys, layer.values,
        layer.cumulative_length, mask, attn.scaling, heads)
    layer.cumulative_length.add_(1)  # what StaticLayer.update does after its write
    return attn.o_proj(out.reshape(batch, 1, heads * dim)), None


_REGISTERED = False


def _register() -> None:
    """Register ``"lowvm"`` with transformers' attention and mask interfaces (once)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION_NAME, lowvm_attention_forward)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    _REGISTERED = True


def use_decode_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Switch a transformers model (in place) to lowvm's decode attention; returns it.

    Decode steps the kernel serves run it; every other call runs transformers' SDPA path
    (see the module doc). Undo with ``model.set_attn_implementation("sdpa")``.
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "set_attn_implementation"):
        raise AttentionError(f"use_decode_attention: model must be a transformers "
                             f"PreTrainedModel, got {type(model).__name__}")
    _register()
    model.set_attn_implementation(ATTENTION_NAME)
    return model
