"""Quantize a Llama-architecture model with lowvm, generate, and compare with float16.

Run as ``python -m lowvm.serving [flags]``.

The model is ``--model`` (a local path or Hugging Face id) or, without it, a Llama of random
weights built from ``--config`` (``tiny``, the default, or ``llama3-8b``: hidden 4096,
MLP 14336, 32 layers, 32 heads, 8 KV heads, vocabulary 128256; nothing is downloaded).
A random model is initialised **directly on the device in float16** (``torch.device``
context + ``dtype=float16``): building 8B parameters on the CPU in float32 and casting
would take minutes and 32 GB of host memory; on the GPU it is a few kernel launches.

For each type of ``--dtype`` (a comma list, e.g. ``int4,int3,int2``) a quantized copy is
made that *shares* the float16 model's embedding, norms and skipped layers (``lm_head`` by
default), so each type only adds its quantized linears (all copies stay alive: the 8B
model's int4 + int3 + int2 copies add about 16 GB to its 16 GB). With ``--fuse`` (the
default) each quantized copy then has its q/k/v and gate/up projections fused into one GEMM
each (``lowvm.fuse_projections``: 4 GEMMs per layer instead of 7), and so has the float16
model once every copy is compared with it (its q/k/v and gate/up weights concatenated: the
ratio of the two then measures the weights, not the fusion); ``--no-fuse`` keeps 7 in
every model. ``--attention lowvm`` (the default) switches each quantized copy to lowvm's decode
attention (``lowvm.use_decode_attention``: a decode step's attention is one VM-program
launch per layer instead of transformers' SDPA path); ``--fp16-attention sdpa,lowvm`` also
times the float16 model with it (as ``float16+attn``), so the speed-up from the attention
alone can be told apart. Every speed row records ``"fused"`` and ``"attention"``.
Reported, per model:

* weight memory: ``stored`` (the state dict: packed codes, scales, zeros, dense rest) and
  ``resident`` (every parameter and buffer, including the kernel's repacked copy);
* quality vs float16 on fixed prompts: relative error of the last position's logits and
  top-1 agreement over all positions; each quantized layer's relative error against its
  float16 original on the activations the float16 model feeds it (median and largest over
  the layers: what quantization itself costs, where the logits' figures compound it
  through every later layer, which on random weights swamps them); the first greedy
  tokens of a fixed prompt;
* speed at each ``--batch-sizes``, greedy with exactly ``--new-tokens`` tokens from a
  ``--prompt-len``-token prompt, in each of ``--modes`` (batch-major: every model at the
  first batch size and mode before any at the next, so ``--time-budget`` cuts the last):
  ``eager`` (dynamic cache, no compilation), ``graphs`` (a transformers ``StaticCache``
  kept across runs + the forward that ``generate`` compiles with ``torch.compile(mode=
  "reduce-overhead")``, i.e. CUDA graphs on a GPU) and ``loop`` (``DecodeLoop``: our own
  greedy loop, as serving engines run it: an eager prefill into a ``StaticCache``, then
  each decode step -- forward of one token per sequence + argmax -- is one replay of a
  CUDA graph captured by hand, the step compiled first with ``torch.compile(fullgraph=
  True)`` in a mode without inductor's CUDA graphs, ``--loop-compile``; on a CPU the same
  loop makes plain calls). ``graphs`` pays ``generate``'s per-token Python outside the
  graph (~2-2.7 ms per token for the 8B model on an H100, which caps the speed-up of
  faster kernels); ``loop`` does not, so it measures what the model's step costs.
  Each (model, batch, mode) runs once untimed (``first_call_s``: compilation and graph
  capture included; ``loop_build_s``: the loop's warm-up, compilation and capture alone),
  then ``--repeats`` times a 1-token and an N-token generation; medians give
  ``prefill_s``, ``decode_tokens_per_s = batch * (N - 1) / (t_N - t_1)`` and
  ``e2e_tokens_per_s = batch * N / t_N``. In ``graphs`` mode
  ``forward_ms`` is one compiled decode forward replayed alone (no generate loop), in
  ``loop`` mode one step (forward + argmax) replayed alone; the graph-break and
  CUDA-graph-skip counters of torch are recorded. Each row records how many leading
  greedy tokens agree with every mode measured before it (``leading_tokens_equal``).

``--json OUT`` is rewritten after every measurement (a run cut short keeps what it
measured); ``--time-budget S`` skips measurements that would start after S seconds; the
table printed last compares every type with float16. ``--print-table A.json [B.json ...]``
prints the table of earlier runs (merged) and exits. It runs tiny on a CPU in seconds.
"""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import torch

