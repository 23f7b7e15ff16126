"""Where ``quant_linear`` looks for a measured schedule before the built-in choice.

The kernels do not know the autotuner (it sits above them and imports them); whoever
composes the two registers a source with :func:`set_schedule_source` (``lowvm`` itself
registers :func:`lowvm.tune.lookup.tuned_schedule`, the tuning cache). This module
imports nothing, so registering it costs ``import lowvm`` nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["ScheduleSource", "set_schedule_source", "schedule_source"]

#: ``(m, weight) -> schedule or None``: a measured pick for batch ``m`` and a
#: :class:`~lowvm.kernels.weights.QuantWeight`, or None for the built-in choice
ScheduleSource = Callable[[int, Any], Any]

_SOURCE: list[ScheduleSource | None] = [None]


def set_schedule_source(source: ScheduleSource | None) -> ScheduleSource | None:
    """Make ``source`` the one ``quant_linear`` asks (None: built-in choices only);
    returns the one before."""
    before, _SOURCE[0] = _SOURCE[0], source
    return before


def schedule_source() -> ScheduleSource | None:
    """The registered source, or None."""
    return _SOURCE[0]
