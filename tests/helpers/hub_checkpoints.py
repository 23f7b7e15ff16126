"""Write GPTQ, AWQ and compressed-tensors checkpoints of a tiny Llama in the Hub's layout
(``config.json`` with ``quantization_config``, two safetensors shards and
``model.safetensors.index.json``), with each quantized layer's float64 reference weight.

The packing here is written from each format's description, independently of lowvm's
importers: every code is placed bit by bit (vectorised) into little-endian 32-bit words.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from tests.helpers.models import tiny_llama

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def stream_pack(values: torch.Tensor, bits: int) -> torch.Tensor:
    """``values [R, C]`` (0 <= v < 2**bits) -> int32 ``[R, ceil(C*bits/32)]``: value i of a
    row at bit i*bits of a little-endian stream of words (a value may straddle two)."""
    rows, cols = values.shape
    v = values.long()
    bit = (v.unsqueeze(-1) >> torch.arange(bits)) & 1            # [R, C, bits], LSB first
    stream = bit.reshape(rows, cols * bits)
    words = -(-cols * bits // 32)
    stream = torch.nn.functional.pad(stream, (0, words * 32 - cols * bits))
    word = (stream.reshape(rows, words, 32) << torch.arange(32)).sum(-1)  # < 2**32
    return (word - ((word >> 31) << 32)).to(torch.int32)          # two's complement view


def awq_pack(values: torch.Tensor) -> torch.Tensor:
    """``[R, C]`` 4-bit codes -> int32 ``[R, C/8]``: nibble i of word c = channel 8c+order[i]."""
    r, c = values.shape
    v = values.long().reshape(r, c // 8, 8)[..., list(AWQ_ORDER)]  # nibble i's channel
    word = (v << (4 * torch.arange(8))).sum(-1)
    return (word - ((word >> 31) << 32)).to(torch.int32)


@dataclass
class Written:
    path: Path
    references: dict[str, torch.Tensor]   # layer name -> float64 W [N, K]
    dense: dict[str, torch.Tensor]         # the other tensors, as saved


def _groups(k: int, group: int | None, act_order: bool, gen: torch.Generator) -> torch.Tensor:
    size = k if group is None else group
    if act_order:
        return (torch.randperm(k, generator=gen) // size).to(torch.int32)
    return (torch.arange(k) // size).to(torch.int32)


def _minmax(w: torch.Tensor, g_idx: torch.Tensor, groups: int, qmax: int):
    """Per group of input channels: an fp16 scale and an integer zero mapping
    [min(w,0), max(w,0)] onto [0, qmax] (the asymmetric formats' usual rule)."""
    n = w.shape[0]
    scales, zeros = torch.empty(groups, n), torch.empty(groups, n)
    for g in range(groups):
        cols = w[:, g_idx == g]
        lo, hi = cols.min(1).values.clamp(max=0), cols.max(1).values.clamp(min=0)
        s = ((hi - lo) / qmax).clamp(min=1e-4).half().float()
        scales[g], zeros[g] = s, torch.round(-lo / s).clamp(1, qmax)
    return scales.half(), zeros


def _quantize(w: torch.Tensor, g_idx: torch.Tensor, scales, zeros, lo: int, hi: int):
    """codes [N, K] of w with each channel's group scale and zero."""
    s = scales.float()[g_idx.long()].t()
    z = zeros[g_idx.long()].t()
    return (torch.round(w / s) + z).clamp(lo, hi).long()


def _layer_tensors(fmt: str, w: torch.Tensor, bits: int, group: int | None, sym: bool,
                   act_order: bool, v1: bool, gen: torch.Generator):
    """One layer in format ``fmt``: (tensors to save, float64 reference W [N, K])."""
    n, k = w.shape
    g_idx = _groups(k, group, act_order, gen)
    groups = int(g_idx.max()) + 1
    qmax = 2**bits - 1
    if fmt == "compressed-tensors":
        half = 2 ** (bits - 1)
        if sym:
            scales = torch.stack([w[:, g_idx == g].abs().amax(1) for g in range(groups)])
            scales = (scales / (half - 1)).clamp(min=1e-4).half()
            zeros = torch.zeros(groups, n)
            q = _quantize(w, g_idx, scales, zeros, -half, half - 1)  # signed
        else:
            scales, zeros = _minmax(w, g_idx, groups, qmax)
            zeros = zeros - half                                     # signed zero point
            q = _quantize(w, g_idx, scales, zeros, -half, half - 1)
        out = {"weight_packed": stream_pack(q + half, bits),
               "weight_scale": scales.t().contiguous().to(torch.bfloat16),
               "weight_shape": torch.tensor([n, k])}
        if not sym:
            out["weight_zero_point"] = stream_pack(zeros.long() + half, bits).t().contiguous()
        if act_order:
            out["weight_g_idx"] = g_idx
        ref = (q.double() - zeros.double()[g_idx.long()].t()) * \
            out["weight_scale"].double().t()[g_idx.long()].t()
        return out, ref
    scales, zeros = _minmax(w, g_idx, groups, qmax)
    if sym:
        zeros = torch.full_like(zeros, 2 ** (bits - 1))
    q = _quantize(w, g_idx, scales, zeros, 0, qmax)                 # [N, K] unsigned
    ref = (q.double() - zeros.double()[g_idx.long()].t()) * scales.double()[g_idx.long()].t()
    if fmt == "gptq":
        stored = (zeros.long() - 1) & qmax if v1 else zeros.long()
        return {"qweight": stream_pack(q, bits).t().contiguous(),  # column n: K codes
                "qzeros": stream_pack(stored, bits), "scales": scales,
                "g_idx": g_idx}, ref
    return {"qweight": awq_pack(q.t().contiguous()), "qzeros": awq_pack(zeros.long()),
            "scales": scales}, ref


def quantization_config(fmt: str, bits: int, group: int | None, sym: bool, act_order: bool,
                        v1: bool) -> dict:
    """The ``quantization_config`` a Hub checkpoint of that format carries."""
    if fmt == "gptq":
        return {"quant_method": "gptq", "bits": bits, "group_size": group or -1,
                "desc_act": act_order, "sym": sym, "true_sequential": True,
                "damp_percent": 0.01, "checkpoint_format": "gptq" if v1 else "gptq_v2"}
    if fmt == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                "version": "gemm", "modules_to_not_convert": None}
    weights = {"num_bits": bits, "type": "int", "symmetric": sym,
               "strategy": "group" if group else "channel", "group_size": group,
               "actorder": "group" if act_order else None, "dynamic": False,
               "observer": "minmax"}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                          "input_activations": None,
                                          "output_activations": None}}}


