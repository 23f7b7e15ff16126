"""The lowering passes, in the order they run (one job per file).

Each pass is a function ``Program -> Program`` that rebuilds, never mutates, and whose
module docstring states what it guarantees. :func:`run_passes` runs them all;
``LOWVM_DEBUG=1`` prints the program after each one.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from lowvm.ir import Program
from lowvm.passes.instruction_selection import select_instructions
from lowvm.passes.layout_inference import infer_layouts
from lowvm.passes.rewrite import map_instructions, map_statements
from lowvm.passes.software_pipeline import pipeline_loops
from lowvm.passes.vectorize import vectorize
from lowvm.passes.verify import verify

__all__ = ["PIPELINE", "run_passes", "map_instructions", "map_statements"]

Pass = Callable[[Program], Program]

#: (name, pass) in execution order. Later passes may rely on earlier guarantees.
PIPELINE: list[tuple[str, Pass]] = [
    ("verify", verify),
    ("layout_inference", infer_layouts),
    ("software_pipeline", pipeline_loops),  # before the passes that plan memory accesses
    ("vectorize", vectorize),
    ("instruction_selection", select_instructions),
]


def run_passes(program: Program, upto: str | None = None) -> Program:
    """Run :data:`PIPELINE` on ``program`` (stopping after the pass named ``upto``)."""
    debug = int(os.environ.get("LOWVM_DEBUG", "0") or 0)
    for name, fn in PIPELINE:
        program = fn(program)
        if debug >= 1:
            print(f"// ---- after {name} ----\n{program}")
        if name == upto:
            break
    return program
