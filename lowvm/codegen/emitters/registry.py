"""Which function writes the CUDA of an instruction: one emitter per instruction class,
and one per (instruction class, implementation) the passes may select (``inst.impl``).

Emitters register themselves with :func:`register_emitter`; :func:`emit_instruction`
looks one up for an instruction, preferring the emitter of its selected implementation
and falling back to the class's generic (per-element, always correct) one. Instructions
know nothing of CUDA: adding a lowering means adding an emitter here, not a method there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lowvm.codegen.context import CudaContext
from lowvm.instructions.base import Instruction
from lowvm.ir import ProgramError

__all__ = ["Emitter", "EMITTERS", "register_emitter", "emitter_for", "emit_instruction",
           "emit_generic"]

#: ``emit(inst, cg)``: append the CUDA of ``inst`` to ``cg``
Emitter = Callable[[Instruction, CudaContext], None]
_E = TypeVar("_E", bound=Emitter)

#: (instruction class, implementation class or None for the generic code) -> emitter
EMITTERS: dict[tuple[type, type | None], Emitter] = {}


def register_emitter(*classes: type, impl: type | None = None) -> Callable[[_E], _E]:
    """Decorator: ``fn`` emits instances of ``classes`` (whose ``impl`` is an ``impl``,
    or the generic code when ``impl`` is None)."""

    def wrap(fn: _E) -> _E:
        for cls in classes:
            key = (cls, impl)
            if key in EMITTERS:
                raise ValueError(f"two emitters for {cls.__name__} "
                                 f"({getattr(impl, '__name__', 'generic')})")
            EMITTERS[key] = fn
        return fn

    return wrap


def emitter_for(inst: Instruction, impl: type | None) -> Emitter | None:
    """The emitter of ``inst``'s class (or the nearest base class) for ``impl``."""
    for cls in type(inst).__mro__:
        found = EMITTERS.get((cls, impl))
        if found is not None:
            return found
    return None


def emit_generic(inst: Instruction, cg: CudaContext) -> None:
    """The generic code of ``inst``, whatever implementation was selected."""
    emit = emitter_for(inst, None)
    if emit is None:
        raise ProgramError(f"{inst.mnemonic} cannot be lowered to CUDA yet", inst.loc)
    emit(inst, cg)


def emit_instruction(inst: Instruction, cg: CudaContext) -> None:
    """The CUDA of ``inst``: its selected implementation's where one is registered, else
    the generic code."""
    if inst.impl is not None:
        emit = emitter_for(inst, type(inst.impl))
        if emit is not None:
            emit(inst, cg)
            return
    emit_generic(inst, cg)
