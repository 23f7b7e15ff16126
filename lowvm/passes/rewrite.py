"""Rebuilding a program's statements: the one traversal every pass shares.

Passes never mutate IR; they map each statement to a new one. ``map_instructions``
rebuilds the tree with ``fn`` applied to every instruction (returning the same
instruction keeps it; returning a statement splices that statement in its place).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from lowvm.ir import ForStmt, IfStmt, InstStmt, LetStmt, Program, SeqStmt, Stmt

__all__ = ["map_instructions", "map_statements"]

InstFn = Callable[[object], object]


def map_statements(stmt: Stmt, fn: Callable[[Stmt], Stmt | None]) -> Stmt:
    """Rebuild ``stmt`` bottom-up; ``fn`` may replace any statement (None keeps it)."""
    if isinstance(stmt, SeqStmt):
        new: Stmt = SeqStmt(tuple(map_statements(s, fn) for s in stmt.stmts))
    elif isinstance(stmt, ForStmt):
        new = dataclasses.replace(stmt, body=map_statements(stmt.body, fn))
    elif isinstance(stmt, IfStmt):
        new = dataclasses.replace(
            stmt, then_body=map_statements(stmt.then_body, fn),
            else_body=None if stmt.else_body is None else map_statements(stmt.else_body, fn))
    elif isinstance(stmt, (InstStmt, LetStmt)):
        new = stmt
    else:
        raise TypeError(f"unknown statement {type(stmt).__name__}")
    replaced = fn(new)
    return new if replaced is None else replaced


def map_instructions(program: Program, fn: InstFn) -> Program:
    """``program`` with ``fn(inst)`` in place of each instruction."""

    def visit(stmt: Stmt) -> Stmt | None:
        if not isinstance(stmt, InstStmt):
            return None
        result = fn(stmt.inst)
        if result is stmt.inst:
            return None
        return result if isinstance(result, Stmt) else InstStmt(result)  # type: ignore[arg-type]

    return dataclasses.replace(program, body=map_statements(program.body, visit))
