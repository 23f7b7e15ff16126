"""README's two commands are exactly what `.ci/run` runs, and the demo runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Install and test", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_readme_has_exactly_two_commands_and_ci_runs_them():
    commands = _readme_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for command in commands:
        assert command in ci, f"README command not run verbatim by .ci/run: {command}"


def test_demo_prints_types_and_the_accumulator_grid():
    out = subprocess.run(
        [sys.executable, "-m", "lowvm.demo"], capture_output=True, text=True, check=True
    ).stdout
    assert "float6_e3m2" in out
    assert " 8:  0:2  0:3  1:2  1:3" in out


def test_readme_stays_a_users_page():
    assert len((ROOT / "README.md").read_text()) <= 20_000


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:  # not a git checkout: nothing to scan
        return []
    return [ROOT / p for p in out.stdout.splitlines()
            if not p.startswith("benchmarks/results/") and (ROOT / p).is_file()]


def test_no_file_narrates_how_the_project_was_built():
    # the words are assembled so that this file does not match itself
    words = re.compile(r"\b(" + "ses" + r"sions?|NOTES\.md|DE" + r"SIGN\.md)\b|\.\./sha" + r"red\b"
                       r"|\bs1?[0-9]_[a-z]", re.I)
    hits = []
    for path in _tracked_text_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        hits += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in words.finditer(text)]
    assert not hits, hits[:20]
