"""Timing one model at one batch size in one mode: ``eager`` (``generate`` with a dynamic
cache), ``graphs`` (``generate`` with a ``StaticCache`` and the forward it compiles, CUDA
graphs on a GPU) or ``loop`` (:class:`~lowvm.serving.decode_loop.DecodeLoop`)."""

from __future__ import annotations

import gc
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import CompileConfig, StaticCache

from lowvm.serving.clock import timed
from lowvm.serving.decode_loop import DecodeLoop
from lowvm.serving.generation import generate

__all__ = ["MODES", "LOOP_ATTR", "Settings", "measure", "release", "compile_config",
           "forward_ms", "loop_compile_modes", "loop_compile_mode"]

MODES = ("eager", "graphs", "loop")
LOOP_ATTR = "_serving_decode_loop"  # where measure() keeps a loop mode's DecodeLoop


@dataclass
class Settings:
    """How :func:`measure` times (the defaults are ``python -m lowvm.serving``'s)."""

    repeats: int = 3  # timed runs per measurement (medians)
    forward_steps: int = 50  # graphs and loop modes: decode steps replayed alone (0: off)
    compile_backend: str = "inductor"  # graphs mode's torch.compile backend, and the loop's
    fullgraph: bool = False  # graphs mode: compile with fullgraph=True
    loop_compile: str = "auto"  # loop mode: auto, off or a mode (see loop_compile_mode)
    loop_capture: bool = True  # loop mode on cuda: capture the step in a CUDA graph
    overlap: bool = False  # loop mode: capture lowvm's GEMMs as overlapped launches


def loop_compile_modes() -> list[str]:
    """torch.compile modes of this torch that leave CUDA graphs to the caller: the loop
    captures its step itself, and inductor's own graphs would nest inside that capture."""
    from torch._inductor import list_mode_options

    return [mode for mode, options in list_mode_options().items()
            if not options.get("triton.cudagraphs", False)]


def loop_compile_mode(choice: str, device: str) -> str | None:
    """The mode loop mode compiles its step with for ``choice`` (``auto``: default on cuda,
    plain calls on cpu; ``off``: plain calls; else that mode), or None (plain calls)."""
    if choice == "auto":
        return "default" if device == "cuda" else None
    return None if choice == "off" else choice


def compile_config(backend: str, fullgraph: bool, device: str) -> CompileConfig:
    """What ``generate`` compiles the decode forward with (static shapes per batch size)."""
    inductor = backend == "inductor"
    config = CompileConfig(fullgraph=fullgraph, dynamic=False, backend=backend,
                           mode="reduce-overhead" if inductor else None)
    if device != "cuda":
        config._compile_all_devices = True  # transformers compiles only on accelerators
    return config


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


def measure(model: Any, ids: torch.Tensor, mode: str, tokens: int, settings: Settings,
            device: str) -> tuple[dict[str, Any], torch.Tensor]:
    """One (model, batch, mode) speed row, and the generated tokens of the last run.

    The call runs once untimed (``first_call_s``: compilation and graph capture included),
    then ``settings.repeats`` times a 1-token and a ``tokens``-token generation; medians
    give ``prefill_s``, ``decode_tokens_per_s = batch * (N - 1) / (t_N - t_1)`` and
    ``e2e_tokens_per_s = batch * N / t_N``. In ``graphs`` and ``loop`` modes
    ``forward_ms`` is one decode step replayed alone.
    """
    graphs, loop = mode == "graphs", None
    cfg = compile_config(settings.compile_backend, settings.fullgraph, device) if graphs \
        else None
    cache = (StaticCache(config=model.config, max_cache_len=ids.shape[1] + tokens)
             if graphs else None)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    before = _compile_counters()
    if mode == "loop":
        loop = DecodeLoop(model, ids, tokens, loop_compile_mode(settings.loop_compile, device),
                          settings.compile_backend, overlap=settings.overlap)
        model.__dict__[LOOP_ATTR] = loop  # release() frees its graph pool
        capture = device == "cuda" and settings.loop_capture

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
    for _ in range(settings.repeats):
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
    if graphs and settings.forward_steps > 0:
        try:  # a diagnostic on transformers internals: its failure keeps the row
            row["forward_ms"] = forward_ms(model, ids, cache, cfg, settings.forward_steps, device)
        except Exception as exc:  # noqa: BLE001
            row["forward_ms_error"] = f"{type(exc).__name__}: {exc}"
    if loop is not None:
        row["cuda_graph"] = loop.graph is not None
        row["loop_build_s"] = loop.build_s  # warm-up (incl. compilation) + capture
        try:  # a diagnostic: its failure keeps the row
            if settings.forward_steps > 0:
                row["forward_ms"] = loop.step_ms(settings.forward_steps, device)
        except Exception as exc:  # noqa: BLE001
            row["forward_ms_error"] = f"{type(exc).__name__}: {exc}"
    if device == "cuda":
        row["peak_gpu_bytes"] = torch.cuda.max_memory_allocated()
    return row, out.cpu()


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
