"""The VM's intermediate representation: tiles, statements and programs.

A program is a grid of thread blocks running one body. Every value the body computes is
a *tile*: a :class:`GlobalTensor` (a pointer seen through a global layout), a
:class:`SharedTensor` (shared memory seen through a shared layout) or a
:class:`RegisterTensor` (spread over the block's threads by a register layout). Scalars
(sizes, indices, loop variables) are :mod:`lowvm.expr` expressions and are uniform
across the block.

Nodes are frozen dataclasses; passes never mutate a node, they build new ones. Tensors
compare by identity: two tiles with equal types are still two tiles.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from lowvm.dtypes import DType
from lowvm.errors import LowvmError
from lowvm.expr import Expr, Var, as_expr
from lowvm.layouts import GlobalLayout, RegisterLayout, SharedLayout

__all__ = [
    "ProgramError",
    "SourceLoc",
    "located_message",
    "Tensor",
    "GlobalTensor",
    "SharedTensor",
    "RegisterTensor",
    "BarrierTensor",
    "BarrierRef",
    "MBARRIER",
    "PointerType",
    "Param",
    "Stmt",
    "InstStmt",
    "SeqStmt",
    "ForStmt",
    "IfStmt",
    "LetStmt",
    "Program",
    "BOOL",
    "DEFAULT_MAX_SHARED_BYTES",
    "walk",
    "set_tile_operator",
]

#: A VM instruction (:class:`lowvm.instructions.Instruction`). Named, not imported: the
#: instructions are defined on top of the IR; statements only hold them.
Instruction = Any

#: The type of comparison results and masks (one bit of truth, stored as 0/1).
BOOL = DType("bool", 1, "uint")

#: The type of an mbarrier: a 64-bit word of shared memory the hardware counts arrivals
#: and transaction bytes in (never read as a number).
MBARRIER = DType("mbarrier", 64, "uint")

#: Shared memory one block may use on an H100 (227 KB opt-in); sm_80 allows 163 KB.
DEFAULT_MAX_SHARED_BYTES = 227 * 1024


@dataclass(frozen=True)
class SourceLoc:
    """Where in the user's source an instruction was written."""

    filename: str
    lineno: int
    code: str = ""

    def __str__(self) -> str:
        text = f"{self.filename}:{self.lineno}"
        return f"{text}: {self.code.strip()}" if self.code else text


def located_message(message: str, loc: SourceLoc | None, call: SourceLoc | None = None) -> str:
    """``message`` after the lines that place it: the user's line of the call that ran
    into it (where that is another line), then the program line."""
    if call is None or call == loc:
        return f"{loc}\n  {message}" if loc else message
    lines = [str(call), *([f"in the program at {loc}"] if loc else []), message]
    return "\n  ".join(lines)


class ProgramError(LowvmError, ValueError):
    """A mistake in a VM program, reported at the user's source line.

    ``loc`` is the program line that made the instruction at fault; ``call`` the user's
    line of the call that ran into it (a build, an ``interpret``), named first where it
    is another line: a program is built once per set of constants and cached, so its
    lines alone cannot say which of the user's calls failed, and for a program of the
    kernel library they are not the user's lines at all.
    """

    def __init__(self, message: str, loc: SourceLoc | None = None,
                 call: SourceLoc | None = None) -> None:
        self.message = message
        self.loc = loc
        self.call = call if call != loc else None
        super().__init__(located_message(message, loc, self.call))

    def at_call(self, call: SourceLoc | None) -> ProgramError:
        """This error (same class, message and program line) naming ``call`` too; itself
        where it names a call already or ``call`` is None."""
        if self.call is not None or call is None:
            return self
        return type(self)(self.message, self.loc, call).with_traceback(self.__traceback__)


# ---------------------------------------------------------------------------------------
# tiles


@dataclass(frozen=True, eq=False)
class Tensor:
    """A tile: a name, an element type and a shape. Compared by identity."""

    name: str
    dtype: DType

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.shape)  # type: ignore[attr-defined]


@dataclass(frozen=True, eq=False)
class GlobalTensor(Tensor):
    """A view of global memory: ``pointer`` seen through ``layout`` (runtime sizes)."""

    pointer: Var
    layout: GlobalLayout

    @property
    def shape(self) -> tuple[Expr, ...]:
        """The symbolic shape."""
        return self.layout.shape

    def type_str(self) -> str:
        """``float16[M, K]`` style text."""
        return f"{self.dtype.name}[{', '.join(str(s) for s in self.shape)}]"


