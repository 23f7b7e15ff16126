"""Decode attention: the VM program in the interpreter against float64 numpy, its CUDA code
compiled for sm_80/sm_90 without spills, the transformers integration (what it routes to
the kernel and what to SDPA), and on the GPU the kernel against float64 and a model's
greedy tokens against SDPA."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import lowvm
from lowvm.kernels.decode_attention import decode_attention, decode_attention_rope
from lowvm.nn.serve import attention as attn
from tests.helpers.greedy import assert_same_greedy_up_to_ties


def _inputs(rng, batch, kv_heads, group, dim, length, keep):
    q = rng.standard_normal((batch * kv_heads * group, dim))
    k = rng.standard_normal((batch * kv_heads, length, dim))
    v = rng.standard_normal((batch * kv_heads, length, dim))
    mask = np.zeros((batch, length), np.uint8)
    for b, (lo, hi) in enumerate(keep):
        mask[b, lo:hi] = 1
    return q, k, v, mask


def _float64_reference(q, k, v, mask, batch, kv_heads, group, dim, length, scale):
    qq = q.reshape(batch, kv_heads, group, dim)
    kk, vv = k.reshape(batch, kv_heads, length, dim), v.reshape(batch, kv_heads, length, dim)
    s = np.einsum("bhgd,bhtd->bhgt", qq, kk) * scale
    s = np.where(mask[:, None, None, :] != 0, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhgt,bhtd->bhgd", p, vv).reshape(batch * kv_heads * group, dim)


# (batch, kv_heads, group, head_dim, length, kept [lo, hi) per sequence)
CASES = [
    (1, 2, 4, 128, 144, [(0, 131)]),           # Llama-3 shape, a static cache part filled
    (2, 2, 4, 64, 100, [(0, 70), (5, 100)]),   # left padding, a partial last tile
    (1, 3, 8, 64, 64, [(0, 64)]),              # a full group of 8, one tile exactly
    (2, 1, 1, 128, 200, [(0, 1), (0, 200)]),   # multi-head (group 1), one kept position
    (1, 2, 3, 256, 70, [(10, 70)]),            # an odd group, the widest head
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}h{}g{}d{}l{}".format(*c[:5]))
@pytest.mark.parametrize("bf16", [False, True], ids=["f16", "bf16"])
def test_interpreter_matches_float64(case, bf16):
    batch, kv_heads, group, dim, length, keep = case
    rng = np.random.default_rng(length)
    q, k, v, mask = _inputs(rng, batch, kv_heads, group, dim, length, keep)
    scale = 1 / np.sqrt(dim)
    if bf16:
        t = [torch.tensor(a, dtype=torch.bfloat16) for a in (q, k, v)]
        ref = _float64_reference(*(a.double().numpy() for a in t), mask, batch, kv_heads,
                                 group, dim, length, scale)
        out = torch.zeros_like(t[0])
        lowvm.interpret(decode_attention, batch, length, *t, torch.from_numpy(mask),
                        out, scale, kv_heads=kv_heads, group=group, head_dim=dim,
                        adtype=lowvm.bfloat16)
        got, tol = out.double().numpy(), 2e-2
    else:
        q, k, v = (a.astype(np.float16) for a in (q, k, v))
        ref = _float64_reference(q.astype(np.float64), k.astype(np.float64),
                                 v.astype(np.float64), mask, batch, kv_heads, group, dim,
                                 length, scale)
        out = np.zeros_like(q)
        lowvm.interpret(decode_attention, batch, length, q, k, v, mask, out, scale,
                        kv_heads=kv_heads, group=group, head_dim=dim)
        got, tol = out.astype(np.float64), 2e-3
    # p is rounded to the value type before the second product: error ~ its epsilon
    assert np.isfinite(got).all()
    assert np.abs(got - ref).max() <= tol * max(1.0, np.abs(ref).max())


def test_the_rows_of_other_heads_are_neither_read_nor_written():
    """Each block sees views that end at its own last row: a NaN in the next head's
    query rows or cache does not reach this head, and the padding rows of the MMA
    (group < 8) never overwrite the next head's output."""
    batch, kv_heads, group, dim, length = 1, 2, 3, 64, 64
    rng = np.random.default_rng(0)
    q, k, v, mask = _inputs(rng, batch, kv_heads, group, dim, length, [(0, 64)])
    q, k, v = (a.astype(np.float16) for a in (q, k, v))
    q[group:] = np.nan
    k[1:] = np.nan
    v[1:] = np.nan
    out = np.full_like(q, 7.0)
    lowvm.interpret(decode_attention, batch, length, q, k, v, mask, out, 0.125,
                    kv_heads=kv_heads, group=group, head_dim=dim)
    assert np.isfinite(out[:group]).all()
    ref = _float64_reference(q.astype(np.float64)[:group], k[:1].astype(np.float64),
                             v[:1].astype(np.float64), mask, 1, 1, group, dim, length, 0.125)
    assert np.abs(out[:group] - ref).max() < 2e-3


