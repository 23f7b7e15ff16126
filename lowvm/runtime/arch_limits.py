"""What one thread block may use on each GPU architecture, known before anything runs.

A kernel asking for more shared memory than its target allows compiles fine and fails
only at launch, on that GPU. The limits are fixed per compute capability (the CUDA
Programming Guide's table of technical specifications, "maximum amount of shared memory
per thread block", the opt-in limit a kernel reaches through
``cudaFuncAttributeMaxDynamicSharedMemorySize``), so :func:`lowvm.compile` checks them
for the arch it compiles for, with or without a GPU.
"""

from __future__ import annotations

import re

__all__ = ["SHARED_BYTES_PER_BLOCK", "shared_bytes_limit"]

_KIB = 1024

#: the most shared memory (dynamic plus static) one block may use, per ``sm_XY``
SHARED_BYTES_PER_BLOCK: dict[str, int] = {
    "sm_70": 96 * _KIB,
    "sm_72": 96 * _KIB,
    "sm_75": 64 * _KIB,
    "sm_80": 163 * _KIB,
    "sm_86": 99 * _KIB,
    "sm_87": 163 * _KIB,
    "sm_89": 99 * _KIB,
    "sm_90": 227 * _KIB,
    "sm_100": 227 * _KIB,
    "sm_103": 227 * _KIB,
    "sm_110": 227 * _KIB,
    "sm_120": 99 * _KIB,
    "sm_121": 99 * _KIB,
}


def shared_bytes_limit(arch: str) -> int | None:
    """The per-block shared memory limit of ``arch`` (``sm_90a`` and ``sm_100f`` count as
    their base arch), or None for an arch not in the table (the launch still checks)."""
    match = re.fullmatch(r"(sm_\d+)[af]?", arch)
    return SHARED_BYTES_PER_BLOCK.get(match.group(1)) if match else None
