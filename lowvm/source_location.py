"""Where, in the user's source, something happened: the innermost frame outside lowvm.

Errors carry these :class:`~lowvm.ir.SourceLoc` so that they point at the line the
user wrote (an instruction call while tracing, an ``interpret`` call), not into lowvm.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType

from lowvm.ir import SourceLoc

__all__ = ["user_location", "traceback_location"]

_LOWVM_DIR = os.path.dirname(os.path.abspath(__file__))


def _is_user_file(filename: str) -> bool:
    return not os.path.abspath(filename).startswith(_LOWVM_DIR + os.sep)


def _location(filename: str, lineno: int) -> SourceLoc:
    import linecache

    code = linecache.getline(filename, lineno)
    name = filename if filename.startswith("<") else os.path.relpath(os.path.abspath(filename))
    return SourceLoc(name, lineno, code.strip())


def user_location() -> SourceLoc | None:
    """The innermost stack frame outside the lowvm package: the line the user wrote."""
    frame = sys._getframe(1)
    while frame is not None:
        if _is_user_file(frame.f_code.co_filename):
            return _location(frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return None


def traceback_location(tb: TracebackType | None) -> SourceLoc | None:
    """The innermost frame of a traceback outside the lowvm package (where it was raised
    from the user's point of view)."""
    found = None
    while tb is not None:
        if _is_user_file(tb.tb_frame.f_code.co_filename):
            found = _location(tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return found
