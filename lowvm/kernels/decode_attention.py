"""One decode step of grouped-query attention: ``out = softmax(q k^T * scale + mask) v``.

Why a kernel of its own: at batch 1 a Llama layer's attention over a static KV cache is
five small launches in PyTorch (the GQA ``repeat_kv`` copies of K and V, the mask, the
layout copies and cuDNN's prefill-shaped kernel), ~10 us per layer of which the bytes
read need well under one. Here one block per (sequence, KV head) reads its K and V once
and serves the whole query group, so ``repeat_kv`` never materialises.

* **Orientation.** Scores are computed transposed, ``s^T[t, g] = K[t, :] . q[g, :]``, so
  the K tile (positions x head_dim, as the cache stores it) is the MMA's A operand as it
  lies in shared memory and the query group (``group <= 8`` heads) fills the MMA's
  8-wide N. The output is transposed too, ``o^T[d, g] = V^T[d, :] . p^T[:, g]``: the
  per-head softmax statistics then index the same (column) dim of the scores and of the
  accumulator, so rescaling needs no data movement.
* **Online softmax** over ``tile``-position steps (running max ``m``, sum ``l``),
  float32 throughout; masked positions score ``-inf`` and the running max starts at a
  finite ``-1e30``, so a fully masked step leaves ``acc`` and ``l`` unchanged.
* **The mask** is the ``[batch, length]`` keep-mask (uint8, nonzero = attend) that
  Hugging Face builds for SDPA; positions past ``length`` read as 0 (masked).
* Blocks see their own rows through views whose row count ends at the block's last
  row (``(block + 1) * rows``): loads past it zero-fill and stores past it are dropped,
  so the neighbouring head's rows are never read into the padding or overwritten.
* **K and V tiles** go through shared memory with the 128-byte swizzle: their rows are
  ``head_dim`` halves (>= 128 bytes) apart, so unswizzled every ``ldmatrix`` row hit the
  same banks (measured 2x slower per tile).
* ``decode_attention_rope`` starts from the fused q/k/v projection instead: it applies
  the rotary embedding to q and k, writes k and v into the caches at the step's position
  (read on the device, :func:`vm.load_uniform`) and then attends; the rest of a Llama
  attention's decode step in one kernel.
"""

from __future__ import annotations

import lowvm.lang as vm
from lowvm.expr import minimum
from lowvm.layouts import permute as permute_layout
from lowvm.layouts import reduce as reduce_layout
from lowvm.layouts.mma_tiling import block_mma_layouts

#: the MMA's N: query heads per KV head a block serves (padded up to it)
GROUP_MAX = 8
#: positions per step (4 warps x one 16-row MMA tile)
TILE = 64
#: head dims the orientation fits (4 warps x 16 rows of the output MMA)
HEAD_DIMS = (64, 128, 192, 256)


@vm.program(warps=4)
def decode_attention(batch: vm.int32, length: vm.int32, q: vm.ptr[vm.dtype_of("adtype")],
                     k: vm.ptr[vm.dtype_of("adtype")], v: vm.ptr[vm.dtype_of("adtype")],
                     mask: vm.ptr[vm.uint8], out: vm.ptr[vm.dtype_of("adtype")],
                     scale: vm.float32, kv_heads: int = 8, group: int = 4, head_dim: int = 128,
                     stages: int = 2, adtype: vm.constexpr = vm.float16):
    """``q [batch*kv_heads*group, head_dim]`` (heads of a group adjacent, as Hugging Face
    orders them), ``k``/``v`` ``[batch*kv_heads, length, head_dim]``, ``mask
    [batch, length]``, ``out`` like ``q``, all but ``mask`` of ``adtype`` (float16 or
    bfloat16); ``scale`` multiplies the scores."""
    _body(batch, length, q, k, v, mask, out, scale, adtype, kv_heads, group, head_dim, stages)


