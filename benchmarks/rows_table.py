"""The rows of a gemm_quick.py JSON file as a short table: kernel, K×N, M, the schedule
fields asked for, µs and relative error (what the device scripts print last).

Usage: python benchmarks/rows_table.py FILE.json [--fields split,prefetch,stages]
"""

from __future__ import annotations

import argparse
import json


def table(path: str, fields: list[str]) -> list[str]:
    """One line per row of ``path``; absent fields print as '-'."""
    with open(path) as f:
        rows = json.load(f)["rows"]
    out = []
    for r in rows:
        sched = " ".join(f"{name}={r.get(name, '-')}" for name in fields)
        err = r.get("rel_err")
        out.append(f" {r['kernel']:<12}{r['k']:>6}x{r['n']:<6}{r['m']:>5}  {sched:<44}"
                   f"{r['us']:9.1f}" + (f"  err {err:.1e}" if err else ""))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--fields", default="split,prefetch,stages")
    args = ap.parse_args()
    print("\n".join(table(args.file, [f for f in args.fields.split(",") if f])))


if __name__ == "__main__":
    main()
