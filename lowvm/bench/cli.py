"""Command line of ``python -m lowvm.bench``.

Examples::

    python -m lowvm.bench gemm-decode                     # a scenario (lowvm.bench.scenarios)
    python -m lowvm.bench schedules --m 1 --dtype int4    # a scenario, options overridden
    python -m lowvm.bench gemm-decode --list              # its plan, no GPU needed
    python -m lowvm.bench --shape 4096,6144 --m 1,16 --dtype int4,int3 --group 64,128
    python -m lowvm.bench --list                          # the ad-hoc plan and the scenarios
    python -m lowvm.bench report                          # docs/performance.md's figures
    python -m lowvm.bench compare fresh.json [reference.json] --tolerance 0.07

A run writes ``benchmarks/results/<date>/<scenario>/<gpu>.json`` (or ``--out``) holding
every row and the environment, and prints a short table last; ``python -m
lowvm.bench.plot <json>`` draws a GEMM table.
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
from lowvm.bench.scenarios import ADHOC, SCENARIOS, Scenario
from lowvm.runtime.timing import METHODS, MIN_REPLAYS

__all__ = ["build_parser", "parse_config", "resolve_scenario", "describe_plan",
           "describe_scenarios", "main"]

DEFAULT_OUT = "benchmarks/results/"
_ALL_BASELINES = BASELINES + tuple(OPTIONAL_BASELINES)


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
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    for name in names:
        if name not in _ALL_BASELINES:
            raise BenchError(f"--baselines: {name!r} is not a baseline; choose from "
                             f"{', '.join(_ALL_BASELINES)} or 'none'")
    return names


def _parse_methods(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if not names:
        raise BenchError(f"--methods: {text!r} names no method; choose from "
                         f"{', '.join(METHODS)}")
    for name in names:
        if name not in METHODS:
            raise BenchError(f"--methods: {name!r} is not a timing method; choose from "
                             f"{', '.join(METHODS)}")
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
        description="Time lowvm's quantized GEMMs against cuBLAS, tinygemm, GemLite and "
                    "Marlin, or run a scenario (graph, eager and L2-flushed timings; "
                    "'report' and 'compare' read results).",
        epilog="scenarios: " + ", ".join(SCENARIOS) + "; also: report, compare")
    p.add_argument("scenario", nargs="?", choices=list(SCENARIOS), metavar="SCENARIO",
                   help="a scenario name (default: an ad-hoc GEMM table from the options)")
    p.add_argument("--shape", action="append", metavar="K,N",
                   help="weight shape (in_features,out_features); repeat or separate "
                        "with ';'. 'llama' = the five Llama-3 shapes (the default)")
    p.add_argument("--m", type=_typed(lambda t: shp.parse_int_list(t, "--m", "M")),
                   metavar="LIST", help="token counts, e.g. 1,4,16,64,256,4096")
    p.add_argument("--dtype", type=_typed(shp.parse_dtypes), metavar="LIST",
                   help="lowvm weight types, e.g. int4,int3,e3m2 (default int4)")
    p.add_argument("--group", type=_typed(shp.parse_groups), metavar="LIST",
                   help="group sizes, e.g. 64,128 (default 128)")
    p.add_argument("--baselines", type=_typed(_parse_baselines), metavar="LIST",
                   help="baselines to run: " + ", ".join(_ALL_BASELINES)
                        + " (optional ones only where they load) or none")
    p.add_argument("--methods", type=_typed(_parse_methods), metavar="LIST",
                   help="timing methods: " + ", ".join(METHODS))
    p.add_argument("--no-lowvm", action="store_true", help="time the baselines only")
    p.add_argument("--runs", type=int, default=30, help="timed runs per flushed row (>= 30)")
    p.add_argument("--replays", type=int, default=MIN_REPLAYS,
                   help=f"timed graph replays / eager rounds (>= {MIN_REPLAYS})")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs first")
    p.add_argument("--neighbours", type=int, help="schedules: neighbours of each choice")
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
                   help="a .json file, or the results root under which the run goes to "
                        f"<date>/<scenario>/<gpu>.json (default {DEFAULT_OUT})")
    p.add_argument("--anchors", nargs="?", const="auto", metavar="JSONL",
                   help="also print the anchor figures recorded 2026-11-22 (default "
                        "file: benchmarks/anchors-h100.jsonl)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--list", action="store_true",
                   help="print what would run, then exit (no GPU needed)")
    return p


def resolve_scenario(opts: argparse.Namespace) -> Scenario:
    """The scenario named on the command line (or the ad-hoc one) with the options."""
    base = SCENARIOS[opts.scenario] if opts.scenario else ADHOC
    if not base.is_gemm:
        return base
    shapes = shp.parse_shapes(opts.shape) if opts.shape else None
    return base.with_options(
        shapes=shapes, ms=opts.m,
        dtypes=tuple(d.name for d in opts.dtype) if opts.dtype else None,
        groups=opts.group, baselines=opts.baselines, methods=opts.methods,
        neighbours=opts.neighbours)


def parse_config(argv: list[str] | None = None) -> tuple[RunConfig, argparse.Namespace]:
    """Parse the command line into a :class:`RunConfig` (argparse exits on bad input);
    ``opts.resolved`` is the :class:`Scenario` it runs."""
    parser = build_parser()
    opts = parser.parse_args(argv)
    try:
        sc = resolve_scenario(opts)
        dtypes = shp.parse_dtypes(",".join(sc.dtypes)) if sc.dtypes else ()
    except BenchError as exc:
        parser.error(str(exc))
    if opts.warmup < 0:
        parser.error(f"--warmup {opts.warmup}: must be >= 0")
    if sc.kind == "schedules" and sc.neighbours < 0:
        parser.error(f"--neighbours {sc.neighbours}: must be >= 0")
    opts.resolved = sc
    cfg = RunConfig(shapes=sc.shapes, ms=sc.ms, dtypes=dtypes, groups=sc.groups,
                    baselines=tuple(b for b in sc.baselines if b in BASELINES),
                    optional=tuple(b for b in sc.baselines if b in OPTIONAL_BASELINES),
                    with_lowvm=not opts.no_lowvm, runs=opts.runs, warmup=opts.warmup,
                    max_run_ms=opts.max_run_ms, tol=opts.tol, hbm_tbps=opts.hbm_tbps,
                    measure_hbm=not opts.no_hbm_measure, seed=opts.seed,
                    methods=sc.methods, scenario=sc.name, replays=opts.replays)
    return cfg, opts


def _schedule_lines(cfg: RunConfig, count: int) -> list[str]:
    from lowvm.bench.schedules import plan

    lines = []
    for shape in cfg.shapes:
        for dt in cfg.dtypes:
            for g in cfg.groups:
                for m in cfg.ms:
                    try:
                        specs = [spec for spec, _ in plan(shape, dt, g, m, count, sm90=False)]
                    except Exception as exc:  # e.g. a shape the weight format refuses
                        lines.append(f"  {shape} {dt.name} g{g} M={m}: not runnable ({exc})")
                        continue
                    lines.append(f"  {shape} {dt.name} g{g} M={m}: " + ", ".join(specs))
    return lines


def describe_plan(cfg: RunConfig, sc: Scenario | None = None) -> str:
    """What a run measures, in words (for ``--list``)."""
    sc = sc or ADHOC
    lines = [f"scenario: {sc.name} ({sc.summary})"]
    if not sc.is_gemm:
        lines.append("command: " + " ".join(sc.command).replace("{python}", "python")
                     .replace("{out}", "<scratch>"))
        if sc.kind == "sanitizers":
            lines.append("under: compute-sanitizer --tool memcheck, then --tool racecheck")
        return "\n".join(lines)
    lines += [f"shapes (K x N): {', '.join(map(str, cfg.shapes))}",
              f"M: {', '.join(map(str, cfg.ms))}",
              f"methods: {', '.join(cfg.methods)}"]
    if sc.kind == "schedules":
        lines.append(f"types: {', '.join(d.name for d in cfg.dtypes)}; groups: "
                     f"{', '.join(map(str, cfg.groups))}")
        lines.append("schedules (the choice, then its nearest neighbours in "
                     "lowvm.tune.library_space; sm_90's wgmma choice applies above M = 16):")
        lines += _schedule_lines(cfg, sc.neighbours)
        return "\n".join(lines)
    kernels = planned_kernels(cfg.dtypes, cfg.groups, cfg.baselines, cfg.with_lowvm)
    lines.append(f"kernels: {', '.join(kernels)}")
    if cfg.optional:
        lines.append(f"optional, if they load: {', '.join(cfg.optional)}")
    lines.append(f"rows: {len(cfg.shapes) * len(cfg.ms) * len(kernels)}"
                 + (f" per method ({len(cfg.methods)})" if len(cfg.methods) > 1 else ""))
    return "\n".join(lines)


def describe_scenarios() -> str:
    """Every scenario, one line each."""
    width = max(map(len, SCENARIOS))
    return "\n".join(f"  {name:<{width}}  {sc.summary}" for name, sc in SCENARIOS.items())


def _anchors_for(opts: argparse.Namespace) -> Any:
    from lowvm.bench.anchors import default_anchor_path, load_anchors

    if not opts.anchors:
        return None
    path = default_anchor_path() if opts.anchors == "auto" else Path(opts.anchors)
    if path is None:
        raise BenchError("--anchors: no anchor file found (looked for "
                         "benchmarks/anchors-h100.jsonl); give a path")
    return load_anchors(path)


def _print_gemm(doc: dict[str, Any], cfg: RunConfig, anchors: Any) -> None:
    from lowvm.bench import table

    print(f"{doc['gpu']}, torch {doc['torch']}, CUDA {doc['cuda']}, {doc['date']}")
    print(table.format_hbm(doc["hbm"]))
    for note in doc.get("notes", []):
        print(note)
    if anchors is not None:
        print(table.format_anchors(anchors, [(s.k, s.n, m) for s in cfg.shapes
                                             for m in cfg.ms]))
        print()
    print(table.format_rows(doc["rows"]))


def _run(cfg: RunConfig, opts: argparse.Namespace, argv: list[str]) -> int:
    from lowvm.bench import results, table

    sc: Scenario = opts.resolved
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    anchors = _anchors_for(opts)
    if sc.kind == "gemm":
        from lowvm.bench.runner import run_benchmark

        doc = run_benchmark(cfg, log=log)
    elif sc.kind == "schedules":
        from lowvm.bench.schedules import run_schedules

        doc = run_schedules(cfg, sc.neighbours, log=log)
    else:
        from lowvm.bench.commands import run_command_scenario

        doc = run_command_scenario(sc, argv)
    doc["scenario"] = sc.name
    doc.setdefault("environment", {})["command"] = _command(argv)
    if anchors is not None:
        doc["anchors"] = {"label": anchors.label, "gpu": anchors.gpu, "source": anchors.source,
                          "rows": [a.__dict__ for a in anchors.anchors
                                   if any((a.k, a.n) == (s.k, s.n) for s in cfg.shapes)
                                   and a.m in cfg.ms]}
    path = results.write(doc, opts.out)
    if sc.is_gemm:
        _print_gemm(doc, cfg, anchors)
    else:
        print(table.format_outcome(doc))
    print(f"\nresults: {path}")
    return 0 if doc.get("ok", True) else 1


def _command(argv: list[str]) -> str:
    from lowvm.bench.environment import command_line

    return command_line(argv)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("report", "compare"):
        from lowvm.bench import compare, report

        return (report.main if args[0] == "report" else compare.main)(args[1:])
    cfg, opts = parse_config(args)
    if opts.list:
        print(describe_plan(cfg, opts.resolved))
        if opts.scenario is None:
            print("\nscenarios (python -m lowvm.bench <name> [--list]):")
            print(describe_scenarios())
        return 0
    try:
        return _run(cfg, opts, args)
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