def write_hub_checkpoint(path: Path, fmt: str, bits: int = 4, group: int | None = 64,
                         sym: bool = False, act_order: bool = False, v1: bool = True,
                         dense_layers: tuple[str, ...] = (), seed: int = 0,
                         **config_overrides) -> Written:
    """A tiny Llama in ``fmt`` ("gptq", "awq", "compressed-tensors") at ``path``.
    ``dense_layers``: projection names (e.g. "o_proj") the checkpoint leaves dense;
    ``config_overrides``: LlamaConfig fields other than the tiny defaults."""
    model = tiny_llama(seed=seed, **config_overrides)
    gen = torch.Generator().manual_seed(seed)
    tensors, refs = {}, {}
    for name, tensor in model.state_dict().items():
        module, _, leaf = name.rpartition(".")
        proj = module.rpartition(".")[2]
        if proj in PROJECTIONS and proj not in dense_layers and leaf == "weight":
            packed, refs[module] = _layer_tensors(fmt, tensor.float(), bits, group, sym,
                                                  act_order, v1, gen)
            tensors.update({f"{module}.{key}": v for key, v in packed.items()})
        else:
            tensors[name] = tensor.contiguous()
    path.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config["quantization_config"] = quantization_config(fmt, bits, group, sym, act_order, v1)
    config["torch_dtype"] = config["dtype"] = "float16"
    (path / "config.json").write_text(json.dumps(config, indent=2))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(path / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(keys, file))
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size()
                                            for t in tensors.values())},
             "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    dense = {k: v for k, v in tensors.items() if k.rpartition(".")[0] not in refs}
    return Written(path, refs, dense)


def reference_model(written: Written) -> torch.nn.Module:
    """The same model in float64 with each quantized layer's reference weight."""
    model = tiny_llama().double()
    state = {k: v.double() if v.is_floating_point() else v for k, v in written.dense.items()}
    state.update({f"{name}.weight": w for name, w in written.references.items()})
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all(k.endswith("rotary_emb.inv_freq") for k in missing), missing
    return model.eval()