@pytest.mark.parametrize("bad,match", [({"group": 9}, "group must be 1..8"),
                                       ({"head_dim": 96}, "head_dim must be one of")])
def test_unsupported_constants_are_program_errors(bad, match):
    with pytest.raises(lowvm.LowvmError, match=match):
        decode_attention.build(**bad)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("program,group,dim,adtype", [
    (decode_attention, 4, 128, lowvm.float16), (decode_attention, 8, 64, lowvm.float16),
    (decode_attention, 4, 128, lowvm.bfloat16), (decode_attention_rope, 4, 128, lowvm.float16),
    (decode_attention_rope, 2, 256, lowvm.bfloat16)])
def test_compiles_without_spills(arch, program, group, dim, adtype):
    from lowvm.driver import generate_cuda
    from lowvm.runtime import resource_usage

    stages = 3 if dim <= 128 else 2  # as the op compiles them
    cuda = generate_cuda(program.build(kv_heads=8, group=group, head_dim=dim, stages=stages,
                                       adtype=adtype))
    for inst in ("cp.async.cg.shared.global", "ldmatrix.sync.aligned.m8n8.x4.trans",
                 "mma.sync.aligned.m16n8k16", "griddepcontrol.wait"):
        assert inst in cuda.source, inst
    usage = resource_usage(cuda.source, arch)[cuda.kernel_name]
    assert usage["spill_store_bytes"] == 0 and usage["spill_load_bytes"] == 0, usage


