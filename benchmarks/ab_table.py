"""Two gemm_quick.py JSON files side by side: the same rows (kernel, type, K, N, M) timed
by two builds of one run, e.g. the per-access and the related address lowering.

Usage: python benchmarks/ab_table.py A.json B.json [--labels plain,related]
"""

from __future__ import annotations

import argparse
import json


def rows_by_key(path: str) -> dict[tuple, dict]:
    """The file's rows keyed by what they timed (first row of each key wins)."""
    with open(path) as f:
        rows = json.load(f)["rows"]
    out: dict[tuple, dict] = {}
    for r in rows:
        out.setdefault((r["kernel"], r["dtype"], r["k"], r["n"], r["m"]), r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--labels", default="A,B")
    args = ap.parse_args()
    la, lb = args.labels.split(",")
    a, b = rows_by_key(args.a), rows_by_key(args.b)
    print(f" {'kernel':<12}{'type':<8}{'K':>6}{'N':>7}{'M':>6}{la:>10}{lb:>10}  "
          f"{'B/A':>5}{'TFLOP/s':>9}")
    for key in a:
        if key not in b:
            continue
        ra, rb = a[key], b[key]
        print(f" {key[0]:<12}{key[1]:<8}{key[2]:>6}{key[3]:>7}{key[4]:>6}"
              f"{ra['us']:>10.1f}{rb['us']:>10.1f}  {rb['us'] / ra['us']:>5.2f}"
              f"{rb['tflops']:>9.1f}")


if __name__ == "__main__":
    main()
