"""Scenarios that run a command: the serving loop, quality, fuzzing, the GPU tests, the
sanitizers.

Each runs its command as a subprocess (output streamed to the terminal), then turns what
it left behind into a results document of the same layout as the GEMM tables: ``ok``
(did it pass), ``rows`` (serving figures, failing tests, sanitizer summaries) and the
environment. The parsers (:func:`parse_junit`, :func:`sanitizer_summary`) are pure and
tested on the CPU.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lowvm.bench.errors import BenchError
from lowvm.bench.results import SCHEMA
from lowvm.bench.scenarios import Scenario

__all__ = ["SANITIZER_TOOLS", "expand", "parse_junit", "sanitizer_summary",
           "find_sanitizer", "run_command_scenario"]

SANITIZER_TOOLS = ("memcheck", "racecheck")


def expand(command: Sequence[str], out: str | os.PathLike[str]) -> list[str]:
    """``command`` with ``{python}`` (this interpreter) and ``{out}`` (a scratch folder)."""
    return [part.replace("{python}", sys.executable).replace("{out}", str(out))
            for part in command]


def parse_junit(text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(totals, problems)`` of a JUnit XML report: totals of tests, failures, errors,
    skipped and seconds; one problem per failing or erroring test case."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise BenchError(f"junit: the report is not XML ({exc})") from None
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0, "seconds": 0.0}
    problems: list[dict[str, Any]] = []
    for suite in suites:
        for key in ("tests", "failures", "errors", "skipped"):
            totals[key] += int(suite.get(key, 0))
        totals["seconds"] += float(suite.get("time", 0.0))
        for case in suite.iter("testcase"):
            for outcome in ("failure", "error"):
                found = case.find(outcome)
                if found is not None:
                    problems.append({"test": f"{case.get('classname', '')}::"
                                             f"{case.get('name', '')}",
                                     "outcome": outcome,
                                     "message": (found.get("message") or "")[:300]})
    totals["seconds"] = round(totals["seconds"], 1)
    totals["passed"] = (totals["tests"] - totals["failures"] - totals["errors"]
                        - totals["skipped"])
    return totals, problems


_SUMMARY = re.compile(r"=+\s*(ERROR|RACECHECK) SUMMARY:\s*(\d+)\s*(\w+)")


def sanitizer_summary(text: str) -> dict[str, Any]:
    """The last summary line compute-sanitizer printed: ``{"count", "what", "line"}``
    (``count`` None when there is none, e.g. the target crashed first)."""
    found = _SUMMARY.findall(text)
    lines = [line for line in text.splitlines() if _SUMMARY.search(line)]
    if not found:
        return {"count": None, "what": "", "line": ""}
    _, count, what = found[-1]
    return {"count": int(count), "what": what, "line": lines[-1].strip()}


def find_sanitizer() -> str | None:
    """``compute-sanitizer`` from PATH or the usual toolkit folder."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for folder in ("/usr/local/cuda/bin", "/usr/local/cuda/compute-sanitizer"):
        path = Path(folder) / "compute-sanitizer"
        if path.is_file():
            return str(path)
    return None


def _run(cmd: list[str], log_path: Path | None = None) -> tuple[int, str]:
    """Run ``cmd``; returns (exit status, its combined output), echoing the output."""
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stderr.write(proc.stdout[-20000:])
    if log_path is not None:
        log_path.write_text(proc.stdout)
    return proc.returncode, proc.stdout


def _json_result(sc: Scenario, out: Path, file: str, key: str
                 ) -> tuple[bool, list[dict[str, Any]], dict[str, Any]]:
    """Run the command; its ``{out}/<file>`` holds ``rows`` (and, beside them, the
    command's own summary, kept under ``key``; an ``ok`` there must be true too)."""
    cmd = expand(sc.command, out)
    rc, text = _run(cmd)
    extra: dict[str, Any] = {"exit_status": rc, "argv": cmd[1:]}
    path = out / file
    if not path.is_file():
        extra["note"] = f"the command wrote no {file} (exit {rc}): {text[-300:]}"
        return False, [], extra
    data = json.loads(path.read_text())
    rows = data.get("rows") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        rows = [data]
    ok = rc == 0
    if isinstance(data, dict):
        extra[key] = {k: v for k, v in data.items() if k != "rows"}
        ok = ok and data.get("ok", True) is True
    return ok, [r for r in rows if isinstance(r, dict)], extra


def _serving(sc: Scenario, out: Path) -> tuple[bool, list[dict[str, Any]], dict[str, Any]]:
    return _json_result(sc, out, "serving.json", "serving")


def _json(sc: Scenario, out: Path) -> tuple[bool, list[dict[str, Any]], dict[str, Any]]:
    return _json_result(sc, out, "result.json", "summary")


def _pytest(sc: Scenario, out: Path) -> tuple[bool, list[dict[str, Any]], dict[str, Any]]:
    cmd = expand(sc.command, out)
    rc, text = _run(cmd)
    junit = out / "junit.xml"
    if not junit.is_file():
        return False, [], {"exit_status": rc, "note": f"pytest wrote no report: {text[-300:]}"}
    totals, problems = parse_junit(junit.read_text())
    return rc == 0, problems, {"exit_status": rc, "totals": totals}


def _sanitizers(sc: Scenario, out: Path) -> tuple[bool, list[dict[str, Any]], dict[str, Any]]:
    tool = find_sanitizer()
    if tool is None:
        return False, [], {"note": "compute-sanitizer is not installed (PATH, "
                                   "/usr/local/cuda/bin)"}
    rows, ok = [], True
    for name in SANITIZER_TOOLS:
        cmd = [tool, "--tool", name, "--report-api-errors", "no", "--error-exitcode", "9",
               *expand(sc.command, out)]
        rc, text = _run(cmd, out / f"{name}.log")
        summary = sanitizer_summary(text)
        passed = rc == 0 and summary["count"] == 0
        ok = ok and passed
        rows.append({"tool": name, "exit_status": rc, "passed": passed, **summary})
    return ok, rows, {}


_RUNNERS = {"serving": _serving, "json": _json, "pytest": _pytest, "sanitizers": _sanitizers}


def run_command_scenario(sc: Scenario, argv: list[str] | None = None) -> dict[str, Any]:
    """Run a subprocess scenario and return its results document."""
    from lowvm.bench.environment import collect

    if sc.kind not in _RUNNERS:
        raise BenchError(f"scenario {sc.name!r}: kind {sc.kind!r} runs no command")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"lowvm-bench-{sc.name}-") as scratch:
        ok, rows, extra = _RUNNERS[sc.kind](sc, Path(scratch))
    env = collect(argv)
    doc: dict[str, Any] = {"schema": SCHEMA, "kind": sc.kind, "scenario": sc.name,
                           "gpu": env["gpu"], "date": env["date"],
                           "environment": env["environment"],
                           "command": list(sc.command), "ok": ok, **extra, "rows": rows,
                           "wall_s": round(time.perf_counter() - started, 1)}
    return doc
