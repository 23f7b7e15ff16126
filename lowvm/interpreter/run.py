"""Run a VM program on the CPU, block after block, with exact semantics.

``interpret(program, *args)`` binds pointer parameters to the caller's numpy arrays or
CPU torch tensors (written in place, as a kernel would) and scalar parameters to Python
numbers, evaluates the grid, and executes the body once per block.
"""

from __future__ import annotations

import itertools
from typing import Any

from lowvm.dtypes import DType
from lowvm.errors import LowvmError
from lowvm.interpreter.memory import GlobalBuffer, bind_pointer
from lowvm.interpreter.state import BlockState
from lowvm.ir import (
    ForStmt,
    IfStmt,
    InstStmt,
    LetStmt,
    PointerType,
    Program,
    ProgramError,
    SeqStmt,
    Stmt,
)
from lowvm.source_location import user_location

__all__ = ["interpret", "run_program"]


def _execute(stmt: Stmt, st: BlockState) -> None:
    if isinstance(stmt, InstStmt):
        try:
            if st.pending_operands or st.pending_results:
                st.check_not_pending(stmt.inst)
            stmt.inst.interpret(st)
        except LowvmError as exc:
            if isinstance(exc, ProgramError) and exc.loc is not None:
                raise
            # e.g. a tile read before any instruction wrote it: name the instruction
            message = exc.message if isinstance(exc, ProgramError) else str(exc)
            raise st.runtime_error(stmt.inst, message) from None
    elif isinstance(stmt, SeqStmt):
        for s in stmt.stmts:
            _execute(s, st)
    elif isinstance(stmt, ForStmt):
        start, stop, step = st.eval(stmt.start), st.eval(stmt.stop), st.eval(stmt.step)
        for value in range(start, stop, step):
            st.env[stmt.var.name] = value
            _execute(stmt.body, st)
    elif isinstance(stmt, IfStmt):
        if st.eval(stmt.cond):
            _execute(stmt.then_body, st)
        elif stmt.else_body is not None:
            _execute(stmt.else_body, st)
    elif isinstance(stmt, LetStmt):
        st.env[stmt.var.name] = st.eval(stmt.value)
    else:
        raise TypeError(f"unknown statement {type(stmt).__name__}")


def _scalar(name: str, dt: DType, value: Any) -> int | float:
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if dt.is_float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ProgramError(f"argument {name!r} ({dt.name}): expected a number, got {value!r}")
        return float(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProgramError(f"argument {name!r} ({dt.name}): expected an int, got {value!r}")
    if not dt.min_value <= value <= dt.max_value:
        raise ProgramError(
            f"argument {name!r} ({dt.name}): {value} is outside [{int(dt.min_value)}, "
            f"{int(dt.max_value)}]"
        )
    return value


def run_program(program: Program, args: tuple[Any, ...]) -> None:
    """Execute ``program`` for every block of its grid with ``args`` bound to its params.

    Every error names the caller's line of this call (the ``interpret`` call), and the
    program's line of the instruction at fault where there is one.
    """
    try:
        _run(program, args)
    except ProgramError as exc:
        raise exc.at_call(user_location()) from None


def _run(program: Program, args: tuple[Any, ...]) -> None:
    env, buffers, grid3 = _bind(program, args)
    for bz, by, bx in itertools.product(range(grid3[2]), range(grid3[1]), range(grid3[0])):
        block_env = dict(env)
        block_env.update({"blockIdx.x": bx, "blockIdx.y": by, "blockIdx.z": bz,
                          "gridDim.x": grid3[0], "gridDim.y": grid3[1], "gridDim.z": grid3[2]})
        st = BlockState(block_env, buffers, (bx, by, bz))
        _execute(program.body, st)
        if st.pending_tiles:
            names = ", ".join(sorted(f"%{t.name}" for t in st.pending_tiles))
            raise ProgramError(f"{program.name}: a dot_shared issued with wait=False "
                               f"({names}) is not followed by vm.dot_wait() before the "
                               "end of the program")


def _bind(program: Program, args: tuple[Any, ...]
          ) -> tuple[dict[str, int | float], dict[str, GlobalBuffer], list[int]]:
    """Scalar values, global buffers and the 3-D grid for ``args``."""
    if len(args) != len(program.params):
        names = ", ".join(str(p) for p in program.params)
        raise ProgramError(
            f"{program.name} takes {len(program.params)} runtime arguments ({names}), "
            f"got {len(args)}"
        )
    env: dict[str, int | float] = {}
    buffers: dict[str, GlobalBuffer] = {}
    for param, arg in zip(program.params, args):
        if isinstance(param.type, PointerType):
            buffers[param.name] = bind_pointer(param.name, param.type.dtype, arg)
        else:
            env[param.name] = _scalar(param.name, param.type, arg)
    grid = [int(BlockState(env, buffers, ()).eval(g)) for g in program.grid]
    if any(g < 0 for g in grid):
        raise ProgramError(f"{program.name}: the grid {grid} has a negative size")
    return env, buffers, grid + [1] * (3 - len(grid))


def interpret(program: Any, *args: Any, **constants: Any) -> None:
    """Run a VM program on the CPU.

    ``program`` is a :class:`~lowvm.ir.Program` or a ``@vm.program`` function (then
    ``constants`` give its compile-time parameters). Pointer arguments are numpy arrays
    or CPU torch tensors, updated in place; scalar arguments are Python numbers.
    """
    if not isinstance(program, Program):
        build = getattr(program, "build", None)
        if build is None:
            raise ProgramError(
                f"interpret: expected a lowvm Program or @vm.program function, got "
                f"{type(program).__name__}", user_location()
            )
        program = build(**constants)
    elif constants:
        raise ProgramError(
            f"interpret: {program.name} is already built; compile-time constants "
            f"{sorted(constants)} cannot be given again", user_location()
        )
    run_program(program, args)
