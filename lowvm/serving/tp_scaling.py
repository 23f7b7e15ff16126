"""Tensor-parallel scaling in one command: :mod:`lowvm.serving.tp_bench` at TP = 1, 2, 4.

``python -m lowvm.serving.tp_scaling --config llama3-70b --tp 1,2,4 --dtype int4,float16
--batch-sizes 1,16 --json OUT`` launches ``torchrun --standalone --nproc-per-node TP -m
lowvm.serving.tp_bench ...`` once per TP (a TP larger than the GPUs present gets a row
that says so), gathers every row into one document and adds the ratios the tensor-parallel
goals are stated in: int4 decode tok/s at TP = t over TP = 1 (``scaling``), and int4 over
float16 at the same TP and batch (``vs_float16``). Why a driver and not one torchrun: a
process group has one size, and the three sizes must run on the same machine, one after
the other, for the ratios to mean anything. ``OUT`` is rewritten after each TP, so a run
cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lowvm.serving.errors import ServingError

__all__ = ["tp_command", "summarise", "main"]

#: the goals of the tensor-parallel benchmark: int4 TP = 2 over TP = 1 at batch 1, and
#: int4 over float16 at the same TP
GOALS = {"int4_tp2_over_tp1_batch1": 1.7, "int4_over_float16": 2.5}


def tp_command(tp: int, bench_args: Sequence[str], json_path: str) -> list[str]:
    """The torchrun command of one TP (``python -m torch.distributed.run``: the same
    interpreter as this one)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={tp}", "-m", "lowvm.serving.tp_bench", *bench_args,
            "--json", json_path]


def _tok_s(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, int, int], float]:
    return {(r["dtype"], r["tp"], r["batch"]): r["tok_s"] for r in rows if r.get("tok_s")}


def summarise(rows: Sequence[dict[str, Any]], quantized: str = "int4") -> dict[str, Any]:
    """The ratios behind the goals, from the rows of every TP: ``scaling`` (``quantized``
    tok/s at each TP over TP = 1, per batch), ``vs_float16`` (``quantized`` over float16
    at the same TP and batch), and ``goals`` (each goal's value, target and whether it is
    met; None where a row it needs is missing)."""
    tok = _tok_s(rows)
    scaling = {f"tp{tp}_batch{b}": round(v / tok[(quantized, 1, b)], 3)
               for (d, tp, b), v in sorted(tok.items())
               if d == quantized and tp > 1 and (quantized, 1, b) in tok}
    vs_fp16 = {f"tp{tp}_batch{b}": round(v / tok[("float16", tp, b)], 3)
               for (d, tp, b), v in sorted(tok.items())
               if d == quantized and ("float16", tp, b) in tok}
    tp2 = scaling.get("tp2_batch1")
    goals = {
        f"{quantized}_tp2_over_tp1_batch1": {
            "value": tp2, "target": GOALS["int4_tp2_over_tp1_batch1"],
            "met": None if tp2 is None else tp2 >= GOALS["int4_tp2_over_tp1_batch1"]},
        f"{quantized}_over_float16": {
            "value": min(vs_fp16.values()) if vs_fp16 else None,
            "target": GOALS["int4_over_float16"],
            "met": (None if not vs_fp16 else
                    min(vs_fp16.values()) >= GOALS["int4_over_float16"])},
    }
    return {"scaling": scaling, "vs_float16": vs_fp16, "goals": goals}


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(prog="python -m lowvm.serving.tp_scaling",
                                description=__doc__.split("\n\n")[0],
                                epilog="Other options go to lowvm.serving.tp_bench as they are "
                                       "(--config, --dtype, --batch-sizes, --layers, ...).")
    p.add_argument("--tp", default="1,2,4", help="comma list of tensor-parallel sizes")
    p.add_argument("--json", required=True, help="where the combined document is written")
    p.add_argument("--timeout", type=float, default=900.0,
                   help="seconds one TP's run may take (default 900)")
    args, rest = p.parse_known_args(argv)
    try:
        args.sizes = [int(t) for t in args.tp.split(",") if t.strip()]
    except ValueError:
        raise ServingError(f"tp_scaling: --tp {args.tp!r} is not a comma list of integers "
                           "(e.g. 1,2,4)") from None
    if not args.sizes or any(t < 1 for t in args.sizes):
        raise ServingError(f"tp_scaling: --tp {args.tp!r}: sizes must be integers >= 1")
    if "--json" in rest or any(a.startswith("--json=") for a in rest):
        raise ServingError("tp_scaling: --json is given once, for the combined document")
    return args, rest