def _rope_inputs(rng, batch, kv_heads, group, dim, length, position):
    heads = kv_heads * group
    qkv = rng.standard_normal((batch, (heads + 2 * kv_heads) * dim)).astype(np.float16)
    angle = rng.standard_normal((batch, dim // 2))
    cos = np.cos(np.concatenate([angle, angle], 1)).astype(np.float16)
    sin = np.sin(np.concatenate([angle, angle], 1)).astype(np.float16)
    k = rng.standard_normal((batch * kv_heads, length, dim)).astype(np.float16)
    v = rng.standard_normal((batch * kv_heads, length, dim)).astype(np.float16)
    mask = np.zeros((batch, length), np.uint8)
    mask[:, :position + 1] = 1
    mask[-1, :min(2, position)] = 0  # left padding in the last sequence (one kept row)
    return qkv, cos, sin, k, v, mask


def _rope_reference(qkv, cos, sin, k, v, mask, kv_heads, group, dim, position, scale):
    """float64: rotated q and k, the caches with row ``position`` written, the output."""
    batch, length = mask.shape
    heads = kv_heads * group
    x = qkv.astype(np.float64).reshape(batch, heads + 2 * kv_heads, dim)
    c, s = cos.astype(np.float64)[:, None], sin.astype(np.float64)[:, None]

    def rot(t):
        return t * c + np.concatenate([-t[..., dim // 2:], t[..., :dim // 2]], -1) * s

    kk = k.astype(np.float64).reshape(batch, kv_heads, length, dim).copy()
    vv = v.astype(np.float64).reshape(batch, kv_heads, length, dim).copy()
    kk[:, :, position] = rot(x[:, heads:heads + kv_heads])
    vv[:, :, position] = x[:, heads + kv_heads:]
    q = rot(x[:, :heads]).astype(np.float16).astype(np.float64)  # rounded, as the kernel
    out = _float64_reference(q.reshape(-1, dim), kk.astype(np.float16).astype(np.float64),
                             vv, mask, batch, kv_heads, group, dim, length, scale)
    return kk, vv, out


@pytest.mark.parametrize("case", [(1, 2, 4, 128, 144, 131), (2, 2, 3, 64, 100, 37),
                                  (1, 1, 8, 64, 64, 63)],
                         ids=lambda c: "b{}h{}g{}d{}l{}p{}".format(*c))
def test_rope_program_in_the_interpreter(case):
    """Rotary embedding of q and k, k and v written into the caches at the position (and
    nowhere else), attention over the updated caches."""
    from lowvm.kernels.decode_attention import decode_attention_rope

    batch, kv_heads, group, dim, length, position = case
    qkv, cos, sin, k, v, mask = _rope_inputs(np.random.default_rng(position), *case)
    k_before, v_before = k.copy(), v.copy()
    out = np.zeros((batch * kv_heads * group, dim), np.float16)
    scale = 1 / np.sqrt(dim)
    lowvm.interpret(decode_attention_rope, batch, length, qkv, cos, sin, k, v,
                    np.array([position], np.int32), mask, out, scale, kv_heads=kv_heads,
                    group=group, head_dim=dim)
    kk, vv, ref = _rope_reference(qkv, cos, sin, k_before, v_before, mask, kv_heads, group,
                                  dim, position, scale)
    changed = np.argwhere((k != k_before).any(-1) | (v != v_before).any(-1))
    assert set(changed[:, 1].tolist()) == {position}
    assert np.abs(k.astype(np.float64).reshape(kk.shape) - kk).max() < 4e-3  # fp16 rounding
    assert np.array_equal(v.astype(np.float64).reshape(vv.shape), vv)
    assert np.abs(out.astype(np.float64) - ref).max() < 2e-3


def test_rope_op_reference_matches_the_program():
    """The op's CPU path (what tests without a GPU run) computes what the program does."""
    case = (2, 2, 4, 64, 80, 50)
    batch, kv_heads, group, dim, length, position = case
    qkv, cos, sin, k, v, mask = _rope_inputs(np.random.default_rng(5), *case)
    out = np.zeros((batch * kv_heads * group, dim), np.float16)
    kp, vp = k.copy(), v.copy()
    lowvm.interpret(attn_programs().decode_attention_rope, batch, length, qkv, cos, sin, kp,
                    vp, np.array([position], np.int32), mask, out, 0.125, kv_heads=kv_heads,
                    group=group, head_dim=dim)
    kt = torch.tensor(k).view(batch, kv_heads, length, dim)
    vt = torch.tensor(v).view(batch, kv_heads, length, dim)
    got = torch.ops.lowvm.decode_attention_rope(
        torch.tensor(qkv), torch.tensor(cos), torch.tensor(sin), kt, vt,
        torch.tensor(position), torch.tensor(mask).bool(), 0.125, kv_heads * group)
    assert (got.reshape(-1, dim).float() - torch.tensor(out).float()).abs().max() < 2e-3
    assert (kt.reshape(kp.shape).float() - torch.tensor(kp).float()).abs().max() < 4e-3
    assert torch.equal(vt.reshape(vp.shape), torch.tensor(vp))


def attn_programs():
    from lowvm.kernels import decode_attention as programs

    return programs


# ---- transformers integration (CPU: the op's reference math stands in for the kernel)

def _tiny(attn_impl="sdpa"):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=256, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
                         head_dim=64)
    config._attn_implementation = attn_impl
    return LlamaForCausalLM(config).eval()


def test_problem_names_what_the_kernel_does_not_take():
    q, kv = torch.zeros(1, 8, 1, 128), torch.zeros(1, 2, 16, 128)
    assert "CUDA" in attn.decode_attention_problem(q, kv, kv)
    assert "query length 4" in attn.decode_attention_problem(torch.zeros(1, 8, 4, 128), kv, kv)
    # the remaining rules, with the device rule out of the way
    meta = {"device": "meta"}
    q, kv = torch.zeros(1, 8, 1, 128, **meta), torch.zeros(1, 2, 16, 128, **meta)
    problem = attn.decode_attention_problem
    assert "CUDA" in problem(q, kv, kv)  # meta is not CUDA either
    assert "dims" not in (problem(q, kv, kv) or "")


def _lift_device_rule(monkeypatch):
    """Let the kernel paths run on the CPU: shape_problem ignores its CUDA rule only (the
    ops then compute their float32 reference)."""
    real = attn.shape_problem

    def cpu_ok(shape, dtype, device, key, value):
        problem = real(shape, dtype, device, key, value)
        return None if problem and "CUDA" in problem else problem

    monkeypatch.setattr(attn, "shape_problem", cpu_ok)


def test_use_decode_attention_registers_and_switches(monkeypatch):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    model = _tiny()
    assert lowvm.use_decode_attention(model) is model
    assert model.config._attn_implementation == "lowvm"
    assert "lowvm" in AttentionInterface._global_mapping
    assert "lowvm" in AttentionMaskInterface._global_mapping
    with pytest.raises(attn.AttentionError, match="PreTrainedModel, got Linear"):
        lowvm.use_decode_attention(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_decode_steps_reach_the_op_and_give_sdpa_tokens(monkeypatch, cache):
    """With the device rule lifted, decode steps run the op (its float32 reference on the
    CPU) and prefill runs SDPA; greedy tokens equal the SDPA model's."""
    calls = []

    def spy(q, k, v, mask, scale):
        calls.append((tuple(q.shape), tuple(k.shape), tuple(mask.shape), mask.dtype))
        return attn._reference(q, k, v, mask, scale)

    _lift_device_rule(monkeypatch)
    monkeypatch.setattr(torch.ops.lowvm, "decode_attention", spy, raising=False)
    ids = torch.randint(0, 128, (2, 7))
    kwargs = {"max_new_tokens": 6, "do_sample": False,
              "attention_mask": torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])}
    if cache == "static":
        kwargs["cache_implementation"] = "static"
    with torch.no_grad():
        want = _tiny().generate(ids, **kwargs)
        model = lowvm.use_decode_attention(_tiny())
        got = model.generate(ids, **kwargs)
    assert torch.equal(got, want)
    assert len(calls) == 2 * 5  # 2 layers x 5 decode steps (the first token is prefill's)
    assert all(c[0] == (2, 8, 64) and c[3] == torch.bool for c in calls)
    assert all(c[1][:2] == (2, 2) and c[2] == (2, c[1][2]) for c in calls)


def _tiny_fused(attn_impl="sdpa"):
    """A tiny Llama (head_dim 64) quantized to int4 and fused, as lowvm.serving runs it."""
    model = _tiny(attn_impl).half()
    lowvm.quantize_model(model, dtype="int4", group_size=64, progress=False)
    lowvm.fuse_projections(model)
    return model


@pytest.mark.slow
def test_fused_static_decode_steps_run_the_rope_op(monkeypatch):
    """A fused model on lowvm attention: with a static cache, each decode step of each
    layer is one decode_attention_rope call (rotary + cache write + attention); greedy
    tokens equal the same model on SDPA's step-by-step path."""
    calls = []
    real_op = torch.ops.lowvm.decode_attention_rope

    def spy(*args):
        calls.append(int(args[5]))  # the cache row written
        return real_op(*args)

    ids = torch.randint(0, 128, (2, 7))
    kwargs = {"max_new_tokens": 6, "do_sample": False, "cache_implementation": "static",
              "attention_mask": torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])}
    import warnings

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", lowvm.nn.LowvmFallbackWarning)
        want = _tiny_fused().generate(ids, **kwargs)
        _lift_device_rule(monkeypatch)
        monkeypatch.setattr(torch.ops.lowvm, "decode_attention_rope", spy, raising=False)
        got = lowvm.use_decode_attention(_tiny_fused()).generate(ids, **kwargs)
    assert torch.equal(got, want)
    assert calls == [7, 7, 8, 8, 9, 9, 10, 10, 11, 11]  # 5 steps x 2 layers, rows 7..11


def test_keep_mask_accepts_bool_additive_and_none():
    keep = torch.tensor([[True, False, True]])[:, None, None, :]
    assert attn._keep_mask(keep, 1, 3, "cpu").tolist() == [[1, 0, 1]]
    additive = torch.tensor([[0.0, float("-inf"), 0.0]])[:, None, None, :]
    assert attn._keep_mask(additive, 1, 3, "cpu").tolist() == [[1, 0, 1]]
    assert attn._keep_mask(None, 2, 3, "cpu").tolist() == [[1, 1, 1]] * 2


def test_fake_op_traces_under_compile():
    q, kv = torch.randn(1, 4, 64), torch.randn(1, 2, 16, 64)
    mask = torch.ones(1, 16, dtype=torch.uint8)
    f = torch.compile(lambda *a: torch.ops.lowvm.decode_attention(*a, 0.125), fullgraph=True,
                      backend="eager")
    assert torch.allclose(f(q, kv, kv, mask), attn._reference(q, kv, kv, mask, 0.125))


# ---- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}h{}g{}d{}l{}".format(*c[:5]))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_gpu_matches_float64(case, dtype):
    batch, kv_heads, group, dim, length, keep = case
    rng = np.random.default_rng(length + 1)
    q, k, v, mask = _inputs(rng, batch, kv_heads, group, dim, length, keep)
    t = [torch.tensor(a, dtype=dtype, device="cuda") for a in (q, k, v)]
    ref = _float64_reference(*(a.double().cpu().numpy() for a in t), mask, batch, kv_heads,
                             group, dim, length, 1 / np.sqrt(dim))
    out = torch.ops.lowvm.decode_attention(
        t[0].reshape(batch, kv_heads * group, dim), t[1].reshape(batch, kv_heads, length, dim),
        t[2].reshape(batch, kv_heads, length, dim), torch.tensor(mask, device="cuda"),
        1 / np.sqrt(dim))
    got = out.reshape(-1, dim).double().cpu().numpy()
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    assert np.abs(got - ref).max() <= tol * max(1.0, np.abs(ref).max())


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True])
def test_gpu_greedy_tokens_equal_sdpa_and_graph_capture(compiled):
    """A float16 model with lowvm decode attention generates SDPA's greedy tokens, eager
    and with a static cache under torch.compile (CUDA graphs)."""
    ids = torch.randint(0, 128, (2, 9), device="cuda")
    kwargs = {"max_new_tokens": 8, "do_sample": False}
    if compiled:
        kwargs.update(cache_implementation="static",
                      compile_config=__import__("transformers").CompileConfig(fullgraph=True))
    with torch.no_grad():
        reference = _tiny().half().cuda()
        want = reference.generate(ids, **kwargs)
        model = lowvm.use_decode_attention(_tiny().half().cuda())
        got = model.generate(ids, **kwargs)
    assert_same_greedy_up_to_ties(reference, want, got, ids.shape[1])


