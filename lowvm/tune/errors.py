"""The error the tuner raises for bad schedules, problems or cache files."""

from __future__ import annotations

from lowvm.errors import LowvmError

__all__ = ["TuneError"]


class TuneError(LowvmError, ValueError):
    """A schedule, problem, cache file or measurement the tuner cannot use."""
