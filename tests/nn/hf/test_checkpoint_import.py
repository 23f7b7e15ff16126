"""GPTQ / AWQ import: tensors built in each format's exact packing, checked against the
dequantised reference computed straight from the unpacked codes."""

from __future__ import annotations

import pytest
import torch

from lowvm.nn.errors import CheckpointImportError
from lowvm.nn.hf.checkpoint_import import from_awq, from_gptq

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.layer.backend.LowvmFallbackWarning")

K, N = 256, 128


def _to_int32(words: list[int]) -> list[int]:
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words]


def _stream_words(values: list[int], bits: int) -> list[int]:
    """GPTQ's packing of one column: value i at bit i*bits of a little-endian stream of
    32-bit words (3-bit values straddle words), written bit by bit."""
    words = [0] * (len(values) * bits // 32)
    for i, v in enumerate(values):
        for b in range(bits):
            if (v >> b) & 1:
                pos = i * bits + b
                words[pos // 32] |= 1 << (pos % 32)
    return _to_int32(words)


def gptq_pack(q: torch.Tensor, zeros: torch.Tensor, bits: int, v1: bool):
    """q [K, N] codes, zeros [G, N] -> (qweight [K*bits/32, N], qzeros [G, N*bits/32])."""
    cols = [_stream_words(q[:, n].tolist(), bits) for n in range(q.shape[1])]
    qweight = torch.tensor(cols, dtype=torch.int64).t().to(torch.int32)
    stored = (zeros - 1) & (2**bits - 1) if v1 else zeros
    rows = [_stream_words(stored[g].tolist(), bits) for g in range(zeros.shape[0])]
    return qweight.contiguous(), torch.tensor(rows, dtype=torch.int64).to(torch.int32)


def awq_pack(q: torch.Tensor) -> torch.Tensor:
    """[R, C] 4-bit codes -> [R, C/8] int32, nibble i of word c = channel 8c + order[i]."""
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    out = []
    for row in q.tolist():
        words = []
        for c in range(len(row) // 8):
            w = 0
            for i in range(8):
                w |= row[8 * c + order[i]] << (4 * i)
            words.append(w)
        out.append(_to_int32(words))
    return torch.tensor(out, dtype=torch.int64).to(torch.int32)


def _reference(q, zeros, scales, g_idx):
    """W [N, K] in float64 from the format's own formula, channel by channel."""
    g = g_idx.long()
    return ((q.double() - zeros.double()[g]) * scales.double()[g]).t()


def _check(layer, w_ref, bias=None):
    x = torch.randn(3, 2, K, dtype=torch.float16)
    ref = x.double() @ w_ref.t()
    if bias is not None:
        ref = ref + bias.double()
    assert torch.allclose(layer.dequantize(torch.float64), w_ref, rtol=0, atol=0)
    y = layer(x).double()
    assert (y - ref).norm() / ref.norm() < 2e-3


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_gptq_import(bits, fmt):
    torch.manual_seed(bits)
    group = 64
    q = torch.randint(0, 2**bits, (K, N))
    zeros = torch.randint(1, 2**bits, (K // group, N))  # v1 cannot store zero 0
    scales = (torch.rand(K // group, N) * 0.02 + 0.001).half()
    qweight, qzeros = gptq_pack(q, zeros, bits, v1=fmt == "gptq")
    g_idx = torch.arange(K, dtype=torch.int32) // group
    bias = torch.randn(N).half()
    layer = from_gptq(qweight, qzeros, scales, g_idx, bias, bits=bits, checkpoint_format=fmt)
    assert layer.wtype.name == f"uint{bits}" and layer.group_size == group
    assert layer.input_perm is None
    _check(layer, _reference(q, zeros, scales, g_idx), bias)


def test_gptq_4bit_words_are_the_usual_shift_formula():
    """For 4 bits the stream packing is word = sum_j q[8i+j] << 4j (GPTQ's well-known form)."""
    q = torch.randint(0, 16, (K, N))
    qweight, _ = gptq_pack(q, torch.ones(2, N, dtype=torch.long), 4, v1=False)
    word = sum(int(q[j, 5]) << (4 * j) for j in range(8))
    assert int(qweight[0, 5]) & 0xFFFFFFFF == word


@pytest.mark.parametrize("bits", [3, 4])
def test_gptq_act_order(bits):
    torch.manual_seed(7)
    group = 64
    q = torch.randint(0, 2**bits, (K, N))
    zeros = torch.randint(1, 2**bits, (K // group, N))
    scales = (torch.rand(K // group, N) * 0.02 + 0.001).half()
    qweight, qzeros = gptq_pack(q, zeros, bits, v1=True)
    g_idx = (torch.randperm(K) // group).to(torch.int32)  # desc_act: groups not monotone
    layer = from_gptq(qweight, qzeros, scales, g_idx, bits=bits)
    assert layer.input_perm is not None
    _check(layer, _reference(q, zeros, scales, g_idx))
    restored = type(layer)(K, N, f"uint{bits}", group, act_order=True)
    restored.load_state_dict(layer.state_dict())
    x = torch.randn(4, K, dtype=torch.float16)
    assert torch.equal(restored(x), layer(x))


def test_gptq_irregular_g_idx_is_refused():
    q = torch.randint(0, 16, (K, N))
    qweight, qzeros = gptq_pack(q, torch.ones(4, N, dtype=torch.long), 4, v1=True)
    g_idx = torch.zeros(K, dtype=torch.int32)
    with pytest.raises(CheckpointImportError, match="exactly group_size=64"):
        from_gptq(qweight, qzeros, torch.ones(4, N).half(), g_idx, bits=4)


def test_gptq_bad_inputs():
    q = torch.randint(0, 16, (K, N))
    qweight, qzeros = gptq_pack(q, torch.ones(4, N, dtype=torch.long), 4, v1=True)
    scales = torch.ones(4, N).half()
    with pytest.raises(CheckpointImportError, match="bits=5"):
        from_gptq(qweight, qzeros, scales, bits=5)
    with pytest.raises(CheckpointImportError, match="qweight must be a 2-D torch.int32"):
        from_gptq(qweight.float(), qzeros, scales, bits=4)
    with pytest.raises(CheckpointImportError, match="qzeros has shape"):
        from_gptq(qweight, qzeros[:, :4], scales, bits=4)
    with pytest.raises(CheckpointImportError, match="checkpoint_format"):
        from_gptq(qweight, qzeros, scales, bits=4, checkpoint_format="marlin")


def test_awq_import():
    torch.manual_seed(3)
    group = 128
    q = torch.randint(0, 16, (K, N))
    zeros = torch.randint(0, 16, (K // group, N))
    scales = (torch.rand(K // group, N) * 0.02 + 0.001).half()
    layer = from_awq(awq_pack(q), awq_pack(zeros), scales)
    assert layer.wtype.name == "uint4" and layer.group_size == group
    _check(layer, _reference(q, zeros, scales, torch.arange(K) // group))


def test_awq_interleaving_matters():
    """Reading the words in plain nibble order would give a different weight."""
    q = torch.randint(0, 16, (K, N))
    zeros = torch.full((2, N), 8)
    scales = torch.ones(2, N).half()
    layer = from_awq(awq_pack(q), awq_pack(zeros), scales)
    assert torch.equal(layer.dequantize(torch.float64), (q.double() - 8).t())
    plain = q.reshape(K, N // 8, 8)[..., [0, 4, 1, 5, 2, 6, 3, 7]].reshape(K, N)
    assert not torch.equal(layer.dequantize(torch.float64), (plain.double() - 8).t())


def test_awq_bad_bits():
    with pytest.raises(CheckpointImportError, match="4 bits"):
        from_awq(torch.zeros(K, N // 8, dtype=torch.int32),
                 torch.zeros(2, N // 8, dtype=torch.int32), torch.ones(2, N).half(), bits=3)


@pytest.mark.parametrize("bad", [float("nan"), 1e6])
def test_importers_refuse_scales_float16_cannot_hold(bad):
    q = torch.randint(0, 16, (K, N))
    qweight, qzeros = gptq_pack(q, torch.full((4, N), 8), 4, v1=True)
    scales = torch.ones(4, N)  # float32, as some producers store them
    scales[2, 9] = bad
    with pytest.raises(CheckpointImportError, match="from_gptq: scales hold values float16 "
                                                    "cannot store"):
        from_gptq(qweight, qzeros, scales, bits=4)
    with pytest.raises(CheckpointImportError, match="from_awq: scales hold values"):
        from_awq(awq_pack(q), awq_pack(torch.full((4, N), 8)), scales)


def test_importers_name_a_bias_of_the_wrong_shape():
    q = torch.randint(0, 16, (K, N))
    qweight, qzeros = gptq_pack(q, torch.full((4, N), 8), 4, v1=True)
    scales = torch.ones(4, N).half()
    with pytest.raises(CheckpointImportError, match=rf"from_gptq: bias must be a float tensor "
                                                    rf"of shape \({N},\); got torch.float16 "
                                                    rf"tensor of shape \({N + 1},\)"):
        from_gptq(qweight, qzeros, scales, bias=torch.zeros(N + 1).half(), bits=4)
    with pytest.raises(CheckpointImportError, match=r"from_awq: bias\[0\] = 100000"):
        from_awq(awq_pack(q), awq_pack(torch.full((4, N), 8)), scales,
                 bias=torch.full((N,), 1e5))