@dataclass(frozen=True, eq=False)
class SharedTensor(Tensor):
    """A tile in shared memory, stored at ``layout``'s offsets."""

    layout: SharedLayout

    @property
    def shape(self) -> tuple[int, ...]:
        """The tile's shape."""
        return self.layout.shape

    @property
    def nbytes(self) -> int:
        """Bytes of shared memory the tile occupies."""
        return math.ceil(self.layout.cosize * self.dtype.nbits / 8)

    def type_str(self) -> str:
        """``shared float16[64, 64]`` style text."""
        return f"shared {self.dtype.name}[{', '.join(map(str, self.shape))}]"


#: Builds the instruction of a Python operator on tiles (``a + b`` calls it with
#: ``("add", a, b)``). The authoring front end, which sits above the IR, installs it
#: (:func:`set_tile_operator`, from :mod:`lowvm.lang.ops`).
_tile_operator: Callable[..., RegisterTensor] | None = None


def set_tile_operator(fn: Callable[..., RegisterTensor]) -> None:
    """Make ``fn(op_name, *operands)`` what Python operators on register tiles call."""
    global _tile_operator
    _tile_operator = fn


@dataclass(frozen=True, eq=False)
class RegisterTensor(Tensor):
    """A tile in registers: element ``layout.logical_index(t, l)`` lives in thread t.

    ``layout`` is None while it is unknown: the author left it out and layout inference
    (:mod:`lowvm.passes.layout_inference`, run by every ``build``) has not assigned it
    yet. Checks that compare layouts wait until it is known.
    """

    shape: tuple[int, ...]
    layout: RegisterLayout | None

    def type_str(self) -> str:
        """``float32[16, 8] local(2, 1).spatial(8, 4).local(1, 2)`` style text."""
        layout = "<layout to infer>" if self.layout is None else str(self.layout)
        return f"{self.dtype.name}[{', '.join(map(str, self.shape))}] {layout}"

    # Python operators build VM instructions through the authoring front end.
    def _op(self, name: str, *args):
        if _tile_operator is None:
            raise ProgramError(f"the operator {name!r} on the tile {self.name} builds an "
                               "instruction: use it inside a @vm.program function "
                               "(lowvm.lang)")
        return _tile_operator(name, *args)

    def __add__(self, other):
        return self._op("add", self, other)

    def __radd__(self, other):
        return self._op("add", other, self)

    def __sub__(self, other):
        return self._op("sub", self, other)

    def __rsub__(self, other):
        return self._op("sub", other, self)

    def __mul__(self, other):
        return self._op("mul", self, other)

    def __rmul__(self, other):
        return self._op("mul", other, self)

    def __truediv__(self, other):
        return self._op("div", self, other)

    def __rtruediv__(self, other):
        return self._op("div", other, self)

    def __neg__(self):
        return self._op("neg", self)

    def __abs__(self):
        return self._op("abs", self)

    def __lt__(self, other):
        return self._op("lt", self, other)

    def __le__(self, other):
        return self._op("le", self, other)

    def __gt__(self, other):
        return self._op("gt", self, other)

    def __ge__(self, other):
        return self._op("ge", self, other)

    def __hash__(self) -> int:
        return id(self)

    def __eq__(self, other: object) -> bool:  # identity, not elementwise
        return self is other

    def __bool__(self) -> bool:
        raise ProgramError(
            f"the tile {self.name} has no single truth value; use vm.where(...) for "
            "elementwise choices"
        )


@dataclass(frozen=True, eq=False)
class BarrierTensor(Tensor):
    """``count`` mbarriers in shared memory, each waiting for ``arrivals`` arrivals (and
    the transaction bytes announced to it) per phase.

    Why a tile kind of its own: a barrier is not data. Instructions arrive on it, add
    expected bytes to it, or wait for one of its phases; nothing loads or stores it.
    ``bars[i]`` names barrier ``i`` (a runtime index: a pipeline's stage).
    """

    count: int
    arrivals: int

    @property
    def shape(self) -> tuple[int, ...]:
        """One barrier per element."""
        return (self.count,)

    @property
    def nbytes(self) -> int:
        """Bytes of shared memory the barriers occupy (8 each)."""
        return 8 * self.count

    def type_str(self) -> str:
        """``mbarrier[4] (arrivals 1)`` style text."""
        return f"mbarrier[{self.count}] (arrivals {self.arrivals})"

    def __getitem__(self, index: object) -> BarrierRef:
        return BarrierRef(self, as_expr(index))  # type: ignore[arg-type]


