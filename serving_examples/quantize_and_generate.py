"""Quantize a Llama-architecture model with lowvm, generate, and compare with float16.

Builds the model from ``--model`` (a local path or Hugging Face id) or, without it, a
randomly initialised Llama of a small built-in config (no download). Quantizes a copy with
``lowvm.quantize_model``, then reports

* generated text (or token ids) for a fixed prompt,
* tokens/s at each ``--batch-sizes`` for float16 and lowvm (greedy, exactly
  ``--new-tokens`` tokens), eager and, on a GPU, with transformers' static cache (which
  transformers compiles with torch.compile and replays as CUDA graphs),
* weight memory of both models, and
* quality on fixed prompts: relative error of the last position's logits and top-1
  agreement over all positions vs float16.

``--json OUT`` writes everything. CPU CI runs it with the tiny default config in seconds.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
import warnings
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

import lowvm


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="local path or HF id (default: random tiny Llama)")
    p.add_argument("--dtype", default="int4", help="lowvm weight type (int4, uint4, e2m1, ...)")
    p.add_argument("--group-size", type=int, default=128, help="quantization group (-1: row)")
    p.add_argument("--new-tokens", type=int, default=16, help="tokens generated per sequence")
    p.add_argument("--batch-sizes", default="1,16", help="comma-separated batch sizes")
    p.add_argument("--prompt-len", type=int, default=16, help="prompt tokens (random config)")
    p.add_argument("--layers", type=int, default=2, help="random config: decoder layers")
    p.add_argument("--hidden", type=int, default=128, help="random config: hidden size")
    p.add_argument("--intermediate", type=int, default=256, help="random config: MLP size")
    p.add_argument("--heads", type=int, default=4, help="random config: attention heads")
    p.add_argument("--kv-heads", type=int, default=2, help="random config: key/value heads")
    p.add_argument("--vocab", type=int, default=512, help="random config: vocabulary size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--json", dest="json_out", help="write the results to this JSON file")
    return p.parse_args(argv)


def build_model(args: argparse.Namespace, device: str) -> tuple[Any, Any]:
    """(float16 model, tokenizer or None)."""
    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float16)
        try:
            tokenizer = AutoTokenizer.from_pretrained(args.model)
        except (OSError, ValueError):
            tokenizer = None
    else:
        torch.manual_seed(args.seed)
        config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                             intermediate_size=args.intermediate,
                             num_hidden_layers=args.layers, num_attention_heads=args.heads,
                             num_key_value_heads=args.kv_heads, max_position_embeddings=1024)
        model = LlamaForCausalLM(config).to(torch.float16)
        tokenizer = None
    return model.to(device).eval(), tokenizer


def weight_bytes(model: torch.nn.Module) -> int:
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def prompts(batch: int, length: int, vocab: int, device: str, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen).to(device)


def generate(model: Any, ids: torch.Tensor, new_tokens: int, static: bool) -> torch.Tensor:
    kwargs: dict[str, Any] = {"cache_implementation": "static"} if static else {}
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              pad_token_id=0, **kwargs)


def tokens_per_second(model: Any, ids: torch.Tensor, new_tokens: int, static: bool) -> float:
    generate(model, ids, new_tokens, static)  # warm up (kernels, compilation, graphs)
    if ids.is_cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    generate(model, ids, new_tokens, static)
    if ids.is_cuda:
        torch.cuda.synchronize()
    return ids.shape[0] * new_tokens / (time.perf_counter() - start)


def quality(dense: Any, quant: Any, ids: torch.Tensor) -> dict[str, float]:
    with torch.no_grad():
        a, b = dense(ids).logits.float(), quant(ids).logits.float()
    last = ((b[:, -1] - a[:, -1]).norm() / a[:, -1].norm()).item()
    top1 = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    return {"last_logits_rel_error": last, "top1_agreement": top1}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" \
        else args.device
    warnings.filterwarnings("ignore", category=lowvm.nn.LowvmFallbackWarning)
    dense, tokenizer = build_model(args, device)
    quant = copy.deepcopy(dense)
    report = lowvm.quantize_model(quant, dtype=args.dtype, group_size=args.group_size,
                                  progress=False)
    print(report)
    vocab = dense.config.vocab_size
    result: dict[str, Any] = {
        "model": args.model or "random-llama", "dtype": args.dtype, "group_size": args.group_size,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "new_tokens": args.new_tokens, "layers_replaced": report.layers_replaced,
        "weight_bytes": {"float16": weight_bytes(dense), "lowvm": weight_bytes(quant)},
    }

    if tokenizer is not None:
        ids = tokenizer(["The capital of France is"], return_tensors="pt").input_ids.to(device)
    else:
        ids = prompts(1, args.prompt_len, vocab, device, args.seed)
    out = generate(quant, ids, args.new_tokens, static=False)[0, ids.shape[1]:]
    text = tokenizer.decode(out) if tokenizer is not None else out.tolist()
    print(f"lowvm {args.dtype} generated: {text!r}")
    result["generated"] = text

    result["quality"] = quality(dense, quant, prompts(4, max(args.prompt_len, 8), vocab,
                                                      device, args.seed + 1))
    print("quality vs float16:", result["quality"])

    modes = ["eager", "static_cache"] if device == "cuda" else ["eager"]
    speed: list[dict[str, Any]] = []
    for batch in [int(b) for b in args.batch_sizes.split(",") if b]:
        batch_ids = prompts(batch, args.prompt_len, vocab, device, args.seed + 2)
        for mode in modes:
            row: dict[str, Any] = {"batch": batch, "mode": mode}
            for name, model in (("float16", dense), ("lowvm", quant)):
                row[f"{name}_tokens_per_s"] = tokens_per_second(
                    model, batch_ids, args.new_tokens, static=mode == "static_cache")
            speed.append(row)
            print(f"batch {batch:3d} {mode:12s} float16 {row['float16_tokens_per_s']:9.1f} tok/s"
                  f"   lowvm {row['lowvm_tokens_per_s']:9.1f} tok/s")
    result["tokens_per_s"] = speed
    mib = {k: v / 2**20 for k, v in result["weight_bytes"].items()}
    print(f"weights: float16 {mib['float16']:.2f} MiB, lowvm {mib['lowvm']:.2f} MiB")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