@pytest.mark.gpu
@pytest.mark.parametrize("case", [(1, 8, 4, 128, 144, 131), (2, 2, 3, 64, 100, 37),
                                  (3, 2, 2, 256, 70, 5)],
                         ids=lambda c: "b{}h{}g{}d{}l{}p{}".format(*c))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_gpu_rope_op_matches_float64(case, dtype):
    batch, kv_heads, group, dim, length, position = case
    arrays = _rope_inputs(np.random.default_rng(position + 3), *case)
    qkv, cos, sin, k, v = (torch.tensor(a.astype(np.float32), dtype=dtype, device="cuda")
                           for a in arrays[:5])
    mask = torch.tensor(arrays[5], device="cuda").bool()
    host = [t.float().cpu().numpy() for t in (qkv, cos, sin, k, v)]
    kk, vv, ref = _rope_reference(*host, arrays[5], kv_heads, group, dim, position,
                                  1 / np.sqrt(dim))
    kc, vc = (t.view(batch, kv_heads, length, dim) for t in (k, v))
    out = torch.ops.lowvm.decode_attention_rope(
        qkv, cos, sin, kc, vc, torch.tensor(position, device="cuda"), mask, 1 / np.sqrt(dim),
        kv_heads * group)
    tol = 3e-2 if dtype == torch.bfloat16 else 4e-3
    assert np.abs(kc.double().cpu().numpy() - kk).max() <= tol * 4
    assert np.array_equal(vc.double().cpu().numpy(), vv)
    got = out.reshape(-1, dim).double().cpu().numpy()
    assert np.abs(got - ref).max() <= tol * max(1.0, np.abs(ref).max())


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 2])
def test_gpu_fused_int4_model_rope_steps_under_cuda_graphs(batch):
    """An int4 fused model on lowvm attention, static cache, generate's compiled steps
    (inductor CUDA graphs): the rotary + cache + attention kernel gives SDPA's tokens."""
    from transformers import CompileConfig

    ids = torch.randint(0, 128, (batch, 9), device="cuda")
    kwargs = {"max_new_tokens": 8, "do_sample": False, "cache_implementation": "static",
              "compile_config": CompileConfig(fullgraph=True)}
    with torch.no_grad():
        reference = _tiny_fused().cuda()
        want = reference.generate(ids, **kwargs)
        got = lowvm.use_decode_attention(_tiny_fused().cuda()).generate(ids, **kwargs)
    assert_same_greedy_up_to_ties(reference, want, got, ids.shape[1])


