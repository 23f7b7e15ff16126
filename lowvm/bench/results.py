"""Result rows and the JSON document a run writes under ``benchmarks/results/``.

Layout: ``benchmarks/results/<date>/<scenario>/<gpu-slug>.json`` (:func:`result_path`),
each document holding its rows and the environment that produced them (commit and
whether the tree was dirty, GPU, driver, torch, CUDA, NVRTC, transformers, Python, date,
the exact command: :mod:`lowvm.bench.environment`).

One row per (kernel, shape, M): the timing statistics and what follows from them by
:mod:`lowvm.bench.counting` (TFLOP/s, achieved GB/s, the HBM floor and the share of it
reached). A row that could not be measured keeps its place with ``status`` "failed"
(wrong result, error) or "skipped" (unsupported, too slow) and a ``note`` saying why,
so a table never silently loses a kernel. ``validate`` is the schema the plot step and
the tests rely on.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from lowvm.bench import counting
from lowvm.bench.errors import BenchError
from lowvm.runtime.timing import Timing

__all__ = [
    "SCHEMA",
    "STATUSES",
    "Row",
    "measured_row",
    "unmeasured_row",
    "document",
    "validate",
    "write",
    "load",
    "default_filename",
    "DEFAULT_ROOT",
    "gpu_slug",
    "result_path",
    "GEMM_KINDS",
]

SCHEMA = "lowvm.bench/2"
DEFAULT_ROOT = Path("benchmarks/results")
#: Document kinds whose rows are GEMM timings (:class:`Row`); the others hold the
#: outcome of a command (serving figures, test and sanitizer summaries).
GEMM_KINDS = ("gemm", "schedules")
STATUSES = ("ok", "failed", "skipped")
_META_KEYS = ("schema", "gpu", "date", "torch", "cuda", "hbm", "method", "rows")


@dataclass
class Row:
    """One kernel on one (K, N, M). Figures are ``None`` when not measured."""

    kernel: str               # e.g. "lowvm_int4_g128", "cublas_fp16", "tinygemm_int4_g128"
    family: str               # "lowvm" or "baseline"
    wtype: str                # "int4", "fp16", ...
    group: int                # 0 for dense weights
    k: int
    n: int
    m: int
    status: str               # one of STATUSES
    note: str = ""
    weight_bytes: int = 0     # weights + scales (+ zeros): the decode floor's bytes
    flops: int = 0
    floor_us: float = 0.0
    median_us: float | None = None
    min_us: float | None = None
    p10_us: float | None = None
    p90_us: float | None = None
    runs: int = 0
    tflops: float | None = None
    gbps: float | None = None
    pct_floor: float | None = None
    rel_err: float | None = None
    method: str = "write-flushed"   # a lowvm.runtime.timing.METHODS name
    copies: int = 0           # weight copies the calls cycled through (graph, eager)
    scenario: str = ""
    schedule: str = ""        # "schedules": "chosen" or its fields changed from the choice


def _base(kernel: str, family: str, wtype: str, fmt: counting.WeightFormat, k: int, n: int,
          m: int, hbm_tbps: float) -> dict[str, Any]:
    nbytes = fmt.total_bytes(k, n)
    return dict(kernel=kernel, family=family, wtype=wtype, group=fmt.group, k=k, n=n, m=m,
                weight_bytes=nbytes, flops=counting.flops(m, n, k),
                floor_us=counting.floor_us(nbytes, hbm_tbps))


def measured_row(kernel: str, family: str, wtype: str, fmt: counting.WeightFormat, k: int,
                 n: int, m: int, timing: Timing, hbm_tbps: float,
                 rel_err: float | None = None, note: str = "", **labels: Any) -> Row:
    """A row with its timing and every figure derived from it; ``labels`` are the
    method, copies, scenario and schedule fields."""
    base = _base(kernel, family, wtype, fmt, k, n, m, hbm_tbps)
    t = timing.median_us
    return Row(**base, status="ok", note=note, median_us=t, min_us=timing.min_us,
               p10_us=timing.p10_us, p90_us=timing.p90_us, runs=timing.runs,
               tflops=counting.achieved_tflops(m, n, k, t),
               gbps=counting.achieved_gbps(base["weight_bytes"], t),
               pct_floor=counting.percent_of_floor(base["weight_bytes"], t, hbm_tbps),
               rel_err=rel_err, **labels)


def unmeasured_row(kernel: str, family: str, wtype: str, fmt: counting.WeightFormat, k: int,
                   n: int, m: int, status: str, note: str, hbm_tbps: float,
                   rel_err: float | None = None, **labels: Any) -> Row:
    """A failed or skipped row: its counts, no timing, and why."""
    if status not in ("failed", "skipped"):
        raise BenchError(f"status={status!r}: an unmeasured row is 'failed' or 'skipped'")
    if not note:
        raise BenchError("note: a failed or skipped row must say why")
    return Row(**_base(kernel, family, wtype, fmt, k, n, m, hbm_tbps), status=status,
               note=note, rel_err=rel_err, **labels)


def document(rows: list[Row], *, gpu: str, date: str, torch_version: str,
             cuda_version: str | None, hbm: dict[str, Any], method: dict[str, Any],
             **extra: Any) -> dict[str, Any]:
    """The JSON document of one run."""
    doc: dict[str, Any] = {"schema": SCHEMA, "kind": "gemm", "gpu": gpu, "date": date,
                           "torch": torch_version, "cuda": cuda_version, "hbm": hbm,
                           "method": method}
    doc.update(extra)
    doc["rows"] = [asdict(r) for r in rows]
    return doc


_ROW_TYPES: dict[str, tuple[type, ...]] = {
    "kernel": (str,), "family": (str,), "wtype": (str,), "group": (int,), "k": (int,),
    "n": (int,), "m": (int,), "status": (str,), "note": (str,), "weight_bytes": (int,),
    "flops": (int,), "floor_us": (float, int), "runs": (int,), "method": (str,),
    "copies": (int,), "scenario": (str,), "schedule": (str,),
}
_OPTIONAL_FLOATS = ("median_us", "min_us", "p10_us", "p90_us", "tflops", "gbps",
                    "pct_floor", "rel_err")


def validate(doc: Any) -> None:
    """Raise :class:`BenchError` listing every way ``doc`` departs from the schema."""
    problems: list[str] = []
    if not isinstance(doc, dict):
        raise BenchError(f"results: expected a JSON object, got {type(doc).__name__}")
    if doc.get("kind", "gemm") not in GEMM_KINDS:
        _validate_outcome(doc)
        return
    for key in _META_KEYS:
        if key not in doc:
            problems.append(f"missing key {key!r}")
    if doc.get("schema") not in (None, SCHEMA):
        problems.append(f"schema {doc.get('schema')!r} is not {SCHEMA!r}")
    hbm = doc.get("hbm")
    if hbm is not None and not (isinstance(hbm, dict)
                                and isinstance(hbm.get("floor_tbps"), (int, float))):
        problems.append("hbm must be an object with a numeric 'floor_tbps'")
    rows = doc.get("rows")
    if rows is not None and not isinstance(rows, list):
        problems.append("rows must be a list")
        rows = []
    names = {f.name for f in fields(Row)}
    for i, row in enumerate(rows or []):
        if not isinstance(row, dict):
            problems.append(f"rows[{i}] is not an object")
            continue
        missing = names - set(row)
        if missing:
            problems.append(f"rows[{i}] lacks {sorted(missing)}")
        for key, types in _ROW_TYPES.items():
            if key in row and (not isinstance(row[key], types) or isinstance(row[key], bool)):
                problems.append(f"rows[{i}].{key}={row[key]!r} is not {types[0].__name__}")
        for key in _OPTIONAL_FLOATS:
            if row.get(key) is not None and not isinstance(row[key], (int, float)):
                problems.append(f"rows[{i}].{key}={row[key]!r} is not a number or null")
        status = row.get("status")
        if status not in STATUSES:
            problems.append(f"rows[{i}].status={status!r} is not one of {STATUSES}")
        elif status == "ok" and row.get("median_us") is None:
            problems.append(f"rows[{i}] is 'ok' but has no median_us")
        elif status != "ok" and not row.get("note"):
            problems.append(f"rows[{i}] is {status!r} but has no note saying why")
    if problems:
        raise BenchError("results do not follow the schema " + SCHEMA + ": "
                         + "; ".join(problems))


def _validate_outcome(doc: dict[str, Any]) -> None:
    """The schema of a command's outcome: who ran it, whether it passed, its rows."""
    problems = [f"missing key {key!r}" for key in ("schema", "kind", "scenario", "date",
                                                    "ok", "rows") if key not in doc]
    if "ok" in doc and not isinstance(doc["ok"], bool):
        problems.append(f"ok={doc['ok']!r} is not true or false")
    if "rows" in doc and not (isinstance(doc["rows"], list)
                              and all(isinstance(r, dict) for r in doc["rows"])):
        problems.append("rows must be a list of objects")
    if problems:
        raise BenchError("results do not follow the schema " + SCHEMA + ": "
                         + "; ".join(problems))


