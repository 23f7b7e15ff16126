"""Errors a user can cause.

Every error lowvm raises on bad input is a :class:`LowvmError`, so callers can catch
one class; the subclasses also derive from the matching builtin (``ValueError``,
``TypeError``) so generic handlers keep working. Messages name the argument, the value
that was given and what would have been accepted.
"""

from __future__ import annotations

__all__ = [
    "LowvmError",
    "DTypeError",
    "LayoutError",
]


class LowvmError(Exception):
    """Base class of every error lowvm raises on user input."""


class DTypeError(LowvmError, ValueError):
    """An unknown or unsupported data type, or values a data type cannot hold."""


class LayoutError(LowvmError, ValueError):
    """A layout that cannot be built, or an index outside a layout."""
