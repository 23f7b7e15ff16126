"""Software pipelining: a ``vm.range(..., stages=S)`` loop keeps S - 1 tiles in flight.

Accepted loop shape (``S >= 2``; the body's top-level statements, in order)::

    for v in vm.range(start, stop, step, stages=S):   # step: a positive constant
        copy_async(t1, ...); copy_async(t2, ...)       # >= 1 copies, first in the body
        commit_group()
        A                                              # anything not touching t1, t2, ...
        wait_group(0); sync()                          # the first top-level wait
        B                                              # reads t1, t2, ...

``A`` and ``B`` may hold any statements (nested ``if``/loops included) except
``copy_async``/``commit_group``/``wait_group``; ``A`` must not touch the copied shared
tiles and ``B`` may only read them (``load_shared``, ``dot_shared``). The copied tiles
must be allocated outside the loop and used nowhere else except by their
``shared_tensor``/``free_shared``.

What the pass guarantees: the program computes exactly what it computed before (the
same instructions in the same order on the same data), with

- each copied tile ``t`` of shape ``[...]`` allocated as ``[S, ...]`` (stage stride a
  multiple of 16 bytes and of the swizzle period, so a stage is laid out as ``t`` was);
  the program's shared memory is checked against the block's limit;
- a prologue issuing the copies of iterations ``0 .. S-2`` into stages ``0 .. S-2``,
  each guarded by ``if`` on the runtime trip count and each its own commit group (an
  empty group past the end, so counts stay uniform);
- a steady state where iteration ``i`` runs ``A``, waits with ``wait_group(S-2)`` +
  ``sync`` (tile ``i`` has landed, at most S - 2 newer groups in flight), issues the
  guarded copy of iteration ``i+S-1`` into stage ``(i+S-1) % S`` — the stage that
  iteration ``i-1`` consumed, which the ``sync`` just separated from its readers —
  commits, and runs ``B`` on stage ``i % S``;
- a drain (``wait_group(0)``) after the loop. When ``B`` ends with a ``sync`` and the
  loop touches no shared tile but the staged ones, that ``sync`` (which only protected
  the next copy) moves after the drain: one barrier per iteration instead of two.

A loop asking for stages that does not have this shape is a :class:`ProgramError`
naming the loop's line and what is wrong. The rewritten loop has ``stages=None``, so
running the pass again changes nothing.
"""

from __future__ import annotations

import dataclasses

from lowvm.expr import BinOp, Const, Expr, Select, UnaryOp, Var, as_expr, const_value, select
from lowvm.expr import _binary as rebuild_binary  # the folding constructor of BinOp
from lowvm.expr import _unary as rebuild_unary
from lowvm.instructions import (
    AllocShared,
    CommitGroup,
    CopyAsync,
    DotShared,
    FreeShared,
    LoadShared,
    Sync,
    WaitGroup,
)
from lowvm.ir import (
    DEFAULT_MAX_SHARED_BYTES,
    ForStmt,
    IfStmt,
    InstStmt,
    LetStmt,
    Program,
    ProgramError,
    SeqStmt,
    SharedTensor,
    Stmt,
    seq,
    walk,
)
from lowvm.layouts.shared import staged_layout
from lowvm.passes.rewrite import map_statements

__all__ = ["pipeline_loops"]

_ASYNC = (CopyAsync, CommitGroup, WaitGroup)
_ACCEPTED = ("accepted: `copy_async(...)`s into shared tiles first in the body, then "
             "`commit_group()`, then the consumers' `wait_group(0)` + `sync()` (see "
             "lowvm/passes/software_pipeline.py)")


def substitute(expr: Expr, var: Var, value: Expr) -> Expr:
    """``expr`` with ``var`` replaced by ``value`` (rebuilt, so constants fold)."""
    e = as_expr(expr)
    if isinstance(e, Var):
        return value if e == var else e
    if isinstance(e, BinOp):
        return rebuild_binary(e.op, substitute(e.lhs, var, value),
                              substitute(e.rhs, var, value))
    if isinstance(e, UnaryOp):
        return rebuild_unary(e.op, substitute(e.operand, var, value))
    if isinstance(e, Select):
        return select(substitute(e.cond, var, value), substitute(e.then, var, value),
                      substitute(e.other, var, value))
    return e


def _flatten(stmt: Stmt) -> list[Stmt]:
    if isinstance(stmt, SeqStmt):
        return [s for inner in stmt.stmts for s in _flatten(inner)]
    return [stmt]


def _inst(stmt: Stmt, kind: type | tuple[type, ...]):
    if isinstance(stmt, InstStmt) and isinstance(stmt.inst, kind):
        return stmt.inst
    return None


def _tensors(inst) -> tuple:
    out = inst.output()
    return inst.operands() + ((out,) if out is not None else ())


