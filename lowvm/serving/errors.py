"""Errors of the serving measurement's library calls (bad presets, shape fields)."""

from __future__ import annotations

from lowvm.errors import LowvmError

__all__ = ["ServingError"]


class ServingError(LowvmError, ValueError):
    """An argument of a :mod:`lowvm.serving` function that it does not accept."""