@vm.program(warps=4)
def decode_attention_rope(batch: vm.int32, length: vm.int32,
                          qkv: vm.ptr[vm.dtype_of("adtype")],
                          cos: vm.ptr[vm.dtype_of("adtype")], sin: vm.ptr[vm.dtype_of("adtype")],
                          k: vm.ptr[vm.dtype_of("adtype")], v: vm.ptr[vm.dtype_of("adtype")],
                          position: vm.ptr[vm.int32], mask: vm.ptr[vm.uint8],
                          out: vm.ptr[vm.dtype_of("adtype")], scale: vm.float32,
                          kv_heads: int = 8, group: int = 4, head_dim: int = 128,
                          stages: int = 2, adtype: vm.constexpr = vm.float16):
    """A whole decode step of a Llama attention after its q/k/v GEMM: the rotary embedding
    of the step's q and k (``x cos + rotate_half(x) sin``, in float32), k and v written
    into the caches at ``position[0]``, then :func:`decode_attention` over the caches.

    ``qkv [batch, (kv_heads*group + 2*kv_heads) * head_dim]`` (q heads, then k, then v, as
    a fused projection emits them), ``cos``/``sin [batch, head_dim]``, ``k``/``v``
    ``[batch*kv_heads, length, head_dim]`` caches (updated in place), ``out
    [batch*kv_heads*group, head_dim]``, all of ``adtype`` (float16 or bfloat16)."""
    _body(batch, length, None, k, v, mask, out, scale, adtype, kv_heads, group, head_dim,
          stages, rope=(qkv, cos, sin, position))


