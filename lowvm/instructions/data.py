"""Data instructions: create register tiles, reinterpret bits, convert types, permute.

``view`` is how packed low-bit weights become values: each thread's registers are a bit
string (local 0 in the lowest bits, as on the GPU), read again as another type and
layout. ``cast`` converts values exactly per :mod:`lowvm.dtypes` (round to nearest even;
overflow is inf in types with inf and saturates in the others; float to integer rounds
to nearest even and clamps).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from lowvm.expr import Expr
from lowvm.instructions.base import BlockState, Instruction, register_instruction
from lowvm.instructions.values import quantize, reinterpret
from lowvm.ir import RegisterTensor
from lowvm.layouts import local_permutation, permute

__all__ = ["RegisterInit", "View", "Cast", "Permute", "Assign", "Extract", "ThreadIndex"]


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class RegisterInit(Instruction):
    """A register tile filled with ``value`` (rounded to the tile's type)."""

    mnemonic = "register_tensor"
    out: RegisterTensor
    value: Expr

    def interpret(self, st: BlockState) -> None:
        value = st.eval(self.value)
        lay = self.out.layout
        filled = np.full((lay.num_threads, lay.local_size), value)
        st.set(self.out, quantize(filled, self.out.dtype, saturate=False), inst=self)


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class View(Instruction):
    """Reinterpret each thread's registers of ``src`` as ``out``'s type and layout."""

    mnemonic = "view"
    out: RegisterTensor
    src: RegisterTensor

    def check(self) -> None:
        a, b = self.src, self.out
        if a.layout is None or b.layout is None:
            return  # checked again once layout inference has assigned them
        if a.layout.num_threads != b.layout.num_threads:
            raise self.error(
                f"%{a.name} is spread over {a.layout.num_threads} threads, the view over "
                f"{b.layout.num_threads}; a view never moves data between threads"
            )
        bits_a = a.layout.local_size * a.dtype.nbits
        bits_b = b.layout.local_size * b.dtype.nbits
        if bits_a != bits_b:
            raise self.error(
                f"each thread holds {a.layout.local_size} x {a.dtype.nbits} = {bits_a} bits "
                f"of %{a.name} but the view needs {b.layout.local_size} x {b.dtype.nbits} = "
                f"{bits_b} bits per thread"
            )

    def interpret(self, st: BlockState) -> None:
        st.set(self.out, reinterpret(st.get(self.src), self.src.dtype, self.out.dtype))
        st.note_renaming(self.out, self.src)


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class Cast(Instruction):
    """Convert values to another type (same layout, or with ``relayout`` the same
    elements per thread in another register order: a renaming, free on the GPU)."""

    mnemonic = "cast"
    out: RegisterTensor
    src: RegisterTensor
    #: ``out`` has its own layout (``vm.cast(..., layout=)``), a per-thread reordering of
    #: the source's; layout inference leaves the two untied
    relayout: bool = False

    def check(self) -> None:
        known = self.out.layout is not None and self.src.layout is not None
        if not known:
            return
        if not self.relayout and self.out.layout != self.src.layout:
            raise self.error("a cast keeps the layout of its source (pass layout= to reorder "
                             "each thread's registers)")
        if self.relayout and self.permutation() is None:
            raise self.error(
                f"cast layout={self.out.layout} must give every thread the elements it holds "
                f"in {self.src.layout}, reordered the same way in every thread")

    def permutation(self) -> np.ndarray | None:
        """``perm``: out's local ``l`` is the source's local ``perm[l]`` (None: not one)."""
        return local_permutation(self.src.layout, self.out.layout)

    def interpret(self, st: BlockState) -> None:
        values = st.get(self.src)
        if self.relayout:
            values = values[:, self.permutation()]
        st.set(self.out, quantize(values, self.out.dtype), check_range=False)


class _SameRegisters:
    """Instructions whose result is the source's registers, unchanged, in every thread."""

    out: RegisterTensor
    src: RegisterTensor

    def interpret(self, st: BlockState) -> None:
        st.set(self.out, st.get(self.src).copy())


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class Permute(_SameRegisters, Instruction):
    """Reorder the dims of a tile; each thread keeps its registers (free on the GPU)."""

    mnemonic = "permute"
    out: RegisterTensor
    src: RegisterTensor
    dims: tuple[int, ...]

    def interpret(self, st: BlockState) -> None:
        super().interpret(st)
        st.note_renaming(self.out, self.src)

    def check(self) -> None:
        if self.src.layout is None or self.out.layout is None:
            return  # checked again once layout inference has assigned them
        if self.out.layout != permute(self.src.layout, self.dims):
            raise self.error("the result layout must be the permuted source layout")



@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class Assign(_SameRegisters, Instruction):
    """Copy ``src`` into the existing tile ``out`` (same type, shape and layout)."""

    mnemonic = "assign"
    out: RegisterTensor
    src: RegisterTensor

    def check(self) -> None:
        a, b = self.src, self.out
        known = a.layout is not None and b.layout is not None
        if a.dtype != b.dtype or a.shape != b.shape or (known and a.layout != b.layout):
            raise self.error(
                f"cannot assign {a.type_str()} to {b.type_str()}: type, shape and layout "
                "must match"
            )



@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class Extract(Instruction):
    """The sub-tile of ``out``'s shape at the static ``offsets`` of ``src``, in ``out``'s
    layout, every thread taking its elements from its own registers of ``src``.

    Free on the GPU (the copies are register renamings once unrolled): a loop can run
    over the K slices of a tile converted in one piece, e.g. one ``dot`` per 16-deep
    slice of the MMA B operand. The layouts must agree: each thread must hold every
    element it extracts, at the same register in every thread.
    """

    mnemonic = "extract"
    out: RegisterTensor
    src: RegisterTensor
    offsets: tuple[int, ...]

    def local_map(self) -> np.ndarray:
        """``out``'s local ``l`` is ``src``'s local ``map[l]`` (the same in every thread)."""
        return _extract_map(self.src.layout, self.out.layout, self.offsets)

    def check(self) -> None:
        a, b = self.src, self.out
        if a.dtype != b.dtype or len(self.offsets) != a.rank or b.rank != a.rank:
            raise self.error(f"extracting {b.type_str()} at {list(self.offsets)} from "
                             f"{a.type_str()}: the type and rank must match, one offset per dim")
        if any(o < 0 or o + n > size for o, n, size in zip(self.offsets, b.shape, a.shape)):
            raise self.error(f"the {list(b.shape)} tile at {list(self.offsets)} is not inside "
                             f"%{a.name} of shape {list(a.shape)}")
        if a.dtype.nbits % 8:
            raise self.error(f"{a.dtype.name} elements share registers; extract whole-byte "
                             "tiles (cast or view first)")
        if a.layout is not None and b.layout is not None:
            found = self.local_map()
            if isinstance(found, str):
                raise self.error(found)

    def interpret(self, st: BlockState) -> None:
        st.set(self.out, st.get(self.src)[:, self.local_map()])
        st.note_renaming(self.out, self.src)


@lru_cache(maxsize=256)
def _extract_map(src, out, offsets: tuple[int, ...]):
    """:meth:`Extract.local_map`, or the reason there is none (a string); cached, as the
    interpreter asks once per block and step."""
    if src.num_threads != out.num_threads:
        return (f"the source is spread over {src.num_threads} threads, the result over "
                f"{out.num_threads}")
    wanted = np.ravel_multi_index(tuple(out.table[..., d] + o for d, o in enumerate(offsets)),
                                  src.shape)  # [T, L_out]: flat index in src
    held = src.flat_table  # [T, L_src]
    order = np.argsort(held[0], kind="stable")
    pos = np.searchsorted(held[0][order], wanted[0])
    found = (pos < held.shape[1]) & (held[0][order][np.minimum(pos, held.shape[1] - 1)]
                                      == wanted[0])
    if not found.all():
        return (f"thread 0 does not hold element {out.table[0, int(np.argmin(found))].tolist()}"
                f" + {list(offsets)} of the source (layouts {src} and {out})")
    local_map = order[pos]
    bad = np.flatnonzero((held[:, local_map] != wanted).any(axis=1))
    if bad.size:
        t = int(bad[0])
        missing = np.flatnonzero(~np.isin(wanted[t], held[t]))
        if missing.size:
            return (f"thread {t} does not hold element "
                    f"{out.table[t, int(missing[0])].tolist()} + {list(offsets)} of the "
                    f"source (layouts {src} and {out})")
        return (f"thread {t} holds the extracted elements at other registers than thread 0 "
                f"(layouts {src} and {out}); extract a tile whose layout is a slice of the "
                "source's")
    return local_map


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class ThreadIndex(Instruction):
    """Each thread's index in the block, as an int32 tile of layout spatial(threads)."""

    mnemonic = "thread_index"
    out: RegisterTensor

    def interpret(self, st: BlockState) -> None:
        st.set(self.out, np.arange(self.out.layout.num_threads, dtype=np.int64)[:, None])
