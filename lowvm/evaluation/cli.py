"""``python -m lowvm.evaluation``: how much quantization costs a trained model.

Trains a small Llama on the Python standard library's sources (byte tokens) for a fixed
wall-clock budget, keeps its float16 weights, then for each variant (float16; a type at
group 128 by round to nearest or GPTQ; a bit budget) quantizes a fresh copy with
``quantize_model`` and measures held-out perplexity per byte, plus each quantized layer's
error against float16 on the same inputs. ``--json PATH`` gets ``{"ok", "model", "rows"}``
(rewritten after each variant, so a run cut short keeps what it measured); ``ok`` is false
when any variant failed, and that row carries an ``error``. The table is printed last.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

from lowvm.errors import LowvmError
from lowvm.evaluation.benchmark import Reference, evaluate_variant
from lowvm.evaluation.configs import RECIPES, recipe
from lowvm.evaluation.corpus import load_corpus, random_batch, sequences
from lowvm.evaluation.errors import EvaluationError
from lowvm.evaluation.train import train
from lowvm.evaluation.variants import DEFAULT_VARIANTS, parse_variants

__all__ = ["build_parser", "run", "format_table", "main"]

CALIBRATION_SEED = 1234  # calibration windows are drawn apart from the training stream


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lowvm.evaluation",
                                description=__doc__.splitlines()[0])
    p.add_argument("--json", metavar="PATH", help="write the results here")
    p.add_argument("--config", default="small", choices=sorted(RECIPES),
                   help="model and recipe (small: ~24 M parameters, for a GPU; tiny: CPU tests)")
    p.add_argument("--device", default=None,
                   help="where to train and evaluate (default: cuda if available, else cpu)")
    p.add_argument("--train-seconds", type=float, default=None,
                   help="wall-clock training budget (default: the config's; small 180)")
    p.add_argument("--max-steps", type=int, default=None,
                   help="also stop training after this many steps")
    p.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                   help="comma list: fp16, <type>-rtn, <type>-gptq, bits<N> (default: %(default)s)")
    p.add_argument("--group-size", type=int, default=128, help="quantization group size")
    p.add_argument("--seed", type=int, default=0, help="initialisation and data order")
    p.add_argument("--max-bytes", type=int, default=None,
                   help="cap on corpus bytes read (default: every file)")
    p.add_argument("--eval-sequences", type=int, default=None,
                   help="held-out sequences scored (default: the config's; small 1024)")
    p.add_argument("--calibration-sequences", type=int, default=32,
                   help="training sequences given to GPTQ and bit budgets")
    p.add_argument("--batch-size", type=int, default=8,
                   help="sequences per forward when scoring, calibrating and probing layers")
    return p


def _say(text: str) -> None:
    print(text, flush=True)


def _write(path: str | None, result: dict[str, Any]) -> None:
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(result, indent=1) + "\n")


def _check_options(opts: argparse.Namespace) -> None:
    for name in ("train_seconds", "max_steps", "eval_sequences", "max_bytes"):
        value = getattr(opts, name)
        if value is not None and not value > 0:
            raise EvaluationError(f"--{name.replace('_', '-')} {value}: accepted: a positive "
                                  "number")
    for name in ("calibration_sequences", "batch_size", "group_size"):
        if getattr(opts, name) < 1:
            raise EvaluationError(f"--{name.replace('_', '-')} {getattr(opts, name)}: "
                                  "accepted: a positive int")


def run(opts: argparse.Namespace) -> dict[str, Any]:
    """Train, then measure every variant; returns the JSON document."""
    _check_options(opts)
    r = recipe(opts.config)
    variants = parse_variants(opts.variants, opts.group_size)
    device = torch.device(opts.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    started = time.perf_counter()
    corpus = load_corpus(max_bytes=opts.max_bytes)
    info = corpus.describe()
    _say(f"corpus: {info['train_files']} training files ({info['train_bytes']:,} bytes), "
         f"{info['heldout_files']} held out ({info['heldout_bytes']:,} bytes)")
    heldout = sequences(corpus.heldout, r.seq_len, opts.eval_sequences or r.eval_sequences)
    seconds = opts.train_seconds or r.train_seconds
    _say(f"training {opts.config} on {device} for {seconds:g} s"
         + (f" or {opts.max_steps} steps" if opts.max_steps else ""))
    trained = train(corpus.train, r, device, seconds=seconds, max_steps=opts.max_steps,
                    seed=opts.seed, log=_say)
    dense = trained.model
    n_params = sum(p.numel() for p in dense.parameters())
    where = (torch.cuda.get_device_name(device) if device.type == "cuda"
             else platform.processor() or "cpu")
    model_info: dict[str, Any] = {
        "config": opts.config, **r.to_dict(), "parameters": n_params, "seed": opts.seed,
        **trained.describe(), "device": where, "heldout_sequences": heldout.shape[0],
        "corpus": {**info, "python": platform.python_version()}}
    settings = {"variants": [v.key for v in variants], "group_size": opts.group_size,
                "calibration_sequences": opts.calibration_sequences,
                "batch_size": opts.batch_size, "max_bytes": opts.max_bytes,
                "train_seconds": seconds, "max_steps": opts.max_steps}
    _say(f"trained {trained.steps} steps in {trained.seconds:.1f} s, train loss "
         f"{trained.train_loss:.4f}; {n_params / 1e6:.1f} M parameters")
    generator = torch.Generator().manual_seed(CALIBRATION_SEED)
    calib = random_batch(corpus.train, r.seq_len, opts.calibration_sequences, generator)
    ref = Reference(recipe=r, device=device, dense=dense,
                    state_dict={k: v.detach().clone() for k, v in dense.state_dict().items()},
                    heldout=heldout, calibration=list(calib.to(device).split(opts.batch_size)),
                    probe=heldout[:opts.batch_size].to(device), batch_size=opts.batch_size)
    result: dict[str, Any] = {"ok": False, "finished": False, "model": model_info,
                              "settings": settings, "rows": []}
    fp16 = None
    for variant in variants:
        row = evaluate_variant(variant, ref, fp16)
        if variant.key == "fp16":
            fp16 = row.get("perplexity")
        result["rows"].append(row)
        _say(f"{variant.label:>20}: " + (f"ERROR {row['error']}" if "error" in row else
                                         f"perplexity {row['perplexity']:.4f}, "
                                         f"{row['bits_per_weight']:.3f} bits/weight"))
        _write(opts.json, result)
    result["finished"] = True
    result["ok"] = all("error" not in row for row in result["rows"])
    result["wall_s"] = round(time.perf_counter() - started, 1)
    return result


def _num(value: Any, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as aligned text: bits per weight, perplexity, its increase over float16,
    median per-layer relative error and top-1 agreement; failed rows' errors below."""
    header = ("variant", "bits/w", "perplexity", "vs fp16", "layer err", "top-1")
    lines = [header]
    for row in rows:
        increase = row.get("increase_vs_fp16")
        lines.append((row["variant"], _num(row.get("bits_per_weight"), ".3f"),
                      "ERROR" if "error" in row else _num(row.get("perplexity"), ".4f"),
                      "" if increase is None else f"{100 * increase:+.2f}%",
                      _num(row.get("layer_rel_error_median"), ".4f"),
                      _num(row.get("top1_agreement"), ".4f")))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(c.rjust(w) if i else c.ljust(w)
                      for i, (c, w) in enumerate(zip(line, widths))).rstrip()
            for line in lines]
    text += [f"{row['variant']}: {row['error']}" for row in rows if "error" in row]
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    try:
        result = run(opts)
    except LowvmError as exc:  # a bad option or corpus: the message says what is accepted
        print(f"error: {exc}", file=sys.stderr)
        _write(opts.json, {"ok": False, "error": str(exc), "rows": []})
        return 2
    except Exception as exc:  # training itself failed: recorded, then raised as it was
        _write(opts.json, {"ok": False, "error": f"{type(exc).__name__}: {exc}", "rows": []})
        raise
    _write(opts.json, result)
    _say(format_table(result["rows"]))
    _say(f"{'ok' if result['ok'] else 'FAILED'} in {result['wall_s']} s")
    return 0 if result["ok"] else 1
