"""Verify: the first pass; it changes nothing and refuses programs later passes could
not trust.

Guarantees, for a program :func:`verify` returns (the same object):

- every instruction's ``check()`` passes;
- every register tile has a layout (layout inference has run; ``build`` runs it) whose
  shape is the tile's and whose threads are the block's;
- two different tiles never share a name (names become C identifiers);
- every tile an instruction reads was written (register tiles), allocated (shared) or
  named by ``global_view`` (global) earlier in program order; in a loop, "earlier"
  means before the loop or above the use in the body, so a tile first written further
  down the body is read undefined in the first iteration and refused;
- a shared tile is freed at most once, never used after it is freed, and not freed
  inside a loop unless it is also allocated in that loop's body;
- no loop has the compile-time step 0 (it would never end).

Branches of ``vm.if_`` are checked each from the state before the branch; what either
branch defines or frees counts afterwards (a tile written in one branch may be read in
a later branch on the same condition).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lowvm.expr import const_value
from lowvm.instructions import AllocBarriers, AllocShared, FreeShared, GlobalView, Instruction
from lowvm.ir import (
    BarrierTensor,
    ForStmt,
    GlobalTensor,
    IfStmt,
    InstStmt,
    LetStmt,
    Program,
    ProgramError,
    RegisterTensor,
    SeqStmt,
    SharedTensor,
    Stmt,
    Tensor,
)

__all__ = ["verify"]


@dataclass
class _State:
    """What is defined at a point of the program, and where."""

    defined: set[Tensor] = field(default_factory=set)
    freed: dict[SharedTensor, Instruction] = field(default_factory=dict)
    loops: list[set[SharedTensor]] = field(default_factory=list)  # allocated per open loop

    def copy(self) -> _State:
        return _State(set(self.defined), dict(self.freed), [set(s) for s in self.loops])

    def merge(self, other: _State) -> None:
        self.defined |= other.defined
        for t, inst in other.freed.items():
            self.freed.setdefault(t, inst)
        for mine, theirs in zip(self.loops, other.loops):
            mine |= theirs


class _Verifier:
    def __init__(self, program: Program) -> None:
        self.program = program
        self.names: dict[str, Tensor] = {}

    def error(self, inst: Instruction, message: str) -> ProgramError:
        return ProgramError(f"{inst.mnemonic}: {message}", inst.loc)

    def tile(self, inst: Instruction, t: Tensor) -> None:
        """Rules on a tile by itself: a unique name; for register tiles, a layout."""
        other = self.names.setdefault(t.name, t)
        if other is not t:
            raise self.error(inst, f"two different tiles are named %{t.name}")
        if not isinstance(t, RegisterTensor):
            return
        if t.layout is None:
            raise self.error(inst, f"%{t.name} has no layout; run layout inference first "
                             "(lowvm.passes.layout_inference.infer_layouts; build() does)")
        if t.layout.shape != tuple(t.shape):
            raise self.error(inst, f"%{t.name} has shape {list(t.shape)} but its layout "
                             f"{t.layout} has shape {list(t.layout.shape)}")
        if t.layout.num_threads != self.program.num_threads:
            raise self.error(inst, f"the layout {t.layout} of %{t.name} spreads it over "
                             f"{t.layout.num_threads} threads but the block has "
                             f"{self.program.num_threads}")

    def use(self, inst: Instruction, t: Tensor, st: _State) -> None:
        """``inst`` reads (or, for shared and global tiles, accesses) ``t``."""
        if isinstance(t, SharedTensor) and t in st.freed:
            where = st.freed[t].loc
            raise self.error(inst, f"%{t.name} is used after free_shared"
                             + (f" at {where}" if where else ""))
        if t not in st.defined:
            what = {RegisterTensor: "written", SharedTensor: "allocated",
                    GlobalTensor: "named by global_view",
                    BarrierTensor: "allocated by vm.mbarriers"}.get(type(t), "defined")
            raise self.error(inst, f"%{t.name} is used before it is {what} (a tile used in "
                             "a loop must be defined before the loop or above its use)")

    def instruction(self, inst: Instruction, st: _State) -> None:
        inst.check()
        out = inst.output()
        for t in (*inst.operands(), *([out] if out is not None else [])):
            self.tile(inst, t)
        if isinstance(inst, FreeShared):
            t = inst.tensor
            if t in st.freed:
                where = st.freed[t].loc
                raise self.error(inst, f"%{t.name} is freed twice"
                                 + (f"; first at {where}" if where else ""))
            self.use(inst, t, st)
            if st.loops and t not in st.loops[-1]:
                raise self.error(inst, f"%{t.name} is allocated outside this loop but freed "
                                 "inside it, so it would be freed on every iteration")
            st.freed[t] = inst
            return
        for t in inst.operands():
            self.use(inst, t, st)
        if (isinstance(inst, (AllocShared, AllocBarriers, GlobalView))
                or isinstance(out, RegisterTensor)):
            if isinstance(inst, AllocShared) and st.loops:
                st.loops[-1].add(out)  # type: ignore[arg-type]
            st.defined.add(out)  # type: ignore[arg-type]

    def stmt(self, stmt: Stmt, st: _State) -> None:
        if isinstance(stmt, InstStmt):
            self.instruction(stmt.inst, st)
        elif isinstance(stmt, SeqStmt):
            for s in stmt.stmts:
                self.stmt(s, st)
        elif isinstance(stmt, ForStmt):
            if const_value(stmt.step) == 0:
                raise ProgramError(f"verify: the loop over {stmt.var} has the step 0 and "
                                   "would never end", stmt.loc)
            st.loops.append(set())
            self.stmt(stmt.body, st)
            st.loops.pop()
        elif isinstance(stmt, IfStmt):
            then = st.copy()
            self.stmt(stmt.then_body, then)
            if stmt.else_body is not None:
                other = st.copy()
                self.stmt(stmt.else_body, other)
                then.merge(other)
            st.merge(then)
        elif not isinstance(stmt, LetStmt):
            raise ProgramError(f"verify: unknown statement {type(stmt).__name__}")


def verify(program: Program) -> Program:
    """Check ``program`` (see module doc) and return it unchanged."""
    _Verifier(program).stmt(program.body, _State())
    return program
