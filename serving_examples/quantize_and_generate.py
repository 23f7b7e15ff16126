"""Quantize a Llama-architecture model with lowvm, generate, and compare with float16.

The model is ``--model`` (a local path or Hugging Face id) or, without it, a Llama of random
weights built from ``--config`` (``tiny``, the CI default, or ``llama3-8b``: hidden 4096,
MLP 14336, 32 layers, 32 heads, 8 KV heads, vocabulary 128256; nothing is downloaded).
A random model is initialised **directly on the device in float16** (``torch.device``
context + ``dtype=float16``): building 8B parameters on the CPU in float32 and casting
would take minutes and 32 GB of host memory; on the GPU it is a few kernel launches.

For each type of ``--dtype`` (a comma list, e.g. ``int4,int3,int2``) a quantized copy is
made that *shares* the float16 model's embedding, norms and skipped layers (``lm_head`` by
default), so each type only adds its quantized linears (all copies stay alive: the 8B
model's int4 + int3 + int2 copies add about 16 GB to its 16 GB). With ``--fuse`` (the
default) each quantized copy then has its q/k/v and gate/up projections fused into one GEMM
each (``lowvm.fuse_projections``: 4 quantized GEMMs per layer instead of 7); ``--no-fuse``
keeps 7. ``--attention lowvm`` (the default) switches each quantized copy to lowvm's decode
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
  ``prefill_s``, ``decode_tokens_per_s = batch * (N - 1) / (t_N - t_1)`` (the decode rate
  the issue targets) and ``e2e_tokens_per_s = batch * N / t_N``. In ``graphs`` mode
  ``forward_ms`` is one compiled decode forward replayed alone (no generate loop), in
  ``loop`` mode one step (forward + argmax) replayed alone; the graph-break and
  CUDA-graph-skip counters of torch are recorded. Each row records how many leading
  greedy tokens agree with every mode measured before it (``leading_tokens_equal``).

``--json OUT`` is rewritten after every measurement (a run cut short keeps what it
measured); ``--time-budget S`` skips measurements that would start after S seconds; the
table printed last compares every type with float16. ``--print-table A.json [B.json ...]``
prints the table of earlier runs (merged) and exits. CPU CI runs it tiny in seconds.
"""

from __future__ import annotations

import argparse
import copy
import gc
import inspect
import json
import math
import os
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, CompileConfig, LlamaConfig

import lowvm

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"hidden": 128, "intermediate": 256, "layers": 2, "heads": 4, "kv_heads": 2,
             "vocab": 512, "max_positions": 1024, "rope_theta": 10000.0},
    "llama3-8b": {"hidden": 4096, "intermediate": 14336, "layers": 32, "heads": 32,
                  "kv_heads": 8, "vocab": 128256, "max_positions": 8192,
                  "rope_theta": 500000.0},
}
MODES = ("eager", "graphs", "loop")
ATTENTIONS = ("sdpa", "lowvm")
FP16_LOWVM_ATTN = "float16+attn"  # the float16 model with lowvm's decode attention
LOOP_ATTR = "_serving_decode_loop"  # where measure() keeps a loop mode's DecodeLoop
SAMPLE_TOKENS = 16  # greedy tokens of the fixed prompt kept per model (eager, cheap)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
                   help="fuse q/k/v and gate/up of the quantized models (lowvm.fuse_projections)"
                        " before measuring them (default); --no-fuse: one GEMM per projection")
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
            lowvm.dtype(args.lm_head)
        except lowvm.LowvmError as exc:
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


def loop_compile_modes() -> list[str]:
    """torch.compile modes of this torch that leave CUDA graphs to the caller: the loop
    captures its step itself, and inductor's own graphs would nest inside that capture."""
    from torch._inductor import list_mode_options

    return [mode for mode, options in list_mode_options().items()
            if not options.get("triton.cudagraphs", False)]


def loop_compile_mode(args: argparse.Namespace, device: str) -> str | None:
    """The mode loop mode compiles its step with, or None (plain calls)."""
    if args.loop_compile == "auto":
        return "default" if device == "cuda" else None
    return None if args.loop_compile == "off" else args.loop_compile


# ---------------------------------------------------------------------------------------
# models


def random_config(args: argparse.Namespace) -> LlamaConfig:
    """The ``--config`` preset with any per-field overrides (``--layers 2`` etc.)."""
    shape = dict(PRESETS[args.config])
    for key in ("layers", "hidden", "intermediate", "heads", "kv_heads", "vocab"):
        if getattr(args, key) is not None:
            shape[key] = getattr(args, key)
    return LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"],
                       intermediate_size=shape["intermediate"],
                       num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                       num_key_value_heads=shape["kv_heads"],
                       max_position_embeddings=shape["max_positions"], rms_norm_eps=1e-5,
                       rope_parameters={"rope_type": "default",
                                        "rope_theta": shape["rope_theta"]},
                       tie_word_embeddings=False)


