"""The readable text form of a VM program (``print(program)``)."""

from __future__ import annotations

from lowvm.ir.nodes import ForStmt, IfStmt, InstStmt, LetStmt, Program, SeqStmt, Stmt

__all__ = ["format_program", "format_stmt"]


def format_stmt(stmt: Stmt, indent: int = 1) -> list[str]:
    """Lines for ``stmt``, indented by ``indent`` levels."""
    pad = "  " * indent
    if isinstance(stmt, InstStmt):
        return [pad + str(stmt.inst)]
    if isinstance(stmt, SeqStmt):
        return [line for s in stmt.stmts for line in format_stmt(s, indent)]
    if isinstance(stmt, ForStmt):
        unroll = f" unroll={stmt.unroll}" if stmt.unroll else ""
        unroll += f" stages={stmt.stages}" if stmt.stages else ""
        head = f"{pad}for {stmt.var} in range({stmt.start}, {stmt.stop}, {stmt.step}){unroll}:"
        return [head, *format_stmt(stmt.body, indent + 1)]
    if isinstance(stmt, IfStmt):
        lines = [f"{pad}if {stmt.cond}:", *format_stmt(stmt.then_body, indent + 1)]
        if stmt.else_body is not None:
            lines += [f"{pad}else:", *format_stmt(stmt.else_body, indent + 1)]
        return lines
    if isinstance(stmt, LetStmt):
        return [f"{pad}let {stmt.var} = {stmt.value}"]
    return [f"{pad}<{type(stmt).__name__}>"]


def format_program(program: Program) -> str:
    """The whole program: signature, launch configuration, body."""
    params = ", ".join(str(p) for p in program.params)
    consts = ", ".join(f"{k}={v}" for k, v in program.constants)
    grid = ", ".join(str(g) for g in program.grid)
    lines = [
        f"program {program.name}({params})" + (f" [{consts}]" if consts else ""),
        f"  grid [{grid}], {program.num_warps} warps, shared {program.shared_bytes} bytes"
        + (f", min {program.min_blocks} blocks/SM" if program.min_blocks is not None else ""),
        *format_stmt(program.body, 1),
    ]
    return "\n".join(lines)
