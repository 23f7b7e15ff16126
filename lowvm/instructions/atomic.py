"""Atomic accumulation into global memory: ``dst[offsets + i] += src[i]``.

Split-K GEMMs need it: several thread blocks own slices of the reduction dimension and
add their partial tiles into one float32 result. Blocks may add in any order, so only
the sum is defined (float32 addition order differs between runs by rounding); the
interpreter adds in block order. Out-of-bounds elements are skipped, as for stores.
A tile whose layout replicates elements would add them more than once, so replicated
layouts are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from lowvm.dtypes import float32, int32
from lowvm.expr import Expr
from lowvm.instructions.base import Instruction, register_instruction
from lowvm.instructions.memory import _check_offsets, _global_positions, global_ref
from lowvm.ir import GlobalTensor, RegisterTensor

if TYPE_CHECKING:
    from lowvm.codegen.context import CudaContext
    from lowvm.interpreter.state import BlockState

__all__ = ["AtomicAdd", "ATOMIC_TYPES"]

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
        if self.src.layout.replication != 1:
            raise self.error(
                f"%{self.src.name} is replicated {self.src.layout.replication} times "
                f"(layout {self.src.layout}); each element would be added that often")

    def interpret(self, st: BlockState) -> None:
        flat, inside = _global_positions(st, self.dst, self.offsets, self.src.layout.table)
        buf = st.global_buffer(self.dst, self)
        where = flat[inside]
        total = buf.read(where) + st.get(self.src)[inside]
        buf.write(where, total)

    def emit_cuda(self, cg: CudaContext) -> None:
        cg.line(f"// {self}")
        lay = self.src.layout
        cg.line("#pragma unroll")
        with cg.block(f"for (int l = 0; l < {lay.local_size}; ++l)"):
            index = [cg.index(lay, d) for d in range(lay.rank)]
            ref, inside = global_ref(cg, self.dst, self.offsets, index)
            cg.line(f"if ({inside}) atomicAdd(&{ref}, {cg.raw_get(self.src, 'l')});")