def _write(path: str, doc: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    Path(tmp).write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def _run_tp(tp: int, rest: Sequence[str], timeout: float, cpu: bool
            ) -> tuple[dict[str, Any] | None, str]:
    """One TP's tp_bench document (None when it wrote none) and what went wrong."""
    with tempfile.TemporaryDirectory(prefix="lowvm-tp-") as scratch:
        path = os.path.join(scratch, "tp.json")
        cmd = tp_command(tp, rest, path)
        env = dict(os.environ)
        if cpu:
            env.setdefault("OMP_NUM_THREADS", "1")
        print(f"[tp_scaling] TP={tp}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        try:
            proc = subprocess.run(cmd, timeout=timeout, env=env)
            problem = "" if proc.returncode == 0 else f"exit status {proc.returncode}"
        except subprocess.TimeoutExpired:
            problem = f"timed out after {timeout:.0f} s"
        doc = json.loads(Path(path).read_text()) if os.path.isfile(path) else None
        return doc, problem


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run every TP; returns (and writes to ``--json``) the combined document."""
    args, rest = _parse(argv)
    cpu = "--device=cpu" in rest or any(a == "--device" and b == "cpu"
                                        for a, b in zip(rest, rest[1:]))
    gpus = None if cpu else _gpu_count()
    doc: dict[str, Any] = {"ok": False, "tp_sizes": args.sizes, "bench_args": rest,
                           "gpus": gpus, "runs": [], "rows": []}
    started = time.perf_counter()
    for tp in args.sizes:
        run: dict[str, Any] = {"tp": tp}
        if gpus is not None and tp > gpus:
            run["skipped"] = f"TP={tp} needs {tp} GPUs; this machine has {gpus}"
        else:
            t0 = time.perf_counter()
            result, problem = _run_tp(tp, rest, args.timeout, cpu)
            run["seconds"] = round(time.perf_counter() - t0, 1)
            if problem:
                run["error"] = problem
            if result is not None:
                run["environment"] = result.get("environment")
                doc.setdefault("shape", result.get("shape"))
                doc.setdefault("settings", result.get("settings"))
                doc["rows"].extend(result.get("rows") or [])
                if not result.get("ok"):
                    run.setdefault("error", "a row failed (see its error)")
            else:
                run.setdefault("error", "it wrote no results")
        doc["runs"].append(run)
        doc.update(summarise(doc["rows"]))
        doc["wall_s"] = round(time.perf_counter() - started, 1)
        doc["ok"] = (all("error" not in r for r in doc["runs"])
                     and any("skipped" not in r for r in doc["runs"]))
        _write(args.json, doc)
    _print_table(doc)
    return doc


def _print_table(doc: dict[str, Any]) -> None:
    print(f"{'dtype':>8} {'tp':>3} {'batch':>5} {'tok/s':>9} {'step ms':>8} "
          f"{'GiB/GPU':>8} {'all-reduce ms (graph)':>21}")
    for r in doc["rows"]:
        if r.get("tok_s"):
            print(f"{r['dtype']:>8} {r['tp']:>3} {r['batch']:>5} {r['tok_s']:>9.1f} "
                  f"{r['step_ms']:>8.2f} {r.get('mem_gib_per_gpu') or 0:>8.1f} "
                  f"{r.get('allreduce_graph_ms_per_step') or 0:>21.3f}")
        else:
            print(f"{r['dtype']:>8} {r['tp']:>3} {r['batch']:>5} "
                  f"{r.get('skipped') or r.get('error', '')}")
    for name, goal in doc.get("goals", {}).items():
        print(f"goal {name}: {goal['value']} (target {goal['target']}, met: {goal['met']})")


if __name__ == "__main__":
    sys.exit(0 if main()["ok"] else 1)
