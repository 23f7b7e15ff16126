"""One comparison of float16 and quantized copies: models quantized and checked, each
timed at every batch size and mode, the results written to ``--json`` after every step."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from typing import Any

import torch

from lowvm.nn.serve.attention import use_decode_attention
from lowvm.nn.serve.fuse import fuse_projections
from lowvm.serving.clock import timed
from lowvm.serving.generation import leading_equal, prompts, sample_tokens
from lowvm.serving.measure import Settings, loop_compile_mode, measure, release
from lowvm.serving.models import quantized_copy, weight_bytes
from lowvm.serving.quality import layer_errors, logit_errors

__all__ = ["Run", "speed_rows", "measure_row", "add_quantized", "fuse_float16", "model_name",
           "eager_tokens"]


class Run:
    """The results of one invocation, written to ``--json`` after every step."""

    def __init__(self, args: argparse.Namespace, device: str,
                 command: list[str] | None = None) -> None:
        self.args, self.device = args, device
        self.settings = Settings(repeats=args.repeats, forward_steps=args.forward_steps,
                                 compile_backend=args.compile_backend,
                                 fullgraph=args.fullgraph, loop_compile=args.loop_compile,
                                 loop_capture=not args.no_loop_capture, overlap=args.overlap)
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
                        "loop": {"mode": loop_compile_mode(args.loop_compile, device),
                                 "backend": args.compile_backend, "fullgraph": True,
                                 "dynamic": False, "cuda_graph": device == "cuda"
                                 and not args.no_loop_capture}},
            "command": sys.argv[1:] if command is None else command,
            "models": {}, "speed": [], "errors": [],
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
    """Tokens per sequence in eager mode."""
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
        measured, out = measure(model, ids, mode, tokens, run.settings, run.device)
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


def model_name(args: argparse.Namespace, dtype: str) -> str:
    """A quantized model's row name: its type, and lm_head's when ``--lm-head`` sets one."""
    return dtype if args.lm_head is None else f"{dtype}/lm {args.lm_head}"


def _fuse(model: Any) -> dict[str, Any]:
    """Fuse ``model``'s q/k/v and gate/up projections; what its ``models`` entry records."""
    report = fuse_projections(model)
    print(report, flush=True)
    return {"fused": bool(report.attention_fused or report.mlps_fused),
            "fuse_report": {"attention_fused": report.attention_fused,
                            "mlps_fused": report.mlps_fused, "dense_fused": report.dense_fused,
                            "skipped": [list(item) for item in report.skipped]}}


def fuse_float16(run: Run, dense: Any) -> bool:
    """Fuse the float16 model the way the quantized ones are (``--fuse``), in place, so
    the speed ratio measures the weights, not the fusion; recorded in its ``models`` entry.
    Call it after every quantized copy is made and compared (they name dense's layers as
    they were). False when fusing failed (recorded; the model is timed unfused)."""
    info = run.result["models"].setdefault("float16", {})
    try:
        info.update(_fuse(dense))
    except Exception as exc:  # noqa: BLE001  (recorded; the model is still timed)
        run.error("fuse float16", exc)
        info["fused"] = False
        return False
    run.save()
    return bool(info["fused"])


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
            fuse_info = _fuse(quant)
        except Exception as exc:  # noqa: BLE001  (recorded; the next type may still work)
            run.error(f"fuse {dtype}", exc)
            return None
    if args.attention == "lowvm":
        use_decode_attention(quant)
    info: dict[str, Any] = {**fuse_info, "attention": quant.config._attn_implementation,
        "quantize_s": seconds, "layers_replaced": report.layers_replaced,
        "layers_skipped": sorted(report.skipped), "weight_bytes": weight_bytes(quant),
        "quantized_layer_bytes": {"float16": report.bytes_before, "lowvm": report.bytes_after},
    }
    if device == "cuda":
        info["gpu_bytes_added"] = torch.cuda.memory_allocated() - allocated
    run.result["models"][model_name(args, dtype)] = info
    try:
        info["quality"] = {**logit_errors(dense, quant, probes["quality_ids"]),
                           **errors_by_layer}
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