def _rope_step(rope, seq, head, length, k, v, dt, kv_heads: int, group: int, head_dim: int,
               ls):
    """The rotary embedding of this block's q rows and its KV head's k, k and v written to
    the caches at the step's position; returns q^T as the scores' MMA operand.

    Every tile is ``[head_dim / 2, 8]`` seen through transposed views (8 rows of qkv from
    the block's first one: rows past the group are computed and never stored)."""
    qkv, cos, sin, position = rope
    half = head_dim // 2
    heads = kv_heads * group
    rows = heads + 2 * kv_heads  # rows of head_dim values per sequence in qkv
    lay = vm.spatial(16, GROUP_MAX).local(half // 16, 1)
    pos = vm.load_uniform(vm.global_view(position, [1]), [0])
    g_qkv = vm.global_view(qkv, [head_dim, (seq + 1) * rows], strides=[1, head_dim])
    g_cos = vm.global_view(cos, [head_dim, seq + 1], strides=[1, head_dim])
    g_sin = vm.global_view(sin, [head_dim, seq + 1], strides=[1, head_dim])
    c_lo, c_hi, s_lo, s_hi = (vm.cast(vm.load_global(g, [d0, seq], [half, 1]), vm.float32)
                              for g in (g_cos, g_sin) for d0 in (0, half))

    def rotated(row):
        lo = vm.cast(vm.load_global(g_qkv, [0, row], [half, GROUP_MAX], lay), vm.float32)
        hi = vm.cast(vm.load_global(g_qkv, [half, row], [half, GROUP_MAX], lay), vm.float32)
        return (vm.cast(lo * c_lo - hi * s_lo, dt), vm.cast(hi * c_hi + lo * s_hi, dt))

    sq = vm.shared_tensor(dt, [head_dim, GROUP_MAX])
    q_lo, q_hi = rotated(seq * rows + vm.block_index(0) * group)
    vm.store_shared(sq, q_lo, [0, 0])
    vm.store_shared(sq, q_hi, [half, 0])
    # the caches seen transposed and ending at this step's row: columns past it (the
    # tiles' other 7) are dropped; so is the row itself when the position is past the
    # cache (a full cache: nothing is written outside this head's rows)
    row = head * length + pos
    end = minimum(row + 1, (head + 1) * length)
    k_lo, k_hi = rotated(seq * rows + heads + vm.block_index(0))
    g_kc = vm.global_view(k, [head_dim, end], strides=[1, head_dim])
    vm.store_global(g_kc, k_lo, [0, row])
    vm.store_global(g_kc, k_hi, [half, row])
    v_at = seq * rows + heads + kv_heads + vm.block_index(0)
    g_vc = vm.global_view(v, [head_dim, end], strides=[1, head_dim])
    for d0 in (0, half):
        vm.store_global(g_vc, vm.load_global(g_qkv, [d0, v_at], [half, GROUP_MAX], lay),
                        [d0, row])
    vm.sync()  # q^T in shared; the cache rows written before the K/V copies read them
    q_t = vm.load_shared(sq, ls.b)
    vm.free_shared(sq)
    return q_t


def _body(batch, length, q, k, v, mask, out, scale, dt, kv_heads: int, group: int,
          head_dim: int, stages: int, rope=None) -> None:
    vm.static_assert(1 <= group <= GROUP_MAX, f"group must be 1..{GROUP_MAX}")
    vm.static_assert(head_dim in HEAD_DIMS, f"head_dim must be one of {HEAD_DIMS}")
    vm.set_grid(kv_heads, batch)
    vm.set_min_blocks(1)  # no register cap: unhinted, ptxas holds it to 72 and spills
    vm.wait_prior_grid()  # everything read below is written by the kernels before
    seq = vm.block_index(1)
    head = vm.let(seq * kv_heads + vm.block_index(0), "head")
    # scores s^T [tile, 8] = K [tile, d] @ q^T [d, 8]; output o^T [d, 8] = V^T [d, tile] @ p^T
    ls = block_mma_layouts(TILE, GROUP_MAX, head_dim, 4, 1, dt)
    lo = block_mma_layouts(head_dim, GROUP_MAX, TILE, 4, 1, dt)

    q_rows = (head + 1) * group  # this block's last query row + 1
    go = vm.global_view(out, [head_dim, q_rows], strides=[1, head_dim])  # out^T
    kv_rows = (head + 1) * length
    gk = vm.global_view(k, [kv_rows, head_dim])
    gv = vm.global_view(v, [kv_rows, head_dim])
    gm = vm.global_view(mask, [(seq + 1) * length, 1], strides=[1, 1])
    row0 = head * length

    if rope is None:
        gq = vm.global_view(q, [head_dim, q_rows], strides=[1, head_dim])  # q^T
        q_t = vm.load_global(gq, [0, head * group], [head_dim, GROUP_MAX], ls.b)
    else:
        q_t = _rope_step(rope, seq, head, length, k, v, dt, kv_heads, group, head_dim, ls)
    # swizzled: rows of head_dim halves are >= 128 bytes apart, so ldmatrix's 8 rows would
    # otherwise all hit the same banks (8-way conflicts on every K and V read)
    sk = vm.shared_tensor(dt, [TILE, head_dim], vm.swizzle_128b(TILE, head_dim, dt))
    sv = vm.shared_tensor(dt, [TILE, head_dim], vm.swizzle_128b(TILE, head_dim, dt))
    sp = vm.shared_tensor(dt, [TILE, GROUP_MAX])
    acc = vm.register_tensor(vm.float32, [head_dim, GROUP_MAX], lo.c, init=0.0)
    stat = reduce_layout(ls.c, [0], keepdims=True)
    m = vm.register_tensor(vm.float32, [1, GROUP_MAX], stat, init=-1e30)
    l_sum = vm.register_tensor(vm.float32, [1, GROUP_MAX], stat, init=0.0)
    for step in vm.range(vm.cdiv(length, TILE), stages=stages):
        t0 = step * TILE
        vm.copy_async(sk, gk, [row0 + t0, 0])
        vm.copy_async(sv, gv, [row0 + t0, 0])
        vm.commit_group()
        # issued before the wait below, so its latency hides behind the K/V copies
        keep = vm.load_global(gm, [seq * length + t0, 0], [TILE, 1])
        vm.wait_group(0)
        vm.sync()
        s = vm.register_tensor(vm.float32, [TILE, GROUP_MAX], ls.c, init=0.0)
        s = vm.dot(vm.load_shared(sk, ls.a), q_t, s) * scale
        s = vm.where(vm.ne(keep, 0), s, float("-inf"))
        m_new = vm.maximum(m, vm.max(s, 0, keepdims=True))
        alpha = vm.exp(m - m_new)
        p = vm.exp(s - m_new)
        vm.assign(l_sum, l_sum * alpha + vm.sum(p, 0, keepdims=True))
        vm.assign(m, m_new)
        vm.store_shared(sp, vm.cast(p, dt))
        vm.sync()
        v_t = vm.permute(vm.load_shared(sv, permute_layout(lo.a, [1, 0])), [1, 0])
        vm.assign(acc, vm.dot(v_t, vm.load_shared(sp, lo.b), acc * alpha))
        vm.sync()
    vm.store_global(go, vm.cast(acc / l_sum, dt), [0, head * group])
    vm.free_shared(sp)
    vm.free_shared(sv)
    vm.free_shared(sk)
