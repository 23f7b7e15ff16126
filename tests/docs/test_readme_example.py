"""The README's VM program runs as shown."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_vm_program_runs():
    text = README.read_text()
    section = text.split("## Write a VM program", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert len(code.strip().splitlines()) <= 30
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(code, str(README), "exec"), namespace)  # asserts inside the example
    assert "program vector_add" in str(namespace["vector_add"].build(block=512))
