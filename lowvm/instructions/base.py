"""What every VM instruction is: an IR node that checks itself and runs on the CPU.

An instruction is a frozen dataclass. Its tensor-valued fields are its operands; the
field ``out`` (when present) is the tile it writes. ``check`` validates it when the
program is built, so mistakes surface at the user's source line; ``interpret`` gives its
exact meaning on the CPU through the interpreter's block state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import lru_cache
from typing import Any, ClassVar

import numpy as np

from lowvm.ir import ProgramError, RegisterTensor, SourceLoc, Tensor
from lowvm.layouts import RegisterLayout

__all__ = ["Instruction", "INSTRUCTIONS", "register_instruction", "gather_map", "BlockState"]

#: What ``interpret`` runs on: the interpreter's state of one thread block
#: (:class:`lowvm.interpreter.state.BlockState`). Named, not imported: the interpreter
#: sits above the instructions, which use the state only through its methods.
BlockState = Any

#: Every instruction class by mnemonic: the one place that lists the VM's instructions.
INSTRUCTIONS: dict[str, type[Instruction]] = {}


def register_instruction(cls: type[Instruction]) -> type[Instruction]:
    """Class decorator: record ``cls`` in :data:`INSTRUCTIONS` under its mnemonic."""
    INSTRUCTIONS[cls.mnemonic] = cls
    return cls


@dataclass(frozen=True, eq=False, kw_only=True)
class Instruction:
    """Base of VM instructions (see module docstring)."""

    mnemonic: ClassVar[str] = "instruction"
    loc: SourceLoc | None = field(default=None, repr=False)
    #: How the lowering implements this instruction, chosen by the vectorization and
    #: instruction-selection passes (None: the generic per-element code).
    impl: object = field(default=None, repr=False)

    def output(self) -> Tensor | None:
        """The tile this instruction writes (its ``out`` field), if any."""
        return getattr(self, "out", None)

    def operands(self) -> tuple[Tensor, ...]:
        """The tiles this instruction reads."""
        found = []
        for f in fields(self):
            if f.name == "out":
                continue
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                found.append(value)
            elif isinstance(value, tuple):
                found.extend(v for v in value if isinstance(v, Tensor))
        return tuple(found)

    def error(self, message: str) -> ProgramError:
        """A :class:`ProgramError` at this instruction's source line."""
        return ProgramError(f"{self.mnemonic}: {message}", self.loc)

    def check(self) -> None:
        """Raise :class:`ProgramError` if the instruction is ill-formed."""

    def interpret(self, st: BlockState) -> None:
        """Execute on the CPU for one thread block."""
        raise NotImplementedError(f"{type(self).__name__} has no CPU semantics")

    def format_args(self) -> str:
        """The operands and attributes as text, for the printer."""
        parts = []
        for f in fields(self):
            if f.name in ("out", "loc", "impl"):
                continue
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                parts.append(f"%{value.name}")
            elif isinstance(value, tuple):
                parts.append(f"{f.name}=[" + ", ".join(
                    f"%{v.name}" if isinstance(v, Tensor) else str(v) for v in value) + "]")
            elif value is not None:
                parts.append(f"{f.name}={value}")
        return ", ".join(parts)

    def __str__(self) -> str:
        out = self.output()
        lhs = f"%{out.name}: {out.type_str()} = " if out is not None else ""  # type: ignore[attr-defined]
        impl = f"  [{self.impl}]" if self.impl is not None else ""
        return f"{lhs}{self.mnemonic} {self.format_args()}{impl}"


@lru_cache(maxsize=512)
def _gather_cached(
    out_layout: RegisterLayout, operand_layout: RegisterLayout, operand_shape: tuple[int, ...]
) -> np.ndarray | tuple[int, int, tuple[int, ...]]:
    idx = np.array(out_layout.table)  # [T, L, rank]
    for d, s in enumerate(operand_shape):
        if s == 1:
            idx[..., d] = 0
    flat = np.ravel_multi_index(tuple(idx[..., d] for d in range(idx.shape[-1])), operand_shape)
    threads = operand_layout.num_threads
    inverse = np.full((threads, int(np.prod(operand_shape))), -1, dtype=np.int64)
    t = np.arange(threads)[:, None]
    inverse[t, operand_layout.flat_table] = np.arange(operand_layout.local_size)[None, :]
    gathered = inverse[np.arange(out_layout.num_threads)[:, None], flat]
    missing = np.argwhere(gathered < 0)
    if missing.size:
        t0, l0 = (int(v) for v in missing[0])
        return (t0, l0, tuple(int(v) for v in idx[t0, l0]))
    gathered.setflags(write=False)
    return gathered


def gather_map(result: RegisterTensor, operand: RegisterTensor, what: str) -> np.ndarray:
    """For each (thread, local) of ``result``, the local of ``operand`` holding its input.

    Broadcast dims (size 1) of ``operand`` repeat. Each thread may only read its own
    registers, so an operand element the thread does not hold is a layout mismatch.
    """
    if result.layout.num_threads != operand.layout.num_threads:
        raise ProgramError(
            f"{what}: %{operand.name} is spread over {operand.layout.num_threads} threads "
            f"but the result over {result.layout.num_threads}"
        )
    found = _gather_cached(result.layout, operand.layout, tuple(operand.shape))
    if isinstance(found, tuple):
        t0, l0, index = found
        raise ProgramError(
            f"{what}: layout mismatch: thread {t0} computes element {index} (its local "
            f"{l0}) of the result but does not hold it in %{operand.name} "
            f"(layout {operand.layout} vs result layout {result.layout}); convert one "
            "of them (e.g. through shared memory) or give them the same layout"
        )
    return found