def init_random(config: LlamaConfig, device: str | torch.device) -> Any:
    """A float16 model of ``config`` built where it will run (``meta``: nothing allocated).

    Every tensor is created on ``device`` in float16 and initialised there by transformers
    (normal(0, 0.02) linears and embeddings, unit norms): no float32 copy, no CPU pass.
    """
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    model.requires_grad_(False)
    return model.eval()


def build_model(args: argparse.Namespace, device: str) -> tuple[Any, Any]:
    """(float16 model on ``device``, tokenizer or None)."""
    if args.model:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float16)
        model.requires_grad_(False)
        try:
            tokenizer = AutoTokenizer.from_pretrained(args.model)
        except (OSError, ValueError):
            tokenizer = None
        return model.to(device).eval(), tokenizer
    torch.manual_seed(args.seed)
    return init_random(random_config(args), device), None


def shared_copy(dense: Any) -> Any:
    """A copy of ``dense``'s module tree (and config) that shares every parameter and
    buffer: what a variant of the model changes is then its only new memory."""
    shared = {id(t): t for t in (*dense.parameters(), *dense.buffers())}
    return copy.deepcopy(dense, shared)


def quantized_copy(dense: Any, dtype: str, group_size: int, skip: tuple[str, ...],
                   lm_head: str | None = None) -> tuple[Any, Any]:
    """``(model, report)``: ``dense`` with its linears quantized (``lm_head`` to its own
    type when given); ``dense`` is unchanged.

    The copy shares every parameter and buffer of ``dense`` (only the module tree is
    copied), so the layers left dense and the embedding cost no memory twice; the
    quantized layers are the only new tensors.
    """
    model = shared_copy(dense)
    types = dtype if lm_head is None else {"lm_head": lm_head, "*": dtype}
    report = lowvm.quantize_model(model, dtype=types, group_size=group_size, skip=skip,
                                  progress=False)
    head = model.get_output_embeddings()
    if lm_head is not None and not (isinstance(head, lowvm.QuantLinear)
                                    and head.spec.wtype == lowvm.dtype(lm_head)):
        raise ValueError(f"--lm-head {lm_head}: lm_head was left dense (tied to the "
                         f"embeddings, or matched by --skip {','.join(skip)!r})")
    return model, report


def weight_bytes(model: torch.nn.Module) -> dict[str, int]:
    """``stored``: state-dict tensors; ``resident``: every parameter and buffer (each once)."""
    stored: dict[int, int] = {}
    resident: dict[int, int] = {}
    for module in model.modules():
        tensors = [(t, True) for t in module._parameters.values() if t is not None]
        tensors += [(t, name not in module._non_persistent_buffers_set)
                    for name, t in module._buffers.items() if t is not None]
        for t, persistent in tensors:
            size = t.numel() * t.element_size()
            resident[id(t)] = size
            if persistent:
                stored[id(t)] = size
    return {"stored": sum(stored.values()), "resident": sum(resident.values())}


def release(model: Any) -> None:
    """Drop the compiled forward transformers keeps on the model, the ``loop`` mode's decode
    loop and torch's compile state (graphs, CUDA graph pools), so the next model compiles
    fresh and memory is freed."""
    for attr in ("_compiled_call", "_last_compile_config"):
        model.__dict__.pop(attr, None)
    loop = model.__dict__.pop(LOOP_ATTR, None)
    if loop is not None:
        loop.close()  # the CUDA graph's private memory pool, the compiled step, the cache
    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------
# generation and timing


def prompts(batch: int, length: int, vocab: int, device: str, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=gen).to(device)


def compile_config(args: argparse.Namespace, device: str) -> CompileConfig:
    """What ``generate`` compiles the decode forward with (static shapes per batch size)."""
    inductor = args.compile_backend == "inductor"
    config = CompileConfig(fullgraph=args.fullgraph, dynamic=False,
                           backend=args.compile_backend,
                           mode="reduce-overhead" if inductor else None)
    if device != "cuda":
        config._compile_all_devices = True  # transformers compiles only on accelerators
    return config