@dataclass(frozen=True)
class BarrierRef:
    """Barrier ``index`` of ``barriers`` (what ``bars[i]`` gives a program)."""

    barriers: BarrierTensor
    index: Expr

    def __str__(self) -> str:
        return f"%{self.barriers.name}[{self.index}]"


# ---------------------------------------------------------------------------------------
# parameters


@dataclass(frozen=True)
class PointerType:
    """The type of a pointer parameter: ``vm.ptr[vm.float16]``."""

    dtype: DType

    def __str__(self) -> str:
        return f"ptr<{self.dtype.name}>"


@dataclass(frozen=True)
class Param:
    """A runtime kernel parameter: a pointer or a scalar."""

    name: str
    type: PointerType | DType

    @property
    def is_pointer(self) -> bool:
        """True for pointer parameters."""
        return isinstance(self.type, PointerType)

    @property
    def var(self) -> Var:
        """The variable the body uses for this parameter."""
        return Var(self.name, "pointer" if self.is_pointer else self.type.name)  # type: ignore[union-attr]

    def __str__(self) -> str:
        return f"{self.name}: {self.type}"


# ---------------------------------------------------------------------------------------
# statements


class Stmt:
    """Base of statements."""

    __slots__ = ()


@dataclass(frozen=True)
class InstStmt(Stmt):
    """One VM instruction, executed by the whole block."""

    inst: Instruction


@dataclass(frozen=True)
class SeqStmt(Stmt):
    """Statements in order."""

    stmts: tuple[Stmt, ...]


@dataclass(frozen=True)
class ForStmt(Stmt):
    """``for var in range(start, stop, step)`` over uniform bounds.

    ``stages`` (S >= 2) asks :mod:`lowvm.passes.software_pipeline` to keep S - 1 of the
    loop's ``copy_async`` tiles in flight; the rewritten loop has ``stages=None``.
    """

    var: Var
    start: Expr
    stop: Expr
    step: Expr
    body: Stmt
    unroll: int | None = None
    loc: SourceLoc | None = field(default=None, compare=False)
    stages: int | None = None


@dataclass(frozen=True)
class IfStmt(Stmt):
    """``if cond: then_body else: else_body`` on a uniform condition."""

    cond: Expr
    then_body: Stmt
    else_body: Stmt | None = None
    loc: SourceLoc | None = field(default=None, compare=False)


@dataclass(frozen=True)
class LetStmt(Stmt):
    """Bind a uniform scalar ``var = value`` for the statements that follow."""

    var: Var
    value: Expr
    loc: SourceLoc | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Program:
    """A complete VM program: parameters, launch grid, warps per block and the body."""

    name: str
    params: tuple[Param, ...]
    grid: tuple[Expr, ...]
    num_warps: int
    body: Stmt
    constants: tuple[tuple[str, object], ...] = ()
    shared_bytes: int = 0
    #: occupancy hint: the compiler keeps registers low enough for this many resident
    #: blocks per SM (``__launch_bounds__``'s second argument); None = no hint
    min_blocks: int | None = None

    @property
    def num_threads(self) -> int:
        """Threads per block."""
        return self.num_warps * 32

    def instructions(self) -> Iterator[Instruction]:
        """Every instruction of the body, in program order."""
        for stmt in walk(self.body):
            if isinstance(stmt, InstStmt):
                yield stmt.inst

    def __str__(self) -> str:
        from lowvm.ir.printer import format_program

        return format_program(self)


def walk(stmt: Stmt) -> Iterator[Stmt]:
    """Pre-order traversal of a statement tree."""
    yield stmt
    if isinstance(stmt, SeqStmt):
        for s in stmt.stmts:
            yield from walk(s)
    elif isinstance(stmt, ForStmt):
        yield from walk(stmt.body)
    elif isinstance(stmt, IfStmt):
        yield from walk(stmt.then_body)
        if stmt.else_body is not None:
            yield from walk(stmt.else_body)


def seq(stmts: Sequence[Stmt]) -> Stmt:
    """A single statement for ``stmts`` (no nesting of one-element sequences)."""
    return stmts[0] if len(stmts) == 1 else SeqStmt(tuple(stmts))