@pytest.mark.gpu
def test_gpu_serving_loop_rope_steps_give_sdpa_tokens():
    """lowvm.serving's DecodeLoop (one CUDA graph per step) on an int4 fused model: the
    rope kernel path gives the SDPA path's greedy tokens, batch 3 with a static cache."""
    from lowvm.serving.decode_loop import DecodeLoop

    ids = torch.randint(0, 128, (3, 7), device="cuda")
    tokens, models = [], []
    for lowvm_attention in (False, True):
        model = _tiny_fused().cuda()
        if lowvm_attention:
            lowvm.use_decode_attention(model)
        loop = DecodeLoop(model, ids, 10, compile_mode="default")
        try:
            loop.capture()
            tokens.append(loop(10))
        finally:
            loop.close()
            torch._dynamo.reset()
        models.append(model)
    whole = [torch.cat([ids, t], dim=1) for t in tokens]
    assert_same_greedy_up_to_ties(models[0], whole[0], whole[1], ids.shape[1])


def test_op_input_checks_name_the_argument_value_and_rule():
    """What the CUDA path checks before any launch (the kernel reads raw memory)."""
    cpu = torch.device("cpu")
    t = torch.zeros(2, 8, 64, dtype=torch.float16)
    attn._check("q", t, (-1, -1, -1), (torch.float16,), cpu)  # fine
    cases = [(("k", t, (3, -1, 64), (torch.float16,), cpu),
              r"k has shape \[2, 8, 64\]; expected \[3, \*, 64\]"),
             (("k", t, (2, 3, 64), (torch.float16,), cpu), r"expected \[2, 3, 64\]"),
             (("mask", t, (2, 8, 64), (torch.bool, torch.uint8), cpu),
              "mask has dtype torch.float16; accepted: torch.bool, torch.uint8"),
             (("v", t.transpose(0, 1), (8, 2, 64), (torch.float16,), cpu),
              "v must be contiguous"),
             (("qkv", t, (2, 8, 64), (torch.float16,), torch.device("meta")),
              "qkv is on cpu; expected meta")]
    for args, match in cases:
        with pytest.raises(attn.AttentionError, match=match):
            attn._check(*args)
    with pytest.raises(attn.AttentionError, match="groups of 1..8"):
        attn._check_heads(36, 4, 128, 10)
    with pytest.raises(attn.AttentionError, match="head_dim 96"):
        attn._check_heads(32, 8, 96, 10)
    assert issubclass(attn.AttentionError, lowvm.LowvmError)