def cache_arg(model: Any) -> str:
    """The keyword ``model`` takes its KV cache by: ``cache`` from transformers 5.24 on
    (where ``past_key_values`` is deprecated and warns), ``past_key_values`` before."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"


def generate(model: Any, ids: torch.Tensor, tokens: int, cache: Any = None,
             compile_cfg: CompileConfig | None = None) -> Any:
    """Greedy generation of exactly ``tokens`` tokens; with a ``StaticCache`` (reset here)
    transformers compiles the decode steps with ``compile_cfg``."""
    kwargs: dict[str, Any] = {}
    if cache is not None:
        cache.reset()
        kwargs.update({cache_arg(model): cache}, compile_config=compile_cfg)
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=tokens, min_new_tokens=tokens, pad_token_id=0,
                              **kwargs)


def timed(fn: Callable[[], Any], device: str) -> tuple[float, Any]:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, out


def _compile_counters() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {"graph_breaks": int(sum(counters["graph_break"].values())),
            "graphs_compiled": int(counters["stats"]["unique_graphs"]),
            "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"])}


def forward_ms(model: Any, ids: torch.Tensor, cache: Any, compile_cfg: CompileConfig,
               steps: int, device: str) -> float | None:
    """Milliseconds of one compiled decode forward replayed alone (CUDA graph on a GPU).

    The arguments of one decode step are caught by wrapping the compiled forward that
    transformers keeps on the model (``_compiled_call``, private: None if it is missing).
    Each replay advances the static cache's write position, so it is put back before the
    timed replays and their number is capped by the room left in the cache.
    """
    compiled = model.__dict__.get("_compiled_call")
    if compiled is None:
        return None
    caught: list[tuple[tuple, dict, list[torch.Tensor]]] = []

    def spy(*a: Any, **kw: Any) -> Any:
        caught.append((a, kw, [layer.cumulative_length.clone() for layer in cache.layers]))
        return compiled(*a, **kw)

    model._compiled_call = spy
    try:
        generate(model, ids, 2, cache, compile_cfg)  # prefill, then one compiled step
    finally:
        model._compiled_call = compiled
    if not caught:
        return None
    a, kw, lengths = caught[0]

    def rewind() -> None:
        for layer, length in zip(cache.layers, lengths):
            layer.cumulative_length.copy_(length)

    def replay(count: int) -> None:
        for _ in range(count):  # each output dropped before the next replay overwrites it
            compiled(*a, **kw)

    steps = min(steps, cache.layers[0].max_cache_len - int(lengths[0]))
    with torch.no_grad():
        rewind()
        replay(min(3, steps))
        rewind()
        seconds, _ = timed(lambda: replay(steps), device)
    return 1e3 * seconds / steps


ARGMAX_CHUNK = 1024


def chunked_argmax(logits: torch.Tensor, chunk: int = ARGMAX_CHUNK) -> torch.Tensor:
    """``logits.argmax(-1)`` of a ``[batch, vocab]`` tensor in two reductions: the best of
    each ``chunk`` positions, then the best chunk. Same index (the first of equal maxima):
    compiled, one row of a 128256-token vocabulary is otherwise a single-block reduction
    (29 us on an H100, 1 % of an 8B model's int4 decode step)."""
    batch, vocab = logits.shape
    pad = -vocab % chunk
    padded = torch.nn.functional.pad(logits, (0, pad), value=float("-inf"))
    best, where = padded.view(batch, -1, chunk).max(-1)      # [batch, chunks]
    pick = best.argmax(-1, keepdim=True)                     # first chunk with the max
    return (pick * chunk + where.gather(-1, pick)).squeeze(-1)


class DecodeLoop:
    """Greedy decoding of ``ids`` by our own loop: one prefill, then one step per token.

    Why: ``generate`` runs its per-token logic (stopping criteria, logits processors, cache
    and mask bookkeeping) in Python outside the compiled forward, ~2-2.7 ms per token on an
    H100 for an 8B model, which caps any kernel speed-up. Serving engines capture the whole
    decode step instead; this loop does the same. The prefill is one eager forward of the
    prompt into a transformers ``StaticCache`` (length prompt + ``tokens``); a step is the
    forward of one token per sequence + argmax, reading the static ``ids``/``pos`` buffers
    and writing ``next``. The cache keeps its write position in a device tensor that the
    step advances in place, so a replayed step needs no host bookkeeping. ``capture()``
    (CUDA) warms the step up on a side stream and captures it in one ``CUDAGraph``; each
    token is then two device copies into the static inputs, one replay and one copy out.
    Without ``capture()`` (the CPU path, or a diagnostic) the same step runs as plain calls.
    ``compile_mode`` (not None) compiles the step first with ``torch.compile(fullgraph=True,
    dynamic=False)``; the mode must not use inductor's own CUDA graphs, which would nest.
    As ``generate`` with ``min_new_tokens`` does, end-of-sequence ids are never chosen, so a
    run makes exactly the tokens asked for. Tokens stay on the device (no per-token read
    back, no stopping check): the loop measures the decode step, not a streaming server.
    """

    warmup_steps = 3  # side-stream runs before capture (lazy loads, autotuning, compile)

    def __init__(self, model: Any, ids: torch.Tensor, tokens: int,
                 compile_mode: str | None = None, backend: str = "inductor",
                 overlap: bool = False) -> None:
        from transformers import StaticCache

        batch, prompt_len = ids.shape
        device = ids.device
        self.model, self.prompt, self.tokens = model, ids, tokens
        self.cache = StaticCache(config=model.config, max_cache_len=prompt_len + tokens)
        self.cache_arg = cache_arg(model)
        self.prompt_pos = torch.arange(prompt_len, device=device).repeat(batch, 1)
        # step i (1 <= i < tokens) feeds token i-1 at position prompt_len + i - 1
        self.step_pos = (prompt_len + torch.arange(tokens, device=device)).repeat(batch, 1)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)  # static inputs
        self.pos = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.next = torch.zeros(batch, 1, dtype=torch.long, device=device)  # static output
        self.out = torch.zeros(batch, tokens, dtype=torch.long, device=device)
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        self.banned = torch.tensor(eos, dtype=torch.long, device=device) if eos else None
        self.step_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = self._forward_pick
        if compile_mode is not None:
            self.step_fn = torch.compile(
                self._forward_pick, fullgraph=True, dynamic=False, backend=backend,
                mode=compile_mode if backend == "inductor" else None)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.build_s: float | None = None  # capture(): warm-up (compilation) + capture
        self.overlap = overlap  # capture lowvm's GEMMs as overlapped launches

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy token of each row of ``logits`` [batch, vocab], as [batch, 1]."""
        if self.banned is not None:
            logits = logits.index_fill(-1, self.banned, float("-inf"))
        return chunked_argmax(logits).unsqueeze(-1)

    def _forward_pick(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=ids, position_ids=pos, **{self.cache_arg: self.cache},
                            use_cache=True).logits
        return self._pick(logits[:, -1])

    def _step(self) -> None:
        """The decode step (what the graph holds): ``ids`` at ``pos`` -> ``next``."""
        self.next.copy_(self.step_fn(self.ids, self.pos))

    def _run_step(self) -> None:
        if self.graph is not None:
            self.graph.replay()
        else:
            self._step()

    def _prefill(self) -> None:
        self.cache.reset()  # zeroes the cache and its write position, in place
        logits = self.model(input_ids=self.prompt, position_ids=self.prompt_pos,
                            **{self.cache_arg: self.cache}, use_cache=True,
                            logits_to_keep=1).logits
        self.out[:, :1].copy_(self._pick(logits[:, -1]))

    def _decode(self, i: int) -> None:
        """Token ``i`` from token ``i - 1``."""
        self.ids.copy_(self.out[:, i - 1:i])
        self.pos.copy_(self.step_pos[:, i - 1:i])
        self._run_step()
        self.out[:, i:i + 1].copy_(self.next)

    @torch.no_grad()
    def capture(self) -> None:
        """Warm the step up on a side stream, then capture it in one CUDA graph.

        Each warm-up run prefills first, so the cache's write position never passes the
        room left for the tokens asked for (an out-of-range write would be a device fault).
        """
        start = time.perf_counter()
        if self.tokens > 1:
            self._prefill()  # the cache is allocated here, on the current stream
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(self.warmup_steps):
                    self._prefill()
                    self._decode(1)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), lowvm.overlapped_launches(self.overlap):
                self._step()
            self.graph = graph
        torch.cuda.synchronize()
        self.build_s = time.perf_counter() - start

    @torch.no_grad()
    def __call__(self, tokens: int) -> torch.Tensor:
        """The first ``tokens`` greedy tokens [batch, tokens] (a fresh tensor)."""
        if not 1 <= tokens <= self.tokens:
            raise ValueError(f"tokens must be in [1, {self.tokens}] (the cache's room); "
                             f"got {tokens}")
        self._prefill()
        for i in range(1, tokens):
            self._decode(i)
        return self.out[:, :tokens].clone()

    @torch.no_grad()
    def step_ms(self, count: int, device: str) -> float | None:
        """Milliseconds of one decode step run alone (a graph replay once captured), after a
        prefill; ``count`` is capped by the room left in the cache."""
        count = min(count, self.tokens - 1)
        if count < 1:
            return None
        self._prefill()
        self._run_step()  # one untimed step
        self._prefill()
        seconds, _ = timed(lambda: [self._run_step() for _ in range(count)], device)
        return 1e3 * seconds / count

    def close(self) -> None:
        """Free the graph's memory pool and drop the compiled step and the cache."""
        if self.graph is not None:
            self.graph.reset()
        self.graph = None
        self.step_fn = self._forward_pick
        self.cache = None


