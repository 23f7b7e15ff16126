"""Lines of a test file found by a ``# <- mark`` comment, so tests of reported source lines
need no hard-coded line numbers."""

from __future__ import annotations


def marked_line(path: str, mark: str) -> int:
    """The line of ``path`` that ends with ``# <- mark`` (exactly one must)."""
    with open(path) as f:
        found = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# <- {mark}")]
    assert len(found) == 1, f"mark {mark!r} found {len(found)} times in {path}"
    return found[0]
