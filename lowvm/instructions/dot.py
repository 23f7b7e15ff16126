"""Tile matrix multiply with accumulation: ``out = a @ b + c`` (:class:`Dot`, both operands
in registers) and ``out = a @ tile^T + c`` (:class:`DotShared`, ``b`` read from shared
memory by the tensor cores: Hopper's ``wgmma``).

f16/bf16 operands accumulate in float32, int8/uint8 in int32 (the tensor cores'
types). The interpreter forms the exact products and sums in float64 (int64) and rounds
once to the accumulator type; the GPU's fp32 accumulation order differs by at most
float32 rounding, which the GPU tests allow for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lowvm.dtypes import bfloat16, float16, float32, int8, int32, uint8
from lowvm.expr import Expr
from lowvm.instructions.base import BlockState, Instruction, register_instruction
from lowvm.instructions.memory import _check_shared_tile, _shared_positions
from lowvm.instructions.values import quantize
from lowvm.ir import RegisterTensor, SharedTensor

__all__ = ["Dot", "DotShared", "DotWait", "DOT_TYPES", "SHARED_DOT_TYPES"]

#: operand type -> accumulator type
DOT_TYPES = {float16: float32, bfloat16: float32, int8: int32, uint8: int32}
#: operand types of :class:`DotShared` (``wgmma`` with a register A: 16-bit floats)
SHARED_DOT_TYPES = {float16: float32, bfloat16: float32}


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class Dot(Instruction):
    """``out[M, N] = a[M, K] @ b[K, N] + c[M, N]``."""

    mnemonic = "dot"
    out: RegisterTensor
    a: RegisterTensor
    b: RegisterTensor
    c: RegisterTensor

    def check(self) -> None:
        a, b, c = self.a, self.b, self.c
        if a.rank != 2 or b.rank != 2 or c.rank != 2:
            raise self.error("a, b and c must be 2-D tiles")
        (m, k), (k2, n) = a.shape, b.shape
        if k != k2 or c.shape != (m, n):
            raise self.error(
                f"shape mismatch: a {list(a.shape)} @ b {list(b.shape)} + c "
                f"{list(c.shape)}; need a [M, K], b [K, N], c [M, N]"
            )
        if a.dtype != b.dtype or a.dtype not in DOT_TYPES:
            raise self.error(
                f"operand types {a.dtype.name} and {b.dtype.name} are not supported; "
                f"accepted: both {', '.join(t.name for t in DOT_TYPES)}"
            )
        acc = DOT_TYPES[a.dtype]
        if c.dtype != acc or self.out.dtype != acc:
            raise self.error(
                f"{a.dtype.name} operands accumulate in {acc.name}; c is {c.dtype.name}"
            )
        known = self.out.layout is not None and c.layout is not None
        if known and self.out.layout != c.layout:
            raise self.error("the result has the layout of c")

    def interpret(self, st: BlockState) -> None:
        a = st.to_logical(self.a)
        b = st.to_logical(self.b)
        c = st.to_logical(self.c)
        st.set_logical(self.out, quantize(a @ b + c, self.out.dtype, saturate=False), inst=self)


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class DotShared(Instruction):
    """``out[M, N] = a[M, K] @ tile^T + c[M, N]``, ``tile`` the ``[N, K]`` tile of the shared
    tensor ``b`` at ``offsets`` (rank-reducing as ``load_shared``).

    Why a second dot: on Hopper the tensor cores read an operand straight from shared
    memory (``wgmma``), so ``b`` never passes through registers and is read once per
    warpgroup instead of once per warp. ``b`` stored K-contiguous (``tile[n, k]``) is the
    layout activations ``x[M, K]`` already have, so ``y^T = W @ x^T`` takes dequantised
    weights as the register operand and ``x`` as it was copied in. The lowering
    (instruction selection) uses ``wgmma`` where the layouts are its fragments and ``b``
    is a 128-byte-swizzled tile of 64 16-bit columns; else per-element code.
    """

    mnemonic = "dot_shared"
    out: RegisterTensor
    a: RegisterTensor
    b: SharedTensor
    offsets: tuple[Expr, ...]
    shape: tuple[int, int]  # the tile [N, K] of b
    c: RegisterTensor
    #: False: the call may return before the multiply completes; ``a``, the result and the
    #: tile stay busy until ``dot_wait`` (the interpreter rejects any use before it). The
    #: wgmma lowering still waits at the call (see ``codegen/emitters/dot_selected.py``)
    wait: bool = True

    def check(self) -> None:
        a, c, (n, k) = self.a, self.c, self.shape
        if a.rank != 2 or c.rank != 2:
            raise self.error("a and c must be 2-D tiles")
        _check_shared_tile(self, self.b, self.offsets, self.shape)
        m, ka = a.shape
        if ka != k or c.shape != (m, n):
            raise self.error(
                f"shape mismatch: a {list(a.shape)} @ tile^T (tile {[n, k]}) + c "
                f"{list(c.shape)}; need a [M, K], tile [N, K], c [M, N]")
        if a.dtype != self.b.dtype or a.dtype not in SHARED_DOT_TYPES:
            raise self.error(
                f"operand types {a.dtype.name} and {self.b.dtype.name} are not supported; "
                f"accepted: both {', '.join(t.name for t in SHARED_DOT_TYPES)}")
        acc = SHARED_DOT_TYPES[a.dtype]
        if c.dtype != acc or self.out.dtype != acc:
            raise self.error(f"{a.dtype.name} operands accumulate in {acc.name}; c is "
                             f"{c.dtype.name}")
        if a.layout is None or c.layout is None:
            raise self.error("a and c need layouts (e.g. lowvm.layouts.wgmma_layouts)")
        if self.out.layout is not None and self.out.layout != c.layout:
            raise self.error("the result has the layout of c")

    def tile_positions(self, st: BlockState) -> np.ndarray:
        """Storage offsets of the ``[N, K]`` tile, as every thread reads them."""
        n, k = self.shape
        idx = np.stack(np.meshgrid(np.arange(n), np.arange(k), indexing="ij"), -1)
        threads = self.a.layout.num_threads
        table = np.broadcast_to(idx.reshape(1, n * k, 2), (threads, n * k, 2))
        return _shared_positions(self, st, self.b, self.offsets, table)

    def interpret(self, st: BlockState) -> None:
        a = st.to_logical(self.a)
        c = st.to_logical(self.c)
        n, k = self.shape
        pos = self.tile_positions(st)
        storage = st.shared(self.b, self)
        tile = storage.read(pos, self, st)[0].reshape(n, k)
        st.set_logical(self.out, quantize(a @ tile.T + c, self.out.dtype, saturate=False),
                       inst=self)
        if not self.wait:
            st.start_async_dot(self.a, self.out, storage, pos[0])

    def chains(self) -> tuple[RegisterTensor, ...]:
        """Tiles this call may take while earlier calls without wait are in flight: their
        accumulator (``wgmma`` into one accumulator runs in issue order)."""
        return (self.c, self.out)


@register_instruction
@dataclass(frozen=True, eq=False, kw_only=True)
class DotWait(Instruction):
    """Wait until every ``dot_shared`` issued with ``wait=False`` has completed: their
    results are readable and their operands and shared tiles free again.

    ``tiles``: the register tiles those calls read or wrote (their ``a`` operands, or the
    tiles ``a`` renames, and the accumulator). The lowering keeps these registers in use
    until the wait (an empty ``asm`` that reads and writes them), so the compiler cannot
    give them to values computed while the tensor cores still read them."""

    mnemonic = "dot_wait"
    tiles: tuple[RegisterTensor, ...] = ()

    def interpret(self, st: BlockState) -> None:
        st.wait_async_dots()

    def chains(self) -> tuple[RegisterTensor, ...]:
        """The wait itself may name the results in flight."""
        return self.tiles
