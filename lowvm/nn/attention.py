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

__all__ = ["use_decode_attention", "decode_attention", "decode_attention_problem",
           "ATTENTION_NAME", "MAX_LENGTH", "AttentionError"]

#: the name the implementation is registered under (``config._attn_implementation``)
ATTENTION_NAME = "lowvm"
#: longest cache the kernel serves: the longest measured (benchmarks/NOTES.md, tenth
#: session: faster than transformers' compiled SDPA path at every length up to it, batch 1
#: and 16). One block per (sequence, KV head) walks the whole cache, so long caches at
#: batch 1 use few SMs; splitting the cache over blocks is not done yet.
MAX_LENGTH = 8192


class AttentionError(LowvmError, ValueError):
    """Tensors the decode-attention op cannot take (named with the value and the rule)."""


def decode_attention_problem(query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor) -> str | None:
    """Why the kernel cannot serve this call (a sentence), or None when it can.

    ``query [batch, heads, q_len, head_dim]``, ``key``/``value`` ``[batch, kv_heads,
    length, head_dim]`` as transformers passes them."""
    if query.dim() != 4 or key.dim() != 4 or value.shape != key.shape:
        return (f"query must be 4-d and key/value 4-d of one shape; got query "
                f"{list(query.shape)}, key {list(key.shape)}, value {list(value.shape)}")
    batch, heads, q_len, head_dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    if q_len != 1:
        return f"query length {q_len}: the kernel serves decode steps (1 position)"
    if not query.is_cuda:
        return f"query on {query.device}: the kernel runs on CUDA devices"
    if query.dtype not in (torch.float16, torch.bfloat16):
        return f"query dtype {query.dtype}: the kernel takes float16 or bfloat16"
    if key.dtype != query.dtype or value.dtype != query.dtype:
        return f"key/value dtype {key.dtype}/{value.dtype} differs from query's {query.dtype}"
    if key.device != query.device or value.device != query.device:
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


_PROGRAMS: dict[tuple, Any] = {}


def _compiled(dtype: torch.dtype, kv_heads: int, group: int, head_dim: int) -> Any:
    key = (dtype, kv_heads, group, head_dim)
    if key not in _PROGRAMS:
        import lowvm
        from lowvm.kernels.decode_attention import decode_attention as f16
        from lowvm.kernels.decode_attention import decode_attention_bf16 as bf16

        program = f16 if dtype == torch.float16 else bf16
        # 3 K/V tiles in flight measured 2-7 % faster than 2 (head_dim 128); 256-wide
        # heads keep 2 (3 would need 197 KB of shared memory, more than an A100 has)
        _PROGRAMS[key] = lowvm.compile(program, kv_heads=kv_heads, group=group,
                                       head_dim=head_dim, stages=3 if head_dim <= 128 else 2)
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

    if mask.dtype == torch.bool:  # same bytes, read as the kernel's uint8: no conversion
        mask = mask.view(torch.uint8)
    out = torch.empty_like(q)
    program = _compiled(q.dtype, kv_heads, heads // kv_heads, dim)
    program(batch, length, q, k, v, mask, out, float(scale), overlap=overlap_enabled())
    return out


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
