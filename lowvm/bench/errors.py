"""The error the benchmark harness raises for bad arguments or unusable inputs."""

from __future__ import annotations

from lowvm.errors import LowvmError

__all__ = ["BenchError"]


class BenchError(LowvmError, ValueError):
    """A benchmark argument (shape, dtype, group, M, results file) that cannot be used."""