def measure(model: Any, ids: torch.Tensor, mode: str, tokens: int, args: argparse.Namespace,
            device: str) -> tuple[dict[str, Any], torch.Tensor]:
    """One (model, batch, mode) speed row, and the generated tokens of the last run."""
    from transformers import StaticCache

    graphs, loop = mode == "graphs", None
    cfg = compile_config(args, device) if graphs else None
    cache = (StaticCache(config=model.config, max_cache_len=ids.shape[1] + tokens)
             if graphs else None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    before = _compile_counters()
    if mode == "loop":
        loop = DecodeLoop(model, ids, tokens, loop_compile_mode(args, device),
                          args.compile_backend, overlap=args.overlap)
        model.__dict__[LOOP_ATTR] = loop  # release() frees its graph pool
        capture = device == "cuda" and not args.no_loop_capture

        def first() -> torch.Tensor:
            if capture:
                loop.capture()  # compilation (on the first warm-up step) and capture
            return loop(tokens)

        run_n: Callable[[int], torch.Tensor] = loop
    else:
        def run_n(n: int) -> torch.Tensor:
            return generate(model, ids, n, cache, cfg)[:, ids.shape[1]:]

        def first() -> torch.Tensor:
            return run_n(tokens)
    first_s, out = timed(first, device)
    run_n(1)
    ones, fulls = [], []
    for _ in range(args.repeats):
        ones.append(timed(lambda: run_n(1), device)[0])
        seconds, out = timed(lambda: run_n(tokens), device)
        fulls.append(seconds)
    prefill, full = statistics.median(ones), statistics.median(fulls)
    batch = ids.shape[0]
    decode = (batch * (tokens - 1) / (full - prefill)
              if tokens > 1 and full > prefill else math.nan)
    after = _compile_counters()
    row: dict[str, Any] = {
        "new_tokens": tokens, "decode_tokens_per_s": decode,
        "e2e_tokens_per_s": batch * tokens / full, "prefill_s": prefill, "full_s": full,
        "first_call_s": first_s, "compile_s_estimate": max(first_s - full, 0.0),
        "runs_full_s": fulls, "runs_prefill_s": ones,
        **{key: after[key] - before[key] for key in after},
    }
    if graphs and args.forward_steps > 0:
        try:  # a diagnostic on transformers internals: its failure keeps the row
            row["forward_ms"] = forward_ms(model, ids, cache, cfg, args.forward_steps, device)
        except Exception as exc:  # noqa: BLE001
            row["forward_ms_error"] = f"{type(exc).__name__}: {exc}"
    if loop is not None:
        row["cuda_graph"] = loop.graph is not None
        row["loop_build_s"] = loop.build_s  # warm-up (incl. compilation) + capture
        try:  # a diagnostic: its failure keeps the row
            if args.forward_steps > 0:
                row["forward_ms"] = loop.step_ms(args.forward_steps, device)
        except Exception as exc:  # noqa: BLE001
            row["forward_ms_error"] = f"{type(exc).__name__}: {exc}"
    if device == "cuda":
        row["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
    return row, out.cpu()


def quality(dense: Any, quant: Any, ids: torch.Tensor) -> dict[str, float]:
    with torch.no_grad():
        a = dense(ids, use_cache=False).logits.float()
        b = quant(ids, use_cache=False).logits.float()
    last = ((b[:, -1] - a[:, -1]).norm() / a[:, -1].norm()).item()
    top1 = (a.argmax(-1) == b.argmax(-1)).float().mean().item()
    return {"last_logits_rel_error": last, "top1_agreement": top1}


def layer_errors(dense: Any, quant: Any, ids: torch.Tensor) -> dict[str, float]:
    """Each quantized layer's output against its float16 original's, both fed the input the
    float16 model gives that layer for ``ids`` (relative error ``|q(x) - f(x)| / |f(x)|``,
    median and largest over the layers): the quantization's own error, which the last
    logits' error compounds through every layer after it (on random weights, by far).
    Call it before ``fuse_projections``: it pairs the layers by name."""
    errors: list[float] = []
    hooks = []

    def compare(q: Any) -> Callable[..., None]:
        def hook(_module: Any, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
            ref = output.float()
            norm = ref.norm().item()
            if norm > 0:
                errors.append((q(inputs[0]).float() - ref).norm().item() / norm)
        return hook

    for name, module in dense.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        try:
            q = quant.get_submodule(name)
        except AttributeError:
            continue
        if isinstance(q, lowvm.QuantLinear):
            hooks.append(module.register_forward_hook(compare(q)))
    try:
        with torch.no_grad():
            dense(ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    if not errors:
        return {}
    return {"layer_rel_error_median": statistics.median(errors),
            "layer_rel_error_max": max(errors), "layers_compared": len(errors)}


def leading_equal(a: torch.Tensor, b: torch.Tensor) -> int:
    """Leading token positions where every sequence of ``a`` and ``b`` agrees."""
    n = min(a.shape[1], b.shape[1])
    same = (a[:, :n] == b[:, :n]).all(dim=0).tolist()
    return n if all(same) else same.index(False)


# ---------------------------------------------------------------------------------------
# the run


class Run:
    """The results of one invocation, written to ``--json`` after every step."""

    def __init__(self, args: argparse.Namespace, device: str) -> None:
        self.args, self.device = args, device
        self.start = time.monotonic()
        self.result: dict[str, Any] = {
            "model": args.model or f"random {args.config}",
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "torch": torch.__version__, "transformers": _transformers_version(),
            "dtypes": args.dtypes, "group_size": args.group_size, "skip": list(args.skip_globs),
            "lm_head": args.lm_head,
            "new_tokens": args.new_tokens, "eager_new_tokens": eager_tokens(args),
            "prompt_len": args.prompt_len, "repeats": args.repeats, "fuse": args.fuse,
            "overlap": args.overlap, "attention": args.attention,
            "fp16_attention": args.fp16_attentions,
            "compile": {"backend": args.compile_backend, "fullgraph": args.fullgraph,
                        "dynamic": False, "mode": "reduce-overhead"
                        if args.compile_backend == "inductor" else None,
                        "cuda_graphs": device == "cuda"
                        and args.compile_backend == "inductor",
                        "loop": {"mode": loop_compile_mode(args, device),
                                 "backend": args.compile_backend, "fullgraph": True,
                                 "dynamic": False, "cuda_graph": device == "cuda"
                                 and not args.no_loop_capture}},
            "command": sys.argv[1:], "models": {}, "speed": [], "errors": [],
        }

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def out_of_time(self) -> bool:
        budget = self.args.time_budget
        return budget is not None and self.elapsed() > budget

    def save(self) -> None:
        self.result["elapsed_s"] = self.elapsed()
        if self.args.json_out:
            tmp = self.args.json_out + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.result, f, indent=2)
            os.replace(tmp, self.args.json_out)

    def error(self, where: str, exc: BaseException) -> None:
        traceback.print_exc()
        self.result["errors"].append({"where": where, "error": f"{type(exc).__name__}: {exc}"})
        self.save()


def eager_tokens(args: argparse.Namespace) -> int:
    return args.eager_new_tokens or args.new_tokens


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def speed_rows(run: Run, models: dict[str, Any], vocab: int, modes: list[str]) -> None:
    """Every (batch, mode, model), in that order of priority: all models at the first batch
    size and mode come before any at the next, so a time budget cuts the least wanted rows.
    Compiled state is released after each row; a failure or the budget skips, recorded."""
    args, device = run.args, run.device
    tokens_of: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
    for batch in args.batches:
        ids = prompts(batch, args.prompt_len, vocab, device, args.seed + 2)
        for mode in modes:
            for name, model in models.items():
                fused = bool(run.result["models"].get(name, {}).get("fused", False))
                row: dict[str, Any] = {"model": name, "batch": batch, "mode": mode,
                                       "fused": fused,
                                       "attention": model.config._attn_implementation}
                if run.out_of_time():
                    row["skipped"] = f"time budget ({args.time_budget:.0f} s) spent"
                    print(f"{name} batch {batch} {mode}: skipped (time budget)")
                else:
                    measure_row(run, row, model, ids, tokens_of.setdefault((name, batch), {}))
                    release(model)
                run.result["speed"].append(row)
                run.save()


def measure_row(run: Run, row: dict[str, Any], model: Any, ids: torch.Tensor,
                tokens_by_mode: dict[str, torch.Tensor]) -> None:
    """Fill ``row`` with one measurement (or the error that stopped it)."""
    args, mode = run.args, row["mode"]
    tokens = eager_tokens(args) if mode == "eager" else args.new_tokens
    try:
        measured, out = measure(model, ids, mode, tokens, args, run.device)
    except Exception as exc:  # noqa: BLE001  (recorded; the run goes on)
        row["error"] = f"{type(exc).__name__}: {exc}"
        run.error(f"{row['model']} batch {row['batch']} {mode}", exc)
        return
    row.update(measured)
    # the same greedy tokens as the modes measured before (eager vs graphs vs loop)?
    same = {other: leading_equal(out, earlier) for other, earlier in tokens_by_mode.items()}
    tokens_by_mode[mode] = out
    if same:
        row["leading_tokens_equal"] = same
    if len(same) == 1:  # the key of two-mode runs, kept for earlier readers of the JSON
        row["leading_tokens_equal_other_mode"] = next(iter(same.values()))
    agree = "".join(f", same tokens as {other}: {n}" for other, n in same.items())
    print(f"{row['model']:8s} batch {row['batch']:3d} {mode:6s} decode "
          f"{row['decode_tokens_per_s']:9.1f} tok/s  e2e {row['e2e_tokens_per_s']:9.1f} "
          f"tok/s  first call {row['first_call_s']:.1f} s{agree}", flush=True)


def sample_tokens(model: Any, ids: torch.Tensor, tokenizer: Any, count: int) -> Any:
    out = generate(model, ids, count)[0, ids.shape[1]:]
    return tokenizer.decode(out) if tokenizer is not None else out.tolist()


def model_name(args: argparse.Namespace, dtype: str) -> str:
    """A quantized model's row name: its type, and lm_head's when ``--lm-head`` sets one."""
    return dtype if args.lm_head is None else f"{dtype}/lm {args.lm_head}"


def add_quantized(run: Run, dense: Any, dtype: str, probes: dict[str, Any]) -> Any | None:
    """Quantize a shared copy of ``dense`` to ``dtype``, record its memory and quality
    (under :func:`model_name`); the model, or None when quantizing failed (recorded)."""
    args, device = run.args, run.device
    allocated = torch.cuda.memory_allocated() if device == "cuda" else 0
    try:
        seconds, (quant, report) = timed(
            lambda: quantized_copy(dense, dtype, args.group_size, args.skip_globs,
                                   args.lm_head), device)
    except Exception as exc:  # noqa: BLE001  (recorded; the next type may still work)
        run.error(f"quantize {dtype}", exc)
        return None
    print(report, f"in {seconds:.1f} s", flush=True)
    try:  # per layer, before fusing renames them
        errors_by_layer = layer_errors(dense, quant, probes["quality_ids"])
    except Exception as exc:  # noqa: BLE001  (recorded; speed is still measured)
        run.error(f"layer errors {dtype}", exc)
        errors_by_layer = {}
    fuse_info: dict[str, Any] = {"fused": False}
    if args.fuse:
        try:
            fuse_report = lowvm.fuse_projections(quant)
        except Exception as exc:  # noqa: BLE001  (recorded; the next type may still work)
            run.error(f"fuse {dtype}", exc)
            return None
        print(fuse_report, flush=True)
        fuse_info = {"fused": bool(fuse_report.attention_fused or fuse_report.mlps_fused),
                     "fuse_report": {"attention_fused": fuse_report.attention_fused,
                                     "mlps_fused": fuse_report.mlps_fused,
                                     "skipped": [list(item) for item in fuse_report.skipped]}}
    if args.attention == "lowvm":
        lowvm.use_decode_attention(quant)
    info: dict[str, Any] = {**fuse_info, "attention": quant.config._attn_implementation,
        "quantize_s": seconds, "layers_replaced": report.layers_replaced,
        "layers_skipped": sorted(report.skipped), "weight_bytes": weight_bytes(quant),
        "quantized_layer_bytes": {"float16": report.bytes_before, "lowvm": report.bytes_after},
    }
    if device == "cuda":
        info["gpu_bytes_added"] = torch.cuda.memory_allocated() - allocated
    run.result["models"][model_name(args, dtype)] = info
    try:
        info["quality"] = {**quality(dense, quant, probes["quality_ids"]), **errors_by_layer}
        info["generated"] = sample_tokens(quant, probes["sample_ids"], probes["tokenizer"],
                                          probes["sample_count"])
        if probes["tokenizer"] is None:
            same = [a == b for a, b in zip(info["generated"], probes["fp16_sample"])]
            info["generated_leading_equal_float16"] = (
                same.index(False) if False in same else len(same))
        print(f"lowvm {dtype} generated: {info['generated']!r}; quality vs float16: "
              f"{info['quality']}", flush=True)
    except Exception as exc:  # noqa: BLE001
        run.error(f"quality {dtype}", exc)
    run.save()
    return quant


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.print_table:
        print(format_table(load_results(args.print_table)))
        return {}
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" \
        else args.device
    modes = getattr(args, "mode_list", None) or (list(MODES) if device == "cuda"
                                                 else ["eager", "loop"])
    warnings.filterwarnings("ignore", category=lowvm.nn.LowvmFallbackWarning)
    run = Run(args, device)
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
                                       "generated": probes["fp16_sample"]}
    run.save()

    models: dict[str, Any] = {}
    if not args.no_fp16_speed:
        if "sdpa" in args.fp16_attentions:
            models["float16"] = dense
        if "lowvm" in args.fp16_attentions:  # shares every tensor of dense
            models[FP16_LOWVM_ATTN] = lowvm.use_decode_attention(shared_copy(dense))
            run.result["models"][FP16_LOWVM_ATTN] = {"attention": "lowvm"}
    for dtype in args.dtypes:  # all copies stay (8B: int4 + int3 + int2 add ~16 GB)
        quant = add_quantized(run, dense, dtype, probes)
        if quant is not None:
            models[model_name(args, dtype)] = quant
    speed_rows(run, models, vocab, modes)

    print()
    print(format_table(run.result))
    run.save()
    return run.result


# ---------------------------------------------------------------------------------------
# the table


def load_results(paths: list[str]) -> dict[str, Any]:
    """Several ``--json`` results as one: speed rows and models of all of them."""
    merged: dict[str, Any] = {"models": {}, "speed": [], "errors": [], "sources": paths}
    for path in paths:
        with open(path) as f:
            result = json.load(f)
        for name, info in result.get("models", {}).items():
            merged["models"].setdefault(name, info)
        merged["speed"] += result.get("speed", [])
        merged["errors"] += result.get("errors", [])
        merged.setdefault("device", result.get("device"))
    return merged


def _num(value: Any, fmt: str) -> str:
    if not isinstance(value, (int, float)) or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def _fused(row: dict[str, Any]) -> str:
    """yes/no, or '-' for rows of runs from before the option existed."""
    return {True: "yes", False: "no"}.get(row.get("fused"), "-")  # type: ignore[arg-type]


def format_table(result: dict[str, Any]) -> str:
    """Speed rows with the speed-up over float16 at the same batch and mode, and memory and
    quality per model."""
    ref = {(r["batch"], r["mode"]): r for r in result["speed"]
           if r["model"] == "float16" and "decode_tokens_per_s" in r}
    head = (f"{'model':12s} {'batch':>5s} {'mode':6s} {'decode tok/s':>12s} {'x fp16':>7s} "
            f"{'e2e tok/s':>10s} {'x fp16':>7s} {'fwd ms':>7s} {'1st call s':>10s} "
            f"{'breaks':>6s} {'cg skips':>8s} {'fused':>5s} {'attn':>5s}")
    lines = [f"device: {result.get('device')}", head, "-" * len(head)]
    for r in sorted(result["speed"], key=lambda r: (r["batch"], r["mode"])):
        if "decode_tokens_per_s" not in r:
            why = r.get("skipped") or r.get("error", "")
            lines.append(f"{r['model']:12s} {r['batch']:5d} {r['mode']:6s} not measured: "
                         f"{why[:60]}")
            continue
        base = ref.get((r["batch"], r["mode"]))
        x_dec = x_e2e = None
        if base is not None:
            x_dec = r["decode_tokens_per_s"] / base["decode_tokens_per_s"]
            x_e2e = r["e2e_tokens_per_s"] / base["e2e_tokens_per_s"]
        lines.append(
            f"{r['model']:12s} {r['batch']:5d} {r['mode']:6s} "
            f"{_num(r['decode_tokens_per_s'], '12.1f')} {_num(x_dec, '7.2f')} "
            f"{_num(r['e2e_tokens_per_s'], '10.1f')} {_num(x_e2e, '7.2f')} "
            f"{_num(r.get('forward_ms'), '7.2f')} {_num(r.get('first_call_s'), '10.1f')} "
            f"{_num(r.get('graph_breaks'), '6d')} {_num(r.get('cudagraph_skips'), '8d')} "
            f"{_fused(r):>5s} {r.get('attention', 'sdpa'):>5s}")
    lines += ["", f"{'model':12s} {'stored MiB':>10s} {'resident MiB':>12s} "
              f"{'rel err (last logits)':>22s} {'top-1 agree':>11s} "
              f"{'layer rel err median':>20s} {'max':>6s}"]
    for name, info in result["models"].items():
        wb = info.get("weight_bytes", {})
        q = info.get("quality", {})
        stored = wb.get("stored", math.nan) / 2**20
        resident = wb.get("resident", math.nan) / 2**20
        lines.append(f"{name:12s} {_num(stored, '10.1f')} {_num(resident, '12.1f')} "
                     f"{_num(q.get('last_logits_rel_error'), '22.4f')} "
                     f"{_num(q.get('top1_agreement'), '11.3f')} "
                     f"{_num(q.get('layer_rel_error_median'), '20.4f')} "
                     f"{_num(q.get('layer_rel_error_max'), '6.3f')}")
    if result.get("errors"):
        lines.append(f"{len(result['errors'])} error(s): see 'errors' in the JSON")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