class _Loop:
    """One loop being pipelined: its parts, the staged tiles and the names it binds."""

    def __init__(self, loop: ForStmt, taken: set[str]) -> None:
        self.loop = loop
        self.stages = int(loop.stages)  # type: ignore[arg-type]
        self.taken = taken
        self.tiles: dict[SharedTensor, SharedTensor] = {}

    def fail(self, why: str) -> ProgramError:
        where = f" at {self.loop.loc.filename}:{self.loop.loc.lineno}" if self.loop.loc else ""
        return ProgramError(
            f"software pipelining (stages={self.stages}) of the vm.range loop{where}: "
            f"{why}; {_ACCEPTED}", self.loop.loc)

    def fresh(self, hint: str) -> Var:
        name, n = f"{self.loop.var.name}_{hint}", 0
        while name in self.taken:
            n += 1
            name = f"{self.loop.var.name}_{hint}_{n}"
        self.taken.add(name)
        return Var(name)

    # analysis -------------------------------------------------------------------------
    def split(self) -> tuple[list[CopyAsync], list[Stmt], list[Stmt]]:
        """(copies, A, B) of the accepted shape, or a ProgramError saying why not."""
        step = const_value(self.loop.step)
        if not isinstance(step, int) or isinstance(step, bool) or step < 1:
            raise self.fail(f"the step {self.loop.step} must be a positive compile-time "
                            "integer")
        stmts = _flatten(self.loop.body)
        copies: list[CopyAsync] = []
        while len(copies) < len(stmts) and _inst(stmts[len(copies)], CopyAsync):
            copies.append(stmts[len(copies)].inst)  # type: ignore[attr-defined]
        if not copies:
            raise self.fail("the body does not start with copy_async")
        rest = stmts[len(copies):]
        if not rest or not _inst(rest[0], CommitGroup):
            raise self.fail("the copies at the start of the body are not followed by "
                            "commit_group()")
        rest = rest[1:]
        for w, stmt in enumerate(rest):
            wait = _inst(stmt, WaitGroup)
            if wait is None:
                continue
            if wait.n != 0:
                raise self.fail(f"the consumers wait with wait_group({wait.n}); write "
                                "wait_group(0), the pass chooses how many stay in flight")
            if w + 1 >= len(rest) or not _inst(rest[w + 1], Sync):
                raise self.fail("wait_group(0) is not followed by sync()")
            return copies, rest[:w], rest[w + 2:]
        raise self.fail("no top-level wait_group(0) + sync() before the consumers")

    def check_parts(self, staged: set[SharedTensor], a: list[Stmt], b: list[Stmt]) -> None:
        """``A`` leaves the staged tiles alone; ``B`` only loads them; no async ops."""
        for part, name in ((a, "before"), (b, "after")):
            for stmt in (s for top in part for s in walk(top)):
                if not isinstance(stmt, InstStmt):
                    continue
                inst = stmt.inst
                line = f" (line {inst.loc.lineno})" if inst.loc else ""
                if isinstance(inst, _ASYNC):
                    raise self.fail(f"{inst.mnemonic}{line} {name} the consumers' wait: only "
                                    "the copies at the start of the body may be asynchronous")
                touched = [t for t in _tensors(inst) if t in staged]
                if not touched:
                    continue
                if name == "before" or not isinstance(inst, (LoadShared, DotShared)):
                    raise self.fail(
                        f"{inst.mnemonic}{line} uses %{touched[0].name} {name} the "
                        "consumers' wait; a pipelined tile may only be read by load_shared "
                        "or dot_shared after wait_group(0) + sync()")

    # rewriting ------------------------------------------------------------------------
    def rewrite(self, new: dict[SharedTensor, SharedTensor]) -> Stmt:
        loop, s = self.loop, self.stages
        copies, a, b = self.split()
        staged = {c.dst for c in copies}
        self.check_parts(staged, a, b)
        for c in copies:
            if c.dst in new:
                raise self.fail(f"%{c.dst.name} is already pipelined by another loop")
        local = {t: SharedTensor(f"{t.name}_x{s}", t.dtype, staged_layout(t.layout, s,
                                                                          t.dtype.nbits))
                 for t in staged}
        new.update(local)
        self.tiles = local
        var, start, stop, step = loop.var, loop.start, loop.stop, loop.step

        def issue(at: Expr, stage: Expr) -> list[Stmt]:
            """The copies of the iteration whose loop variable is ``at``, guarded."""
            moved = [InstStmt(dataclasses.replace(
                c, dst=local[c.dst], shape=c.tile_shape,
                offsets=tuple(substitute(o, var, at) for o in c.offsets),
                dst_offsets=(stage, *(substitute(o, var, at) for o in c.dst_start))))
                for c in copies]
            cond = as_expr(at < stop)  # type: ignore[operator]
            if isinstance(cond, Const):
                return moved if cond.value else []
            return [IfStmt(cond, seq(moved), None, loop.loc)]

        commit = InstStmt(CommitGroup(loc=copies[0].loc))
        prologue: list[Stmt] = []
        for j in range(s - 1):
            prologue += [*issue(start + j * step, Const(j)), commit]

        stage, refill = self.fresh("stage"), self.fresh("refill_stage")
        index = (var - start) // step
        wait = InstStmt(WaitGroup(n=s - 2, loc=copies[0].loc))
        barrier = InstStmt(Sync(loc=copies[0].loc))

        def consume(inst):
            if isinstance(inst, LoadShared) and inst.src in local:
                return dataclasses.replace(inst, src=local[inst.src],
                                           offsets=(stage, *inst.offsets))
            if isinstance(inst, DotShared) and inst.b in local:
                return dataclasses.replace(inst, b=local[inst.b],
                                           offsets=(stage, *inst.offsets))
            return inst

        # The body's closing sync only kept the next iteration's copies off the tiles
        # being read; the wait + sync before the refill does that now. When no other
        # shared tile needs it, it moves after the loop (where later code may rely on it).
        tail: list[Stmt] = []
        if b and _inst(b[-1], Sync) and _only_staged_shared(a + b[:-1], staged):
            b, tail = b[:-1], [b[-1]]
        body = [
            LetStmt(stage, index % s),
            LetStmt(refill, (index + (s - 1)) % s),
            *a, wait, barrier,
            *issue(var + (s - 1) * step, refill), commit,
            *(map_statements(st, _instruction_fn(consume)) for st in b),
        ]
        steady = dataclasses.replace(loop, body=seq(body), stages=None)
        drain = InstStmt(WaitGroup(n=0, loc=copies[0].loc))
        return SeqStmt((*prologue, steady, drain, *tail))


