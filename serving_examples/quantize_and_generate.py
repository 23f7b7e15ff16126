"""Quantize a Llama with lowvm, generate, and compare speed and quality with float16.

The model is ``--model`` (a local path or Hugging Face id) or, without it, a Llama of random
weights of the ``--config`` preset (``tiny``, the default, or ``llama3-8b``; nothing is
downloaded). The example

1. loads or builds the float16 model,
2. quantizes a copy with ``lowvm.quantize_model`` (sharing the float16 model's embedding,
   norms and ``lm_head``), fuses its q/k/v and gate/up projections
   (``lowvm.fuse_projections``, which then fuses float16's too, so the speed-up compares
   the same GEMMs) and puts its decode steps' attention on lowvm
   (``lowvm.use_decode_attention``),
3. compares the quantized model's logits and layers with float16's and generates from both,
4. times greedy generation of both at each batch size with ``lowvm.serving.measure``:
   ``eager`` (transformers' ``generate``) and ``loop`` (``lowvm.serving.DecodeLoop``: one
   CUDA graph per decode step on a GPU, plain calls on a CPU),
5. prints the table of tokens/s (and the speed-up over float16), memory and quality.

Run: ``python serving_examples/quantize_and_generate.py`` (seconds on a CPU), or e.g.
``--config llama3-8b --batch-sizes 1,16`` on a GPU. The full measurement (more modes,
several types, a time budget, JSON results): ``python -m lowvm.serving --help``.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import torch

import lowvm
from lowvm.serving import (
    PRESETS,
    Settings,
    format_table,
    generate,
    init_random,
    layer_errors,
    load_pretrained,
    logit_errors,
    measure,
    prompts,
    random_config,
    release,
    shared_copy,
    weight_bytes,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="local path or HF id (default: a random --config Llama)")
    p.add_argument("--config", default="tiny", choices=sorted(PRESETS),
                   help="random model shape (default tiny)")
    p.add_argument("--dtype", default="int4", help="lowvm weight type (int4, int3, int2...)")
    p.add_argument("--group-size", type=int, default=128, help="quantization group")
    p.add_argument("--batch-sizes", default="1,16", help="comma-separated batch sizes")
    p.add_argument("--new-tokens", type=int, default=16, help="tokens generated per sequence")
    p.add_argument("--prompt-len", type=int, default=16, help="prompt tokens")
    p.add_argument("--modes", default="eager,loop", help="comma-separated eager,loop,graphs")
    return p.parse_args(argv)


def build(args: argparse.Namespace, device: str) -> Any:
    """The float16 model: loaded, or random weights built directly on ``device``."""
    if args.model:
        return load_pretrained(args.model, device)[0]
    torch.manual_seed(0)
    return init_random(random_config(args.config), device)


def quantize(dense: Any, args: argparse.Namespace, quality_ids: torch.Tensor) -> tuple[Any, dict]:
    """A quantized copy of ``dense`` ready to serve, and what it costs against float16."""
    quant = shared_copy(dense)  # shares every tensor: only the quantized layers are new
    report = lowvm.quantize_model(quant, dtype=args.dtype, group_size=args.group_size,
                                  skip=("lm_head",), progress=False)
    print(report)
    quality = layer_errors(dense, quant, quality_ids)  # pairs layers by name: before fusing
    fused = lowvm.fuse_projections(quant)  # q/k/v and gate/up: one GEMM each
    print(fused)
    lowvm.use_decode_attention(quant)
    quality.update(logit_errors(dense, quant, quality_ids))
    return quant, {"weight_bytes": weight_bytes(quant), "quality": quality,
                   "fused": bool(fused.attention_fused or fused.mlps_fused)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    warnings.filterwarnings("ignore", category=lowvm.nn.LowvmFallbackWarning)
    dense = build(args, device)
    vocab = dense.config.vocab_size
    quant, info = quantize(dense, args, prompts(4, max(args.prompt_len, 8), vocab, device,
                                                seed=1))
    # float16 gets the same fused q/k/v and gate/up GEMMs (after the layer comparison,
    # which pairs layers by their unfused names), so the speed-up measures the weights
    dense_fused = lowvm.fuse_projections(dense)
    models = {"float16": dense, args.dtype: quant}
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "models": {"float16": {"weight_bytes": weight_bytes(dense),
                               "fused": bool(dense_fused.attention_fused
                                             or dense_fused.mlps_fused)},
                   args.dtype: info},
        "speed": [],
    }

    sample = prompts(1, args.prompt_len, vocab, device, seed=0)
    for name, model in models.items():
        tokens = generate(model, sample, 8)[0, sample.shape[1]:].tolist()
        print(f"{name} greedy tokens: {tokens}")

    settings = Settings(repeats=3, forward_steps=20)
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        ids = prompts(batch, args.prompt_len, vocab, device, seed=2)
        for mode in args.modes.split(","):
            for name, model in models.items():
                row, _ = measure(model, ids, mode, args.new_tokens, settings, device)
                release(model)  # drop compiled state before the next model
                fused = result["models"][name].get("fused", False)
                row.update(model=name, batch=batch, mode=mode, fused=fused,
                           attention=model.config._attn_implementation)
                result["speed"].append(row)
                print(f"{name:8s} batch {batch:3d} {mode:6s} "
                      f"{row['decode_tokens_per_s']:9.1f} decode tok/s", flush=True)
    print()
    print(format_table(result))
    return result


if __name__ == "__main__":
    main()
