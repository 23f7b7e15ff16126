"""The results table: speed against float16 at the same batch and mode, then memory and
quality per model; of one run's results or of several ``--json`` files merged."""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["format_table", "load_results"]


def load_results(paths: list[str]) -> dict[str, Any]:
    """Several ``--json`` results as one: speed rows and models of all of them."""
    merged: dict[str, Any] = {"models": {}, "speed": [], "errors": [], "sources": paths}
    for path in paths:
        with open(path) as f:
            result = json.load(f)
        for name, info in result.get("models", {}).items():
            merged["models"].setdefault(name, info)
        merged["speed"] += result.get("speed", [])
        merged["errors"] += result.get("errors", [])
        merged.setdefault("device", result.get("device"))
    return merged


def _num(value: Any, fmt: str) -> str:
    if not isinstance(value, (int, float)) or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, fmt)


def _fused(row: dict[str, Any]) -> str:
    """yes/no, or '-' for rows of runs from before the option existed."""
    return {True: "yes", False: "no"}.get(row.get("fused"), "-")  # type: ignore[arg-type]


def format_table(result: dict[str, Any]) -> str:
    """Speed rows with the speed-up over float16 at the same batch and mode, and memory and
    quality per model."""
    ref = {(r["batch"], r["mode"]): r for r in result["speed"]
           if r["model"] == "float16" and "decode_tokens_per_s" in r}
    head = (f"{'model':12s} {'batch':>5s} {'mode':6s} {'decode tok/s':>12s} {'x fp16':>7s} "
            f"{'e2e tok/s':>10s} {'x fp16':>7s} {'fwd ms':>7s} {'1st call s':>10s} "
            f"{'breaks':>6s} {'cg skips':>8s} {'fused':>5s} {'attn':>5s}")
    lines = [f"device: {result.get('device')}", head, "-" * len(head)]
    for r in sorted(result["speed"], key=lambda r: (r["batch"], r["mode"])):
        if "decode_tokens_per_s" not in r:
            why = r.get("skipped") or r.get("error", "")
            lines.append(f"{r['model']:12s} {r['batch']:5d} {r['mode']:6s} not measured: "
                         f"{why[:60]}")
            continue
        base = ref.get((r["batch"], r["mode"]))
        x_dec = x_e2e = None
        if base is not None:
            x_dec = r["decode_tokens_per_s"] / base["decode_tokens_per_s"]
            x_e2e = r["e2e_tokens_per_s"] / base["e2e_tokens_per_s"]
        lines.append(
            f"{r['model']:12s} {r['batch']:5d} {r['mode']:6s} "
            f"{_num(r['decode_tokens_per_s'], '12.1f')} {_num(x_dec, '7.2f')} "
            f"{_num(r['e2e_tokens_per_s'], '10.1f')} {_num(x_e2e, '7.2f')} "
            f"{_num(r.get('forward_ms'), '7.2f')} {_num(r.get('first_call_s'), '10.1f')} "
            f"{_num(r.get('graph_breaks'), '6d')} {_num(r.get('cudagraph_skips'), '8d')} "
            f"{_fused(r):>5s} {r.get('attention', 'sdpa'):>5s}")
    lines += ["", f"{'model':12s} {'stored MiB':>10s} {'resident MiB':>12s} "
              f"{'rel err (last logits)':>22s} {'top-1 agree':>11s} "
              f"{'layer rel err median':>20s} {'max':>6s}"]
    for name, info in result["models"].items():
        wb = info.get("weight_bytes", {})
        q = info.get("quality", {})
        stored = wb.get("stored", math.nan) / 2**20
        resident = wb.get("resident", math.nan) / 2**20
        lines.append(f"{name:12s} {_num(stored, '10.1f')} {_num(resident, '12.1f')} "
                     f"{_num(q.get('last_logits_rel_error'), '22.4f')} "
                     f"{_num(q.get('top1_agreement'), '11.3f')} "
                     f"{_num(q.get('layer_rel_error_median'), '20.4f')} "
                     f"{_num(q.get('layer_rel_error_max'), '6.3f')}")
    if result.get("errors"):
        lines.append(f"{len(result['errors'])} error(s): see 'errors' in the JSON")
    return "\n".join(lines)
