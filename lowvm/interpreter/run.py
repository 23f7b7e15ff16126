"""Run a VM program on the CPU, block after block, with exact semantics.

``interpret(program, *args)`` binds pointer parameters to the caller's numpy arrays or
CPU torch tensors (written in place, as a kernel would) and scalar parameters to Python
numbers, evaluates the grid, and executes the body once per block.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

from lowvm.dtypes import DType
from lowvm.errors import LowvmError
from lowvm.expr import INT32_MAX, INT32_MIN, Expr, evaluate
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
    SourceLoc,
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
        for value in _loop_values(stmt, st):
            st.env[stmt.var.name] = value
            _execute(stmt.body, st)
    elif isinstance(stmt, IfStmt):
        if _scalar_value(stmt.cond, st, "if_", stmt.loc):
            _execute(stmt.then_body, st)
        elif stmt.else_body is not None:
            _execute(stmt.else_body, st)
    elif isinstance(stmt, LetStmt):
        st.env[stmt.var.name] = _scalar_value(stmt.value, st, "let", stmt.loc)
    else:
        raise TypeError(f"unknown statement {type(stmt).__name__}")


def _scalar_value(expr: Expr, st: BlockState, what: str, loc: SourceLoc | None):
    """A loop bound, branch condition or ``let`` value, errors at the statement's line."""
    try:
        return st.eval(expr)
    except LowvmError as exc:
        raise st.statement_error(what, loc, str(exc)) from None


def _loop_values(stmt: ForStmt, st: BlockState) -> range:
    """The values of a ``vm.range`` loop: Python's ``range`` (counting down for a negative
    step), refused at the loop's line where the kernel's ``for`` would not run it so: a
    step of 0 (it would never end), bounds that are not integers, or a counter that
    passes int32 after the last iteration (the kernel's ``i += step`` would overflow)."""
    bounds = [_scalar_value(e, st, "vm.range", stmt.loc)
              for e in (stmt.start, stmt.stop, stmt.step)]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in bounds):
        raise st.statement_error("vm.range", stmt.loc, f"start, stop and step must be "
                                 f"integers, got {bounds} from ({stmt.start}, {stmt.stop}, "
                                 f"{stmt.step})")
    start, stop, step = bounds
    if step == 0:
        raise st.statement_error("vm.range", stmt.loc, f"the step {stmt.step} is 0 at run "
                                 "time; a loop with step 0 never ends (accepted: any other "
                                 "int32)")
    values = range(start, stop, step)
    after = start + len(values) * step
    if values and not INT32_MIN <= after <= INT32_MAX:
        raise st.statement_error(
            "vm.range", stmt.loc, f"range({start}, {stop}, {step}): after its last value "
            f"{values[-1]} the loop counter becomes {after}, outside int32; the kernel's "
            "32-bit counter would overflow (keep stop within |step| of the int32 range's end)")
    return values


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


def checked_from_environment() -> bool:
    """``LOWVM_CHECKED``: ``1`` runs the interpreter checked, ``0`` or unset not."""
    value = os.environ.get("LOWVM_CHECKED", "").strip()
    if value not in ("", "0", "1"):
        raise ProgramError(f"the environment variable LOWVM_CHECKED is {value!r}; accepted: "
                           "'1' (checked interpreter) or '0'")
    return value == "1"


def run_program(program: Program, args: tuple[Any, ...], checked: bool | None = None) -> None:
    """Execute ``program`` for every block of its grid with ``args`` bound to its params.

    ``checked`` (default: ``LOWVM_CHECKED``) reports int32 overflow of index and loop
    arithmetic at its program line; otherwise it wraps, as the GPU's does. Every error
    names the caller's line of this call (the ``interpret`` call), and the program's line
    of the instruction or statement at fault where there is one.
    """
    try:
        if checked is None:
            checked = checked_from_environment()
        _run(program, args, bool(checked))
    except ProgramError as exc:
        raise exc.at_call(user_location()) from None


def _run(program: Program, args: tuple[Any, ...], checked: bool) -> None:
    env, buffers, grid3 = _bind(program, args)
    for bz, by, bx in itertools.product(range(grid3[2]), range(grid3[1]), range(grid3[0])):
        block_env = dict(env)
        block_env.update({"blockIdx.x": bx, "blockIdx.y": by, "blockIdx.z": bz,
                          "gridDim.x": grid3[0], "gridDim.y": grid3[1], "gridDim.z": grid3[2]})
        st = BlockState(block_env, buffers, (bx, by, bz), checked, program.num_threads)
        _execute(program.body, st)
        if st.pending_tiles:
            names = ", ".join(sorted(f"%{t.name}" for t in st.pending_tiles))
            raise ProgramError(f"{program.name}: a dot_shared issued with wait=False "
                               f"({names}) is not followed by vm.dot_wait() before the "
                               "end of the program")
        if st.bulk_stores_pending:
            raise ProgramError(f"{program.name}: a store_tma is not followed by "
                               "vm.store_tma_wait() before the end of the program (the "
                               "block's shared memory must outlive the copy's read)")


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
    grid = [int(evaluate(g, env)) for g in program.grid]  # the host's arithmetic, as a launch
    if any(g < 0 for g in grid):
        raise ProgramError(f"{program.name}: the grid {grid} has a negative size")
    return env, buffers, grid + [1] * (3 - len(grid))


def interpret(program: Any, *args: Any, checked: bool | None = None, **constants: Any) -> None:
    """Run a VM program on the CPU.

    ``program`` is a :class:`~lowvm.ir.Program` or a ``@vm.program`` function (then
    ``constants`` give its compile-time parameters). Pointer arguments are numpy arrays
    or CPU torch tensors, updated in place; scalar arguments are Python numbers.
    Runtime index and loop arithmetic is int32 and wraps, as on the GPU; ``checked=True``
    (or ``LOWVM_CHECKED=1``) reports a wrap as :class:`InterpretError` at its program line.
    """
    if not isinstance(program, Program):
        if "checked" in getattr(program, "constant_names", ()):
            raise ProgramError(
                f"interpret: {program.name} has a compile-time parameter named 'checked', "
                "which interpret's own checked= would shadow; build it first: "
                f"interpret({program.name}.build(checked=...), ...)", user_location())
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
    run_program(program, args, checked)
