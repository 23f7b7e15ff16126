"""``python -m lowvm.bench.ncu_profile``: what bounds each GEMM cell, from Nsight Compute.

Why it exists: a timing says how fast a kernel is, not what keeps it from going faster.
For each (shape, M) this runs lowvm's int4 g128 kernel, cuBLAS float16 and, where its
source or package is at hand (``MARLIN_SRC``), the original Marlin once each under
``ncu`` and reports per kernel: its time, DRAM throughput (% of peak, and bytes moved over
the time, read and written), SM throughput, the busiest pipe (cycles active), achieved
occupancy, registers, grid, L2 hit rate and the three largest warp-stall reasons (cycles
per issued instruction).

How: the parent runs ``ncu --clock-control none --profile-from-start off`` with the
sections below over ``python -m lowvm.bench.ncu_profile --child``. The child prepares
every kernel and warms it up outside the profiled range, then, for each cell and kernel,
profiles a marker kernel (``torch.cuda._sleep``) and one call; the order goes to a
manifest. The parent exports the report's raw page (``--csv --page raw --print-units
base``), cuts the launches at the markers and pairs each group with the manifest. ncu
flushes the caches before each replayed pass (its default), so every call reads its
weight from DRAM as a decode step does. The parsing and grouping are plain Python, tested
without a GPU.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lowvm.bench.table import format_table as aligned_table

__all__ = ["SECTIONS", "MARKER", "ncu_command", "parse_raw_csv", "group_launches",
           "summarize_launches", "format_table", "parse_args", "main"]

#: the Nsight Compute sections collected (each kernel is replayed once per pass they need)
SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis",
            "Occupancy", "LaunchStats", "WarpStateStats")
#: the marker kernel's name (``torch.cuda._sleep``), profiled before each measured call
MARKER = "spin_kernel"
DEFAULT_SHAPES = ("4096,6144", "4096,28672", "8192,10240")
DEFAULT_MS = "1,16,256,4096"

_DURATION = "gpu__time_duration.sum"
_SCALARS = {  # column in the row -> ncu metrics, the first one present wins
    "dram_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                 "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "sm_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "l2_hit_pct": ("lts__t_sector_hit_rate.pct",),
    "registers": ("launch__registers_per_thread",),
    "grid": ("launch__grid_size",),
    "block": ("launch__block_size",),
}
_COUNTS = ("registers", "grid", "block")
_DRAM_RATE = "dram__bytes.sum.per_second"  # bytes read and written per second
_PIPE = re.compile(r"^sm__pipe_(\w+)_cycles_active\.avg\.pct_of_peak_sustained_active$")
#: pipes that sum others (on the H100 "shared" and "tensor" read as tensor_op_hmma does)
_AGGREGATE_PIPES = ("shared", "tensor")
#: the units the parser reads these metrics in (``--print-units base``)
_UNITS = {_DURATION: "ns", _DRAM_RATE: "byte/s"}
_STALL = re.compile(r"^smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)"
                    r"(?:_per_issue_active)?\.ratio$")


class ProfileError(RuntimeError):
    """ncu is missing, failed, or its report does not match the launches made."""


# ------------------------------------------------------------------------------------
# The report: parsing and grouping (no GPU)

def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    if not text or text in ("n/a", "N/A"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_raw_csv(text: str) -> list[dict[str, str]]:
    """ncu's raw page as one dict per launch (the units row, the second, is dropped)."""
    lines = [line for line in text.splitlines() if not line.startswith("==")]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 2:
        raise ProfileError("ncu's raw page has no launches")
    header, units = rows[0], dict(zip(rows[0], rows[1], strict=False))
    for metric, unit in _UNITS.items():
        if metric in units and units[metric] != unit:
            raise ProfileError(f"ncu's raw page gives {metric} in {units[metric]!r}, not "
                               f"{unit!r}: export it with --print-units base")
    short = [i for i, row in enumerate(rows[2:]) if len(row) != len(header)]
    if short:
        raise ProfileError(f"ncu's raw page: launch row {short[0]} has a different number "
                           f"of columns than the header ({len(header)})")
    return [dict(zip(header, row, strict=True)) for row in rows[2:]]


