"""One line per kernel of an Nsight Compute report: time, DRAM, issue and stall reasons.

Usage: python benchmarks/ncu_summary.py rep.ncu-rep [--json out.json]
Reads ``ncu --import rep --page raw --csv`` (ncu must be on PATH). Stall reasons are the
average warps stalled per issued instruction, largest first.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess

COLUMNS = {
    "us": "gpu__time_duration.sum",
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_read_MB": "dram__bytes_read.sum",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "issue_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "regs": "launch__registers_per_thread",
    "grid": "launch__grid_size",
    "block": "launch__block_size",
    "waves": "launch__waves_per_multiprocessor",
}
STALL = "smsp__average_warps_issue_stalled_"
STALL_END = "_per_issue_active.ratio"


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def rows_of(report: str) -> list[dict]:
    out = subprocess.run(["ncu", "--import", report, "--page", "raw", "--csv"],
                         check=True, capture_output=True, text=True).stdout
    table = list(csv.reader(io.StringIO(out)))
    head, units, body = table[0], table[1], table[2:]
    rows = []
    for values in body:
        cell = dict(zip(head, values))
        unit = dict(zip(head, units))
        row = {"kernel": cell.get("Kernel Name", "?")[:60]}
        for key, metric in COLUMNS.items():
            value = number(cell.get(metric, ""))
            if value is not None and key == "us":
                value /= {"nsecond": 1e3, "usecond": 1, "msecond": 1e-3}.get(unit[metric], 1e3)
            if value is not None and key == "dram_read_MB":
                value /= {"byte": 1e6, "Kbyte": 1e3, "Mbyte": 1, "Gbyte": 1e-3}.get(
                    unit[metric], 1e6)
            row[key] = value
        stalls = {name[len(STALL):-len(STALL_END)]: number(cell[name]) for name in head
                  if name.startswith(STALL) and name.endswith(STALL_END)
                  and "not_issued" not in name}
        row["stalls"] = dict(sorted(((k, v) for k, v in stalls.items() if v), key=lambda kv:
                                    -kv[1])[:6])
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rows = rows_of(args.report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{'kernel':<40} {'us':>7} {'dram%':>6} {'MB':>7} {'GB/s':>6} {'sm%':>5} "
          f"{'occ%':>5} {'iss%':>5} {'regs':>4} {'grid':>5} {'waves':>5}  stalls per issue")
    for r in rows:
        gbps = (r["dram_read_MB"] or 0) / r["us"] * 1e3 if r["us"] else 0
        stalls = " ".join(f"{k}={v:.1f}" for k, v in r["stalls"].items())
        fmt = lambda v, w, p=1: f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"  # noqa: E731
        print(f"{r['kernel'][:40]:<40} {fmt(r['us'], 7)} {fmt(r['dram_pct'], 6)} "
              f"{fmt(r['dram_read_MB'], 7)} {gbps:6.0f} {fmt(r['sm_pct'], 5, 0)} "
              f"{fmt(r['occupancy_pct'], 5, 0)} {fmt(r['issue_pct'], 5, 0)} "
              f"{fmt(r['regs'], 4, 0)} {fmt(r['grid'], 5, 0)} {fmt(r['waves'], 5, 2)}  {stalls}")


if __name__ == "__main__":
    main()
