"""Atomic accumulation into global memory, ``dst[offsets + i] += src[i]``, and arrival
counters (:class:`Arrive`) that tell the last of several blocks it is the last.

Split-K GEMMs need it: several thread blocks own slices of the reduction dimension and
add their partial tiles into one float32 result. Blocks may add in any order, so only
the sum is defined (float32 addition order differs between runs by rounding); the
interpreter adds in block order. Out-of-bounds elements are skipped, as for stores.
A tile whose layout replicates elements would add them more than once, so replicated
layouts are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

from lowvm.dtypes import float32, int32
from lowvm.expr import Expr, Var
from lowvm.instructions.base import BlockState, Instruction, register_instruction
from lowvm.instructions.memory import (
    _check_offsets,
    _element_position,
    _global_positions,
)
from lowvm.ir import GlobalTensor, RegisterTensor

__all__ = ["AtomicAdd", "Arrive", "ATOMIC_TYPES"]

#: element types with a native ``atomicAdd``
ATOMIC_TYPES = (float32, int32)


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class AtomicAdd(Instruction):
    """Add a register tile into a global tensor at ``offsets``, element by element."""

    mnemonic = "atomic_add"
    dst: GlobalTensor
    src: RegisterTensor
    offsets: tuple[Expr, ...]

    def check(self) -> None:
        _check_offsets(self, self.offsets, self.dst.rank, "global tensor")
        if self.dst.dtype not in ATOMIC_TYPES or self.src.dtype != self.dst.dtype:
            raise self.error(
                f"adds {self.src.dtype.name} into {self.dst.dtype.name} %{self.dst.name}; "
                f"accepted: both {' or both '.join(t.name for t in ATOMIC_TYPES)}")
        if self.src.layout is not None and self.src.layout.replication != 1:  # after inference
            raise self.error(
                f"%{self.src.name} is replicated {self.src.layout.replication} times "
                f"(layout {self.src.layout}); each element would be added that often")

    def interpret(self, st: BlockState) -> None:
        flat, inside = _global_positions(st, self.dst, self.offsets, self.src.layout.table)
        buf = st.global_buffer(self.dst, self)
        where = flat[inside]
        total = buf.read(where) + st.get(self.src)[inside]
        buf.write(where, total)


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class Arrive(Instruction):
    """Count this block's arrival at ``counter[offsets]`` and bind how many came before.

    ``var`` (a uniform int) becomes the number of blocks that arrived at this counter
    before this one, ``0 .. count - 1``; the ``count``-th arrival resets the counter to 0,
    so the counter is ready for the next launch without a memset. Every global write the
    block made before (stores, ``atomic_add``) is visible to the block that arrives after
    it, which reads it with ``load_global(..., coherent=True)``: the fused reduction of
    split-K GEMMs (the last block of a tile converts and clears the workspace). The
    interpreter runs blocks in order, so there block ``i`` of a group sees ``i``.
    The counter must lie inside its tensor: the interpreter checks it, the GPU does not.
    """

    mnemonic = "arrive"
    counter: GlobalTensor
    offsets: tuple[Expr, ...]
    count: Expr
    var: Var

    def check(self) -> None:
        _check_offsets(self, self.offsets, self.counter.rank, "global tensor")
        if self.counter.dtype != int32:
            raise self.error(f"arrival counters are int32; %{self.counter.name} is "
                             f"{self.counter.dtype.name}")

    def interpret(self, st: BlockState) -> None:
        import numpy as np

        flat = _element_position(st, self, self.counter, self.offsets, "the counter")
        count = st.eval(self.count)
        if count < 1:
            raise st.runtime_error(self, f"count must be at least 1, got {count}")
        buf = st.global_buffer(self.counter, self)
        old = int(buf.read(flat)[0, 0])
        if not 0 <= old < count:
            raise st.runtime_error(self, f"the counter holds {old}, outside [0, {count}): "
                                   "it must start at 0 (it resets itself after each group)")
        buf.write(flat, np.array([[(old + 1) % count]]))
        st.env[self.var.name] = old
