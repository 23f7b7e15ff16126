"""Command line of ``python -m lowvm.bench``.

Examples::

    python -m lowvm.bench                                  # Llama-3 shapes, int4 g128
    python -m lowvm.bench --shape 4096,6144 --m 1,16 --dtype int4,int3 --group 64,128
    python -m lowvm.bench --anchors --out benchmarks/results/
    python -m lowvm.bench --list                           # the plan, no GPU needed

The table goes to the terminal, the JSON (every row, GPU, date, versions, HBM
bandwidth) to ``--out``; ``python -m lowvm.bench.plot <json>`` draws it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lowvm.bench import shapes as shp
from lowvm.bench.candidates import BASELINES, OPTIONAL_BASELINES, planned_kernels
from lowvm.bench.errors import BenchError
from lowvm.bench.runner import RunConfig

__all__ = ["build_parser", "parse_config", "describe_plan", "main"]

DEFAULT_OUT = "benchmarks/results/"


def _typed(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type`` that shows the parser's own message on bad input."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except BenchError as exc:  # argparse names the option itself
            message = str(exc)
            if message.startswith("--"):
                message = message.split(": ", 1)[-1]
            raise argparse.ArgumentTypeError(message) from None
    convert.__name__ = parse.__name__
    return convert


def _parse_baselines(text: str) -> tuple[str, ...]:
    if text.strip().lower() == "none":
        return ()
    known = BASELINES + tuple(OPTIONAL_BASELINES)
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    for name in names:
        if name not in known:
            raise BenchError(f"--baselines: {name!r} is not a baseline; choose from "
                             f"{', '.join(known)} or 'none'")
    return names


def _positive_float(option: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise BenchError(f"{option}: {text!r} is not a number") from None
        if not value > 0:
            raise BenchError(f"{option}: {value} must be positive")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lowvm.bench",
        description="Time lowvm's quantized GEMMs against cuBLAS, tinygemm and others "
                    "(CUDA events, L2 flushed, median of >= 30 runs).")
    p.add_argument("--shape", action="append", metavar="K,N",
                   help="weight shape (in_features,out_features); repeat or separate "
                        "with ';'. 'llama' = the five Llama-3 shapes (the default)")
    p.add_argument("--m", type=_typed(lambda t: shp.parse_int_list(t, "--m", "M")),
                   default=shp.DEFAULT_M, metavar="LIST",
                   help="token counts, e.g. 1,4,16,64,256,4096 (the default)")
    p.add_argument("--dtype", type=_typed(shp.parse_dtypes), metavar="LIST",
                   default=shp.parse_dtypes(",".join(shp.DEFAULT_DTYPES)),
                   help="lowvm weight types, e.g. int4,int3,e3m2 (default int4)")
    p.add_argument("--group", type=_typed(shp.parse_groups), default=shp.DEFAULT_GROUPS,
                   metavar="LIST", help="group sizes, e.g. 64,128 (default 128)")
    p.add_argument("--baselines", type=_typed(_parse_baselines), metavar="LIST",
                   default=BASELINES + tuple(OPTIONAL_BASELINES),
                   help="baselines to run: " + ", ".join(BASELINES + tuple(OPTIONAL_BASELINES))
                        + " (all by default; optional ones only where importable) or none")
    p.add_argument("--no-lowvm", action="store_true", help="time the baselines only")
    p.add_argument("--runs", type=int, default=30, help="timed runs per row (>= 30)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs first")
    p.add_argument("--max-run-ms", type=_typed(_positive_float("--max-run-ms")),
                   default=250.0, help="skip a row whose single run takes longer")
    p.add_argument("--tol", type=_typed(_positive_float("--tol")),
                   help="relative-error limit for every kernel (default: 3e-3 for fp16 "
                        "outputs, 1.6e-2 for bf16)")
    p.add_argument("--hbm-tbps", type=_typed(_positive_float("--hbm-tbps")),
                   help="bandwidth of the floor (default: the read bandwidth measured "
                        "in the run)")
    p.add_argument("--no-hbm-measure", action="store_true",
                   help="skip measuring HBM bandwidth (floor at --hbm-tbps or 3.04)")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help="JSON file, or folder for bench_<gpu>_<date>.json "
                        f"(default {DEFAULT_OUT})")
    p.add_argument("--anchors", nargs="?", const="auto", metavar="JSONL",
                   help="also print the anchor figures recorded 2026-11-22 (default "
                        "file: benchmarks/anchors-h100.jsonl)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--list", action="store_true",
                   help="print the shapes, M and kernels that would run, then exit")
    return p


def parse_config(argv: list[str] | None = None) -> tuple[RunConfig, argparse.Namespace]:
    """Parse the command line into a :class:`RunConfig` (argparse exits on bad input)."""
    parser = build_parser()
    opts = parser.parse_args(argv)
    try:
        shapes = shp.parse_shapes(opts.shape)
    except BenchError as exc:
        parser.error(str(exc))
    if opts.warmup < 0:
        parser.error(f"--warmup {opts.warmup}: must be >= 0")
    baselines = tuple(b for b in opts.baselines if b in BASELINES)
    optional = tuple(b for b in opts.baselines if b in OPTIONAL_BASELINES)
    cfg = RunConfig(shapes=shapes, ms=opts.m, dtypes=opts.dtype, groups=opts.group,
                    baselines=baselines, optional=optional, with_lowvm=not opts.no_lowvm,
                    runs=opts.runs, warmup=opts.warmup, max_run_ms=opts.max_run_ms,
                    tol=opts.tol, hbm_tbps=opts.hbm_tbps,
                    measure_hbm=not opts.no_hbm_measure, seed=opts.seed)
    return cfg, opts


def describe_plan(cfg: RunConfig) -> str:
    """What a run with ``cfg`` measures, in words (for ``--list``)."""
    kernels = planned_kernels(cfg.dtypes, cfg.groups, cfg.baselines, cfg.with_lowvm)
    lines = [f"shapes (K x N): {', '.join(map(str, cfg.shapes))}",
             f"M: {', '.join(map(str, cfg.ms))}",
             f"kernels: {', '.join(kernels)}"]
    if cfg.optional:
        lines.append(f"optional, if importable: {', '.join(cfg.optional)}")
    lines.append(f"rows: {len(cfg.shapes) * len(cfg.ms) * len(kernels)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from lowvm.bench import results, table
    from lowvm.bench.anchors import default_anchor_path, load_anchors

    cfg, opts = parse_config(argv)
    if opts.list:
        print(describe_plan(cfg))
        return 0
    try:
        anchors = None
        if opts.anchors:
            path = default_anchor_path() if opts.anchors == "auto" else Path(opts.anchors)
            if path is None:
                raise BenchError("--anchors: no anchor file found (looked for "
                                 "benchmarks/anchors-h100.jsonl and ../shared/); give a path")
            anchors = load_anchors(path)
        from lowvm.bench.runner import run_benchmark

        doc = run_benchmark(cfg, log=lambda s: print(s, file=sys.stderr, flush=True))
        if anchors is not None:
            doc["anchors"] = {"label": anchors.label, "gpu": anchors.gpu,
                              "source": anchors.source,
                              "rows": [a.__dict__ for a in anchors.anchors
                                       if any((a.k, a.n) == (s.k, s.n) for s in cfg.shapes)
                                       and a.m in cfg.ms]}
        path_out = results.write(doc, opts.out)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{doc['gpu']}, torch {doc['torch']}, CUDA {doc['cuda']}, {doc['date']}")
    print(table.format_hbm(doc["hbm"]))
    for note in doc.get("notes", []):
        print(note)
    print(table.format_rows(doc["rows"]))
    if anchors is not None:
        problems = [(s.k, s.n, m) for s in cfg.shapes for m in cfg.ms]
        print()
        print(table.format_anchors(anchors, problems))
    print(f"\nresults: {path_out}  (plot: python -m lowvm.bench.plot {path_out})")
    return 0
