"""The CPU reference interpreter: every VM program's exact meaning, on any machine."""

from lowvm.interpreter.memory import InterpretError
from lowvm.interpreter.run import interpret, run_program

__all__ = ["interpret", "run_program", "InterpretError"]
