"""The tracing builder behind the authoring front end.

Running a ``@vm.program`` function *traces* it: every ``vm.*`` call appends an
instruction to the statement list on top of the builder's stack, checked on the spot
and tagged with the caller's source line. Python control flow over compile-time values
therefore unrolls by itself; ``vm.range`` and ``vm.if_`` push a new list and close it
into a loop or branch.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from types import CodeType
from typing import TYPE_CHECKING

from lowvm.dtypes import DType
from lowvm.expr import Var
from lowvm.ir import DEFAULT_MAX_SHARED_BYTES, ProgramError, RegisterTensor, SourceLoc, Stmt
from lowvm.layouts import RegisterLayout
from lowvm.source_location import program_location, traceback_location

if TYPE_CHECKING:
    from lowvm.instructions.base import Instruction

__all__ = ["Builder", "current", "user_location", "traceback_location", "Pointer",
           "DEFAULT_MAX_SHARED_BYTES", "MAX_WARPS", "is_warp_count"]

#: the most warps a block may have (1024 threads, CUDA's limit)
MAX_WARPS = 32


def is_warp_count(n: object) -> bool:
    """Whether ``n`` is a warp count a block can have: an integer (not a bool) in
    1..``MAX_WARPS``; ``@vm.program(warps=...)`` and ``vm.set_warps`` both ask."""
    return isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_WARPS

_state = threading.local()


@dataclass(frozen=True)
class Pointer:
    """A pointer parameter inside a program body: ``vm.global_view`` turns it into a tile."""

    var: Var
    dtype: DType

    def __str__(self) -> str:
        return self.var.name


class Builder:
    """Collects the statements of one program while its function runs."""

    def __init__(self, name: str, num_warps: int | None, max_shared_bytes: int,
                 program: CodeType | None = None) -> None:
        self.name = name
        #: the code of the function being traced: its frame bounds the program's lines
        self.program = program
        self.num_warps = num_warps
        self.min_blocks: int | None = None
        self.grid: tuple | None = None
        self.max_shared_bytes = max_shared_bytes
        self.shared_in_use = 0
        self.shared_peak = 0
        self.stack: list[list[Stmt]] = [[]]
        self.counter = 0
        self.tiles_created = False
        self.deferred_error: ProgramError | None = None

    # names ----------------------------------------------------------------------------
    def fresh(self, hint: str) -> str:
        """A unique name for a tile or variable."""
        self.counter += 1
        return f"{hint}{self.counter}"

    # statements -----------------------------------------------------------------------
    def defer(self, error: ProgramError) -> None:
        """Record an error found where it cannot be raised (a generator being closed).

        It is raised by the next statement the program adds, or when tracing ends.
        """
        if self.deferred_error is None:
            self.deferred_error = error

    def raise_deferred(self) -> None:
        """Raise the error recorded by :meth:`defer`, if any."""
        if self.deferred_error is not None:
            raise self.deferred_error

    def emit(self, inst: Instruction) -> Instruction:
        """Check ``inst`` and append it to the current statement list."""
        from lowvm.ir import InstStmt

        self.raise_deferred()
        inst.check()
        self.stack[-1].append(InstStmt(inst))
        return inst

    def append(self, stmt: Stmt) -> None:
        """Append a finished statement (a loop or branch)."""
        self.raise_deferred()
        self.stack[-1].append(stmt)

    def push(self) -> None:
        """Open a nested statement list (a loop or branch body)."""
        self.raise_deferred()
        self.stack.append([])

    def pop(self) -> list[Stmt]:
        """Close the innermost statement list and return it."""
        return self.stack.pop()

    # threads --------------------------------------------------------------------------
    @property
    def num_threads(self) -> int:
        """Threads per block; fixed by the first tile if not set before."""
        if self.num_warps is None:
            raise ProgramError(
                "the number of warps is not set: pass warps=... to @vm.program or call "
                "vm.set_warps(n) before creating register tiles",
                user_location(),
            )
        return self.num_warps * 32

    def check_layout(self, layout: RegisterLayout, what: str) -> None:
        """A register layout must spread its tile over exactly the block's threads."""
        if not isinstance(layout, RegisterLayout):
            raise ProgramError(
                f"{what}: layout must be a RegisterLayout (e.g. vm.spatial(8, 32)), got "
                f"{layout!r}", user_location())
        if layout.num_threads != self.num_threads:
            raise ProgramError(
                f"{what}: the layout {layout} spreads the tile over {layout.num_threads} "
                f"threads but the block has {self.num_threads} ({self.num_warps} warps)",
                user_location(),
            )
        self.tiles_created = True

    def register(self, dtype: DType, shape: tuple[int, ...], layout: RegisterLayout | None,
                 what: str, hint: str = "r") -> RegisterTensor:
        """A new register tile, its layout checked against shape and thread count.

        ``layout=None`` leaves the layout to layout inference (run when the program is
        built), so neither it nor the number of warps is needed yet.
        """
        if layout is None:
            return RegisterTensor(self.fresh(hint), dtype, tuple(shape), None)
        self.check_layout(layout, what)
        if tuple(shape) != layout.shape:
            raise ProgramError(
                f"{what}: the layout {layout} has shape {list(layout.shape)} but the tile "
                f"has shape {list(shape)}", user_location())
        return RegisterTensor(self.fresh(hint), dtype, tuple(shape), layout)

    # shared memory budget ---------------------------------------------------------------
    def take_shared(self, nbytes: int, what: str) -> None:
        """Account for a shared allocation; over the limit is an error at that line."""
        self.shared_in_use += nbytes
        if self.shared_in_use > self.max_shared_bytes:
            raise ProgramError(
                f"{what}: shared memory over the limit: {self.shared_in_use} bytes in use "
                f"after this allocation of {nbytes}; the limit is {self.max_shared_bytes} "
                "bytes per block (free_shared tiles no longer needed, or use smaller tiles)",
                user_location(),
            )
        self.shared_peak = max(self.shared_peak, self.shared_in_use)

    def give_shared(self, nbytes: int) -> None:
        """Return a freed shared allocation to the budget."""
        self.shared_in_use -= nbytes


def user_location() -> SourceLoc | None:
    """The line an error or instruction belongs to: while a program is traced, the
    program's line that made the current ``vm.*`` call (in lowvm's own kernel library,
    the library's line); otherwise the user's line of the current call."""
    builder = getattr(_state, "builder", None)
    return program_location(builder.program if builder is not None else None)


def current() -> Builder:
    """The builder of the program being traced (an error outside ``@vm.program``)."""
    builder = getattr(_state, "builder", None)
    if builder is None:
        raise ProgramError(
            "VM instructions can only be called while a @vm.program function is being "
            "built (by vm.interpret, .build() or a launch)", user_location())
    return builder


def activate(builder: Builder | None) -> Builder | None:
    """Make ``builder`` current; return the previous one."""
    previous = getattr(_state, "builder", None)
    _state.builder = builder
    return previous
