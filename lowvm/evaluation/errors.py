"""Errors of the quality benchmark's library calls and options."""

from __future__ import annotations

from lowvm.errors import LowvmError

__all__ = ["EvaluationError"]


class EvaluationError(LowvmError, ValueError):
    """An argument of a :mod:`lowvm.evaluation` function (or option of its command) that it
    does not accept."""