def _only_staged_shared(stmts: list[Stmt], staged: set[SharedTensor]) -> bool:
    """True when the only shared tiles ``stmts`` touch are staged ones (by loads)."""
    for stmt in (s for top in stmts for s in walk(top)):
        if isinstance(stmt, InstStmt) and any(
                isinstance(t, SharedTensor) and t not in staged for t in _tensors(stmt.inst)):
            return False
    return True


def _instruction_fn(fn):
    def visit(stmt: Stmt) -> Stmt | None:
        if isinstance(stmt, InstStmt):
            inst = fn(stmt.inst)
            return None if inst is stmt.inst else InstStmt(inst)
        return None

    return visit


def _names(program: Program) -> set[str]:
    names = {p.name for p in program.params}
    for stmt in walk(program.body):
        if isinstance(stmt, (ForStmt, LetStmt)):
            names.add(stmt.var.name)
    return names


def _shared_peak(body: Stmt) -> int:
    in_use = peak = 0
    for stmt in walk(body):
        inst = stmt.inst if isinstance(stmt, InstStmt) else None
        if isinstance(inst, AllocShared):
            in_use += inst.out.nbytes
            peak = max(peak, in_use)
        elif isinstance(inst, FreeShared):
            in_use -= inst.tensor.nbytes
    return peak


def pipeline_loops(program: Program, max_shared_bytes: int | None = None) -> Program:
    """``program`` with every ``stages >= 2`` loop software-pipelined (module docstring).

    ``max_shared_bytes`` is the block's shared memory limit (default: the front end's,
    227 KB on an H100); the staged program must fit it.
    """
    if not any(isinstance(st, ForStmt) and (st.stages or 0) >= 2 for st in walk(program.body)):
        return program
    if max_shared_bytes is None:
        max_shared_bytes = DEFAULT_MAX_SHARED_BYTES
    taken = _names(program)
    new: dict[SharedTensor, SharedTensor] = {}
    loops: list[_Loop] = []

    def visit(stmt: Stmt) -> Stmt | None:
        if isinstance(stmt, ForStmt) and (stmt.stages or 0) >= 2:
            loops.append(_Loop(stmt, taken))
            return loops[-1].rewrite(new)
        return None

    body = map_statements(program.body, visit)

    def owner(old: SharedTensor) -> _Loop:
        return next(lp for lp in loops if old in lp.tiles)

    allocated: set[SharedTensor] = set()

    def retarget(inst):
        if isinstance(inst, AllocShared) and inst.out in new:
            allocated.add(inst.out)
            return dataclasses.replace(inst, out=new[inst.out])
        if isinstance(inst, FreeShared) and inst.tensor in new:
            return dataclasses.replace(inst, tensor=new[inst.tensor])
        stray = [t for t in _tensors(inst) if t in new]
        if stray:
            line = f" at line {inst.loc.lineno}" if inst.loc else ""
            raise owner(stray[0]).fail(
                f"%{stray[0].name} is also used outside the loop, by {inst.mnemonic}{line}; "
                "a pipelined tile must live only in its loop")
        return inst

    body = map_statements(body, _instruction_fn(retarget))
    for old in new:
        if old not in allocated:
            raise owner(old).fail(f"%{old.name} is not allocated by shared_tensor outside "
                                  "the loop")
    peak = _shared_peak(body)
    if peak > max_shared_bytes:
        tiles = ", ".join(f"%{t.name} [{', '.join(map(str, t.shape))}] = {t.nbytes} bytes"
                          for t in new.values())
        raise loops[0].fail(
            f"the staged tiles ({tiles}) bring the block's shared memory to {peak} bytes, "
            f"over the limit of {max_shared_bytes}; use fewer stages or smaller tiles")
    return dataclasses.replace(program, body=body, shared_bytes=peak)
