"""``python -m lowvm.fuzz``: differential fuzzing of the compiler (see docs/fuzzing.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lowvm.fuzz.run import FuzzConfig, default_workers, run, summary_table


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lowvm.fuzz",
        description="Random valid VM programs: the interpreter against a numpy reference "
                    "(cpu; a subset also compiled by ptxas for sm_80 and sm_90), and the "
                    "GPU against the interpreter (cuda).")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--programs", type=_positive, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="write the result here")
    p.add_argument("--share", type=_positive,
                   help="consecutive programs sharing one structure (kernel) with other "
                        "data; default 1 on cpu, 4 on cuda")
    p.add_argument("--workers", type=_positive, help="worker processes (default: the "
                   "CPUs available, at most 16; 1 runs in this process)")
    p.add_argument("--ptxas-every", type=int, default=10, metavar="K",
                   help="cpu: compile every K-th program with ptxas (0: none)")
    p.add_argument("--shrink-limit", type=int,
                   help="shrink at most this many distinct failures (default 10 on cpu, "
                        "4 on cuda, where each try compiles a kernel)")
    p.add_argument("--shrink-budget", type=float, metavar="SECONDS",
                   help="time for shrinking one failure (default 60 on cpu, 30 on cuda)")
    p.add_argument("--regressions", type=Path,
                   help="save each shrunk failure as a regression case in this folder "
                        "(tests/fuzz/regressions replays them)")
    p.add_argument("--replay", type=Path, nargs="+", metavar="CASE",
                   help="check these regression files (or result JSON rows) instead")
    return p


def _replay(paths: list[Path], device: str) -> int:
    from lowvm.fuzz.build import build_program
    from lowvm.fuzz.run import check_program
    from lowvm.fuzz.shrink import load_regression

    failed = 0
    for path in paths:
        spec, record = load_regression(path)
        verdict, _ = check_program(spec, device, record.get("stage", "").startswith("ptxas"))
        print(f"{path}: {verdict.status}" + (f" at {verdict.stage}: {verdict.message}"
                                              if not verdict.ok else ""))
        if not verdict.ok:
            failed += 1
            try:
                print(build_program(spec))
            except Exception as exc:  # noqa: BLE001 - the build failure is the finding
                print(f"  (does not build: {exc})")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.replay:
        return _replay(args.replay, args.device)
    cfg = FuzzConfig(device=args.device, programs=args.programs, seed=args.seed,
                     share=args.share or (4 if args.device == "cuda" else 1),
                     workers=args.workers or default_workers(),
                     ptxas_every=args.ptxas_every,
                     shrink_limit=args.shrink_limit if args.shrink_limit is not None
                     else (4 if args.device == "cuda" else 10),
                     shrink_budget_s=args.shrink_budget or (30.0 if args.device == "cuda"
                                                            else 60.0),
                     regressions=args.regressions)
    result = run(cfg, log=lambda text: print(text, file=sys.stderr))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(summary_table(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