from lowvm.dtypes import dtype as lowvm_dtype
from lowvm.errors import LowvmError
from lowvm.nn.layer.backend import LowvmFallbackWarning
from lowvm.nn.serve.attention import use_decode_attention
from lowvm.serving.clock import timed
from lowvm.serving.compare import Run, add_quantized, fuse_float16, model_name, speed_rows
from lowvm.serving.generation import prompts, sample_tokens
from lowvm.serving.measure import MODES, loop_compile_modes
from lowvm.serving.models import (
    PRESETS,
    SHAPE_FIELDS,
    init_random,
    load_pretrained,
    random_config,
    shared_copy,
    weight_bytes,
)
from lowvm.serving.report import format_table, load_results

__all__ = ["main", "parse_args", "build_model", "random_config_of"]

ATTENTIONS = ("sdpa", "lowvm")
FP16_LOWVM_ATTN = "float16+attn"  # the float16 model with lowvm's decode attention
SAMPLE_TOKENS = 16  # greedy tokens of the fixed prompt kept per model (eager, cheap)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags of ``python -m lowvm.serving`` (``argv``, default: the command line),
    checked: a bad value exits with argparse's usage message."""
    p = argparse.ArgumentParser(prog="python -m lowvm.serving",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="local path or HF id (default: random --config Llama)")
    p.add_argument("--config", default="tiny", choices=sorted(PRESETS),
                   help="random model shape (default tiny)")
    for name, what in (("layers", "decoder layers"), ("hidden", "hidden size"),
                       ("intermediate", "MLP size"), ("heads", "attention heads"),
                       ("kv-heads", "key/value heads"), ("vocab", "vocabulary size")):
        p.add_argument(f"--{name}", type=int, help=f"random config: {what} (overrides --config)")
    p.add_argument("--dtype", default="int4",
                   help="lowvm weight types, comma-separated (int4, int3, int2, uint4, e2m1...)")
    p.add_argument("--group-size", type=int, default=128, help="quantization group (-1: row)")
    p.add_argument("--skip", default="lm_head",
                   help="comma-separated layer globs kept in float16 ('' quantizes all)")
    p.add_argument("--lm-head", metavar="TYPE",
                   help="quantize lm_head to TYPE (e.g. int8) whatever --dtype is; the rows "
                        "are named 'DTYPE/lm TYPE' (default: lm_head as --skip says)")
    p.add_argument("--new-tokens", type=int, default=16, help="tokens generated per sequence")
    p.add_argument("--eager-new-tokens", type=int,
                   help="tokens per sequence in eager mode (default --new-tokens)")
    p.add_argument("--batch-sizes", default="1,16", help="comma-separated batch sizes")
    p.add_argument("--prompt-len", type=int, default=16, help="prompt tokens")
    p.add_argument("--modes", default="auto",
                   help="comma-separated eager,graphs,loop (auto: all three on cuda, "
                        "eager,loop on cpu)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per measurement")
    p.add_argument("--forward-steps", type=int, default=50,
                   help="graphs and loop modes: decode steps replayed alone, timed (0: off)")
    p.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=True,
                   help="fuse q/k/v and gate/up of the quantized and the float16 models "
                        "(lowvm.fuse_projections) before measuring them (default); --no-fuse: "
                        "one GEMM per projection")
    p.add_argument("--attention", default="lowvm", choices=ATTENTIONS,
                   help="attention of the quantized models: lowvm (decode steps on lowvm's "
                        "VM program, lowvm.use_decode_attention; the default) or sdpa "
                        "(transformers' own)")
    p.add_argument("--fp16-attention", default="sdpa",
                   help="comma-separated attentions the float16 model is timed with: sdpa "
                        "(as transformers runs it; the x fp16 column's reference) and/or "
                        f"lowvm (timed as {FP16_LOWVM_ATTN!r})")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=False,
                   help="loop mode: capture lowvm's GEMMs as overlapped launches "
                        "(lowvm.overlapped_launches: each starts loading weights while the "
                        "kernel before it finishes; sm_90+)")
    p.add_argument("--no-fp16-speed", action="store_true",
                   help="do not time the float16 model (its memory is still reported)")
    p.add_argument("--fullgraph", action="store_true", help="compile with fullgraph=True")
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile backend of graphs mode (inductor: CUDA graphs)")
    p.add_argument("--loop-compile", default="auto",
                   help="loop mode: torch.compile mode of the decode step, one without "
                        "inductor CUDA graphs (default, max-autotune-no-cudagraphs), or off "
                        "(auto: default on cuda, off on cpu); backend: --compile-backend")
    p.add_argument("--no-loop-capture", action="store_true",
                   help="loop mode on cuda: run the step as plain calls, no CUDA graph")
    p.add_argument("--time-budget", type=float,
                   help="seconds after which no new measurement starts (skipped, recorded)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--json", dest="json_out", help="write the results to this JSON file")
    p.add_argument("--print-table", nargs="+", metavar="JSON",
                   help="only print the table of earlier --json results (merged) and exit")
    args = p.parse_args(argv)
    args.fp16_attentions = [a for a in args.fp16_attention.split(",") if a]
    if not args.fp16_attentions or set(args.fp16_attentions) - set(ATTENTIONS):
        p.error(f"--fp16-attention takes a comma-separated subset of {', '.join(ATTENTIONS)}; "
                f"got {args.fp16_attention!r}")
    args.dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()]
    args.batches = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    args.skip_globs = tuple(s.strip() for s in args.skip.split(",") if s.strip())
    if args.lm_head is not None:
        try:
            lowvm_dtype(args.lm_head)
        except LowvmError as exc:
            p.error(f"--lm-head: {exc}")
        args.skip_globs = tuple(g for g in args.skip_globs if g != "lm_head")
    for name in ("new_tokens", "prompt_len", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1; got {getattr(args, name)}")
    if args.eager_new_tokens is not None and args.eager_new_tokens < 1:
        p.error(f"--eager-new-tokens must be at least 1; got {args.eager_new_tokens}")
    if not args.print_table and (not args.dtypes or not args.batches
                                 or min(args.batches) < 1):
        p.error("--dtype and --batch-sizes need at least one entry; batch sizes are >= 1")
    if args.modes != "auto":
        args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
        bad = [m for m in args.mode_list if m not in MODES]
        if bad or not args.mode_list:
            p.error(f"--modes takes {', '.join(MODES)} (comma-separated); got {args.modes!r}")
    if args.loop_compile not in ("auto", "off"):
        modes = loop_compile_modes()
        if args.loop_compile not in modes:
            p.error(f"--loop-compile takes auto, off or a torch.compile mode without CUDA "
                    f"graphs ({', '.join(modes)}); got {args.loop_compile!r}")
    return args


def random_config_of(args: argparse.Namespace) -> Any:
    """The ``--config`` preset with any per-field overrides (``--layers 2`` etc.)."""
    return random_config(args.config, **{key: getattr(args, key) for key in SHAPE_FIELDS})


def build_model(args: argparse.Namespace, device: str) -> tuple[Any, Any]:
    """(float16 model on ``device``, tokenizer or None)."""
    if args.model:
        return load_pretrained(args.model, device)
    torch.manual_seed(args.seed)
    return init_random(random_config_of(args), device), None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the comparison ``argv`` (default: the command line) asks for; its results."""
    args = parse_args(argv)
    if args.print_table:
        print(format_table(load_results(args.print_table)))
        return {}
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" \
        else args.device
    modes = getattr(args, "mode_list", None) or (list(MODES) if device == "cuda"
                                                 else ["eager", "loop"])
    warnings.filterwarnings("ignore", category=LowvmFallbackWarning)
    run = Run(args, device, None if argv is None else list(argv))
    run.result["modes"] = modes

    seconds, (dense, tokenizer) = timed(lambda: build_model(args, device), device)
    vocab = dense.config.vocab_size
    run.result["init_s"] = seconds
    run.result["parameters"] = sum(p.numel() for p in dense.parameters())
    print(f"float16 model: {run.result['parameters'] / 1e9:.2f}e9 parameters, built on "
          f"{device} in {seconds:.1f} s", flush=True)
    if tokenizer is not None:
        sample_ids = tokenizer(["The capital of France is"], return_tensors="pt"
                               ).input_ids.to(device)
    else:
        sample_ids = prompts(1, args.prompt_len, vocab, device, args.seed)
    probes = {"tokenizer": tokenizer, "sample_ids": sample_ids,
              "sample_count": min(args.new_tokens, SAMPLE_TOKENS),
              "quality_ids": prompts(4, max(args.prompt_len, 8), vocab, device, args.seed + 1)}
    probes["fp16_sample"] = sample_tokens(dense, sample_ids, tokenizer, probes["sample_count"])
    run.result["models"]["float16"] = {"weight_bytes": weight_bytes(dense),
                                       "generated": probes["fp16_sample"], "fused": False}
    run.save()

    timed_fp16 = [] if args.no_fp16_speed else args.fp16_attentions
    if "lowvm" in timed_fp16:  # its entry keeps its place before the quantized ones
        run.result["models"][FP16_LOWVM_ATTN] = {"attention": "lowvm"}
    quantized: dict[str, Any] = {}
    for dtype in args.dtypes:  # all copies stay (8B: int4 + int3 + int2 add ~16 GB)
        quant = add_quantized(run, dense, dtype, probes)
        if quant is not None:
            quantized[model_name(args, dtype)] = quant
    # fused after the copies are compared with it (by its unfused layers' names), before
    # its shared copy is made (which then shares the fused weights, not its own)
    fused = bool(timed_fp16) and args.fuse and fuse_float16(run, dense)
    models: dict[str, Any] = {}
    if "sdpa" in timed_fp16:
        models["float16"] = dense
    if "lowvm" in timed_fp16:  # shares every tensor of dense
        models[FP16_LOWVM_ATTN] = use_decode_attention(shared_copy(dense))
        run.result["models"][FP16_LOWVM_ATTN]["fused"] = fused
    models.update(quantized)
    speed_rows(run, models, vocab, modes)

    print()
    print(format_table(run.result))
    run.save()
    return run.result