def test_rope_program_writes_nothing_when_the_cache_is_full():
    """A position past the cache (HF's index_copy_ would raise; a kernel cannot): the
    views end at the head's last row, so no row of this or the next head is written."""
    from lowvm.kernels.decode_attention import decode_attention_rope

    batch, kv_heads, group, dim, length = 1, 2, 4, 64, 64
    qkv, cos, sin, k, v, mask = _rope_inputs(np.random.default_rng(9), batch, kv_heads, group,
                                             dim, length, length - 1)
    k_before, v_before = k.copy(), v.copy()
    out = np.zeros((batch * kv_heads * group, dim), np.float16)
    lowvm.interpret(decode_attention_rope, batch, length, qkv, cos, sin, k, v,
                    np.array([length], np.int32), mask, out, 0.125, kv_heads=kv_heads,
                    group=group, head_dim=dim)
    assert np.array_equal(k, k_before) and np.array_equal(v, v_before)


@pytest.mark.slow
def test_fused_step_broadcasts_position_embeddings_and_skips_offloaded_caches(monkeypatch):
    """Without position_ids transformers builds cos/sin of batch 1 for any batch; an
    offloaded static cache moves layers in update(), which the fused step would skip."""
    from transformers import StaticCache

    ids = torch.randint(0, 128, (2, 6))
    logits = []
    with torch.no_grad():
        for lowvm_attention in (False, True):
            model = _tiny_fused()
            if lowvm_attention:
                lowvm.use_decode_attention(model)
                _lift_device_rule(monkeypatch)
            cache = StaticCache(config=model.config, max_cache_len=12)
            model(input_ids=ids, past_key_values=cache, use_cache=True)
            step = model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True)
            logits.append(step.logits.float())
    assert (logits[1] - logits[0]).abs().max() < 1e-2
    assert attn._static_layer(type("Offloaded", (), {"offloading": True})(), 0) is None