def group_launches(launches: Sequence[dict[str, str]], calls: int) -> list[list[dict[str, str]]]:
    """The launches after each marker, one group per measured call (``calls`` of them)."""
    groups: list[list[dict[str, str]]] = []
    for launch in launches:
        if MARKER in launch.get("Kernel Name", ""):
            groups.append([])
        elif groups:
            groups[-1].append(launch)
    if len(groups) != calls or any(not g for g in groups):
        raise ProfileError(f"ncu's report has {len(groups)} marked groups "
                           f"({sum(1 for g in groups if not g)} empty) for {calls} calls")
    return groups


def summarize_launches(group: Sequence[dict[str, str]]) -> dict[str, Any]:
    """One call's figures: its total time and the counters of its longest launch."""
    durations = [_number(g.get(_DURATION, "")) or 0.0 for g in group]
    main = group[max(range(len(group)), key=durations.__getitem__)]
    ns = sum(durations)
    row: dict[str, Any] = {"launches": len(group), "time_us": round(ns / 1e3, 2),
                           "kernel_name": main.get("Kernel Name", "")[:60]}
    for key, metrics in _SCALARS.items():
        value = next((v for m in metrics if (v := _number(main.get(m, ""))) is not None), None)
        if value is not None:
            value = int(value) if key in _COUNTS else round(value, 1)
        row[key] = value
    moved = sum((_number(g.get(_DRAM_RATE, "")) or 0.0) * d * 1e-9
                for g, d in zip(group, durations, strict=True))
    row["dram_mb"] = round(moved / 1e6, 2)
    row["dram_tbps"] = round(moved / ns / 1e3, 2) if ns else None
    pipes = {m.group(1): v for k, t in main.items()
             if (m := _PIPE.match(k)) and m.group(1) not in _AGGREGATE_PIPES
             and (v := _number(t)) is not None}
    if pipes:
        best = max(pipes, key=pipes.__getitem__)
        row["top_pipe"] = f"{best} {pipes[best]:.0f}%"
    stalls = {m.group(1): v for k, t in main.items()  # "selected": issuing, not a stall
              if (m := _STALL.match(k)) and m.group(1) != "selected"
              and (v := _number(t)) is not None}
    row["top_stalls"] = ", ".join(f"{name} {value:.1f}" for name, value in
                                  sorted(stalls.items(), key=lambda kv: -kv[1])[:3])
    return row


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows' main columns as the harness's aligned table."""
    cols = ("shape", "m", "kernel", "time_us", "dram_pct", "dram_tbps", "sm_pct", "top_pipe",
            "occupancy_pct", "registers", "grid", "top_stalls")
    return aligned_table(cols, ([r.get(c) for c in cols] for r in rows))


# ------------------------------------------------------------------------------------
# Running ncu (the parent) and the calls (the child)

def ncu_command(ncu: str, report: str, child: Sequence[str]) -> list[str]:
    """The profiling command: clocks left alone, only the marked range, the sections."""
    cmd = [ncu, "--clock-control", "none", "--profile-from-start", "off", "--force-overwrite",
           "-o", report]
    for section in SECTIONS:
        cmd += ["--section", section]
    return cmd + list(child)


def _child(args: argparse.Namespace) -> int:
    """Prepare, warm up, then profile a marker and one call per (shape, M, kernel)."""
    import torch

    from lowvm.bench.candidates import build_candidates
    from lowvm.bench.shapes import parse_shapes
    from lowvm.dtypes import dtype as as_dtype

    manifest: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    gen = torch.Generator(device="cuda")
    cudart = torch.cuda.cudart()
    for shape in parse_shapes(args.shape):
        gen.manual_seed(args.seed)
        weight = (torch.randn(shape.n, shape.k, device="cuda", generator=gen)
                  / math.sqrt(shape.k)).to(torch.float16)
        ready, missing = build_candidates(weight, (as_dtype("int4"),), (128,),
                                          ("cublas_fp16",), optional=("marlin",))
        skipped += [{"shape": str(shape), "kernel": u.kernel, "note": u.note} for u in missing]
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, shape.k, device="cuda", generator=gen).to(torch.float16)
            for c in ready:
                xin = x.to(c.act_dtype)
                for _ in range(3):  # compile, autotune, lazy loads: outside the range
                    c.fn(xin)
                torch.cuda.synchronize()
                cudart.cudaProfilerStart()
                torch.cuda._sleep(1000)
                c.fn(xin)
                torch.cuda.synchronize()
                cudart.cudaProfilerStop()
                manifest.append({"shape": str(shape), "k": shape.k, "n": shape.n, "m": m,
                                 "kernel": c.kernel})
        del ready, weight
        torch.cuda.empty_cache()
    Path(args.child).write_text(json.dumps({"calls": manifest, "skipped": skipped}))
    return 0


def _ncu() -> str:
    found = shutil.which("ncu")
    if found:
        return found
    for root in ("/usr/local/cuda/bin", "/opt/nvidia/nsight-compute"):
        # the newest Nsight Compute first (versioned folders sort by name)
        for path in (sorted(Path(root).glob("**/ncu"), reverse=True)
                     if Path(root).exists() else ()):
            if os.access(path, os.X_OK):
                return str(path)
    raise ProfileError("Nsight Compute's 'ncu' is not on PATH (nor under /usr/local/cuda "
                       "or /opt/nvidia/nsight-compute); install Nsight Compute")


def _run(cmd: Sequence[str], what: str) -> str:
    done = subprocess.run(list(cmd), capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise ProfileError(f"{what} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def profile(args: argparse.Namespace) -> dict[str, Any]:
    ncu = _ncu()
    with tempfile.TemporaryDirectory(prefix="lowvm-ncu-") as tmp:
        manifest_path = Path(tmp) / "calls.json"
        report = str(Path(tmp) / "profile")
        child = [sys.executable, "-m", "lowvm.bench.ncu_profile", "--child",
                 str(manifest_path), "--m", args.m, "--seed", str(args.seed)]
        for shape in args.shape or DEFAULT_SHAPES:
            child += ["--shape", shape]
        print("profiling under ncu (each kernel replayed once per counter pass) ...",
              flush=True)
        _run(ncu_command(ncu, report, child), "ncu")
        raw = _run([ncu, "--import", report + ".ncu-rep", "--csv", "--page", "raw",
                    "--print-units", "base"], "ncu --import")
        if args.keep_csv:
            Path(args.keep_csv).write_text(raw)
        manifest = json.loads(manifest_path.read_text())
    calls = manifest["calls"]
    groups = group_launches(parse_raw_csv(raw), len(calls))
    rows = [{**call, **summarize_launches(group)} for call, group in zip(calls, groups,
                                                                         strict=True)]
    return {"rows": rows, "skipped": manifest["skipped"], "sections": list(SECTIONS),
            "ok": bool(rows)}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lowvm.bench.ncu_profile",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", action="append",
                   help=f"K,N (repeatable; default {' and '.join(DEFAULT_SHAPES)})")
    p.add_argument("--m", default=DEFAULT_MS, help=f"token counts (default {DEFAULT_MS})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="where the rows are written")
    p.add_argument("--keep-csv", help="also write ncu's raw page (CSV) here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("lowvm.bench.ncu_profile: needs a CUDA device (torch.cuda.is_available() is "
              "False); run it on the GPU machine", file=sys.stderr)
        return 2
    if args.child:
        return _child(args)
    try:
        result = profile(args)
    except ProfileError as exc:
        print(f"lowvm.bench.ncu_profile: {exc}", file=sys.stderr)
        return 1
    print(format_table(result["rows"]))
    for s in result["skipped"]:
        print(f"skipped {s['kernel']} at {s['shape']}: {s['note']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