def gpu_slug(gpu: Any) -> str:
    """The GPU's name reduced to lower-case letters, digits and '-' (``nvidia-h100-80gb-hbm3``)."""
    return re.sub(r"[^A-Za-z0-9]+", "-", str(gpu or "")).strip("-").lower() or "gpu"


def _day(date: Any) -> str:
    match = re.match(r"\d{4}-\d{2}-\d{2}", str(date or ""))
    return match.group(0) if match else "undated"


def default_filename(doc: dict[str, Any]) -> str:
    """``<gpu-slug>.json``: the file name of a document inside its scenario's folder."""
    return f"{gpu_slug(doc.get('gpu'))}.json"


def result_path(doc: dict[str, Any], root: str | os.PathLike[str] = DEFAULT_ROOT) -> Path:
    """``<root>/<date>/<scenario>/<gpu-slug>.json`` for ``doc``."""
    scenario = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(doc.get("scenario") or "adhoc"))
    return Path(root) / _day(doc.get("date")) / scenario / default_filename(doc)


def write(doc: dict[str, Any], path: str | os.PathLike[str] = DEFAULT_ROOT) -> Path:
    """Validate and write ``doc``; ``path`` is a ``.json`` file, or a results root under
    which :func:`result_path` places it. The file is replaced atomically, so a crash
    never leaves half a document."""
    validate(doc)
    target = Path(path)
    if target.is_dir() or str(path).endswith(os.sep) or target.suffix != ".json":
        target = result_path(doc, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=target.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a results file."""
    p = Path(path)
    if not p.is_file():
        raise BenchError(f"results file {str(p)!r} does not exist")
    try:
        doc = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise BenchError(f"results file {str(p)!r} is not JSON: {exc}") from None
    validate(doc)
    return doc
