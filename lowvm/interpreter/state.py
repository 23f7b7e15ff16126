"""One thread block's state while the interpreter runs it.

Register tiles are stored *per thread*: an array ``[threads, locals]`` laid out by the
tile's register layout, exactly what each GPU thread would hold. Logical views
(:meth:`BlockState.to_logical`) are assembled from those registers, so a wrong layout
gives a wrong answer here as it would on the GPU.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from lowvm.expr import ExprLike, evaluate_int32
from lowvm.instructions.base import Instruction
from lowvm.interpreter.barriers import Mbarrier
from lowvm.interpreter.memory import GlobalBuffer, InterpretError, SharedStorage
from lowvm.ir import (
    BarrierTensor,
    GlobalTensor,
    ProgramError,
    RegisterTensor,
    SharedTensor,
    SourceLoc,
)

__all__ = ["BlockState"]


class BlockState:
    """Scalars, registers, shared tiles and async-copy groups of one block."""

    def __init__(self, env: Mapping[str, int | float], buffers: Mapping[str, GlobalBuffer],
                 block: tuple[int, ...], checked: bool = False, threads: int = 0) -> None:
        self.env: dict[str, int | float] = dict(env)
        #: report int32 overflow of index and loop arithmetic instead of wrapping it
        self.checked = checked
        self.buffers = buffers
        self.block = block
        #: the threads that execute the instructions (the block's)
        self.role_threads = threads
        self.barriers: dict[BarrierTensor, list[Mbarrier]] = {}
        #: a store_tma was issued and no store_tma_wait followed yet
        self.bulk_stores_pending = False
        self.registers: dict[RegisterTensor, np.ndarray] = {}
        self.globals: dict[GlobalTensor, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.shared_tiles: dict[SharedTensor, SharedStorage] = {}
        self.uncommitted: list[tuple[SharedStorage, np.ndarray]] = []
        self.groups: list[list[tuple[SharedStorage, np.ndarray]]] = []
        #: operands a and results of dot_shared calls issued with wait=False, and the
        #: shared storages they read, until dot_wait
        self.pending_operands: set[RegisterTensor] = set()
        self.pending_results: set[RegisterTensor] = set()
        self.pending_reads: list[SharedStorage] = []
        #: tiles that are other tiles' registers under new names (view, permute, extract):
        #: the GPU reads the source's registers where the program names the result
        self.renamed_from: dict[RegisterTensor, RegisterTensor] = {}

    # scalars and errors ---------------------------------------------------------------
    def eval(self, expr: ExprLike):
        """The value of a uniform scalar expression in this block, in the GPU's int32
        arithmetic (wrapped; reported instead in the checked mode)."""
        return evaluate_int32(expr, self.env, self.checked)

    def runtime_error(self, inst: Instruction, message: str) -> InterpretError:
        """An error at ``inst``'s source line, naming this block."""
        return InterpretError(f"{inst.mnemonic} in block {self.block}: {message}", inst.loc)

    def statement_error(self, what: str, loc: SourceLoc | None, message: str
                        ) -> InterpretError:
        """An error of a loop, branch or ``let`` (``what``) at its source line."""
        return InterpretError(f"{what} in block {self.block}: {message}", loc)

    # registers ----------------------------------------------------------------------
    def get(self, tensor: RegisterTensor) -> np.ndarray:
        """The per-thread registers ``[threads, locals]`` of ``tensor``."""
        try:
            return self.registers[tensor]
        except KeyError:
            raise ProgramError(
                f"the tile %{tensor.name} is read before any instruction wrote it"
            ) from None

    def set(self, tensor: RegisterTensor, data: np.ndarray, inst: Instruction | None = None,
            check_range: bool = True) -> None:
        """Store per-thread registers; integer values must fit the tile's type."""
        lay = tensor.layout
        data = np.broadcast_to(np.asarray(data), (lay.num_threads, lay.local_size))
        dt = tensor.dtype
        if check_range and dt.is_integer and data.size:
            lo, hi = int(data.min()), int(data.max())
            if lo < dt.min_value or hi > dt.max_value:
                bad = lo if lo < dt.min_value else hi
                message = (f"integer overflow: the value {bad} does not fit "
                           f"{dt.name} [{int(dt.min_value)}, {int(dt.max_value)}]")
                if inst is not None:
                    raise self.runtime_error(inst, message)
                raise ProgramError(message)
        self.registers[tensor] = np.array(data)

    def to_logical(self, tensor: RegisterTensor) -> np.ndarray:
        """The tile as a logical array, assembled from the threads' registers."""
        data = self.get(tensor)
        out = np.empty(int(np.prod(tensor.shape)), dtype=data.dtype)
        out[tensor.layout.flat_table] = data
        return out.reshape(tensor.shape)

    def set_logical(self, tensor: RegisterTensor, logical: np.ndarray,
                    inst: Instruction | None = None) -> None:
        """Distribute a logical array to the threads by the tile's layout."""
        flat = np.asarray(logical).reshape(-1)
        self.set(tensor, flat[tensor.layout.flat_table], inst)

    # global memory ------------------------------------------------------------------
    def bind_global(self, tensor: GlobalTensor) -> None:
        """Evaluate a global view's runtime shape and strides (int32 expressions in the
        kernel, as the offsets are)."""
        lay = tensor.layout
        self.globals[tensor] = (tuple(int(self.eval(s)) for s in lay.shape),
                                tuple(int(self.eval(s)) for s in lay.strides))

    def global_shape(self, tensor: GlobalTensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Concrete ``(shape, strides)`` of a global view."""
        if tensor not in self.globals:
            self.bind_global(tensor)
        return self.globals[tensor]

    def global_buffer(self, tensor: GlobalTensor, inst: Instruction) -> _BoundBuffer:
        """The memory behind a global view."""
        return _BoundBuffer(self.buffers[tensor.pointer.name], inst, self)

    # shared memory ------------------------------------------------------------------
    def alloc_shared(self, tensor: SharedTensor) -> None:
        """Fresh storage for a shared tile (its contents never written)."""
        self.shared_tiles[tensor] = SharedStorage(tensor)

    def free_shared(self, tensor: SharedTensor, inst: Instruction) -> None:
        """Release a shared tile."""
        storage = self.shared_tiles.pop(tensor, None)
        if storage is None:
            raise self.runtime_error(inst, f"%{tensor.name} is not allocated")
        if storage.bulk_reads.any():
            raise self.runtime_error(inst, f"%{tensor.name} is freed while a store_tma may "
                                     "still read it; vm.store_tma_wait() first")
        if storage.tensor_core_reads.any():
            raise self.runtime_error(inst, f"%{tensor.name} is freed while a dot_shared "
                                     "issued with wait=False may still read it; "
                                     "vm.dot_wait() first")

    # dot_shared without wait ------------------------------------------------------------
    @property
    def pending_tiles(self) -> set[RegisterTensor]:
        """Register tiles of dot_shared calls still in flight."""
        return self.pending_operands | self.pending_results

    def start_async_dot(self, a: RegisterTensor, out: RegisterTensor, storage: SharedStorage,
                        pos: np.ndarray) -> None:
        """A dot_shared issued without waiting: its tiles and shared reads stay busy."""
        while a is not None:  # the registers the tensor cores read: a's, and their sources'
            self.pending_operands.add(a)
            a = self.renamed_from.get(a)
        self.pending_results.add(out)
        storage.tensor_core_reads[pos] = True
        self.pending_reads.append(storage)

    def note_renaming(self, out: RegisterTensor, src: RegisterTensor) -> None:
        """``out`` is ``src``'s registers under new names (see ``renamed_from``)."""
        self.renamed_from[out] = src

    def check_not_pending(self, inst: Instruction) -> None:
        """Raise if ``inst`` writes the registers a dot_shared still in flight reads (its
        ``a`` or what ``a`` renames), or uses its result at all; another dot_shared may
        accumulate into that result (the tensor cores run them in order)."""
        out = inst.output()
        chained = getattr(inst, "chains", lambda: ())()
        busy = [t for t in inst.operands() if t in self.pending_results and t not in chained]
        if out is not None and (out in self.pending_operands
                                or (out in self.pending_results and out not in chained)):
            busy.append(out)
        if busy:
            raise self.runtime_error(
                inst, f"uses %{busy[0].name} while a dot_shared issued with wait=False may "
                "still read or write it; vm.dot_wait() first")

    def wait_async_dots(self) -> None:
        """dot_wait: every dot_shared issued so far has completed."""
        self.pending_operands.clear()
        self.pending_results.clear()
        for storage in self.pending_reads:
            storage.tensor_core_reads[:] = False
        self.pending_reads.clear()

    def shared(self, tensor: SharedTensor, inst: Instruction) -> SharedStorage:
        """The storage of an allocated shared tile."""
        try:
            return self.shared_tiles[tensor]
        except KeyError:
            raise self.runtime_error(
                inst, f"the shared tile %{tensor.name} is used after free_shared (or before "
                "its allocation)") from None

    # mbarriers ------------------------------------------------------------------------
    def alloc_barriers(self, tensor: BarrierTensor) -> None:
        """Fresh barriers, each waiting for its first phase."""
        first = sum(len(b) for b in self.barriers.values())
        self.barriers[tensor] = [Mbarrier(first + i, f"%{tensor.name}[{i}]", tensor.arrivals)
                                 for i in range(tensor.count)]

    def barrier(self, tensor: BarrierTensor, index, inst: Instruction) -> Mbarrier:
        """Barrier ``index`` of ``tensor`` (its runtime index checked)."""
        bars = self.barriers.get(tensor)
        if bars is None:
            raise self.runtime_error(inst, f"%{tensor.name} is used before vm.mbarriers "
                                     "allocated it")
        i = self.eval(index)
        if not 0 <= i < len(bars):
            raise self.runtime_error(inst, f"barrier index {i} is outside %{tensor.name}, "
                                     f"which holds {len(bars)} barriers (0..{len(bars) - 1})")
        return bars[i]

    def wait_barrier(self, tensor: BarrierTensor, index, parity, inst: Instruction) -> None:
        """``mbarrier_wait``: return if the phase of ``parity`` completed, making the
        bytes of the copies that completed it readable; else nothing can complete it
        (one stream of instructions runs): a deadlock."""
        barrier = self.barrier(tensor, index, inst)
        p = self.eval(parity)
        if p not in (0, 1):
            raise self.runtime_error(inst, f"parity must be 0 or 1, got {p}")
        if not barrier.done(p):
            raise self.runtime_error(
                inst, f"deadlock: the wait for the phase of parity {p} of {barrier.name} "
                f"never returns ({barrier.describe()}) and no other instruction can run "
                "before it")
        for storage in self.shared_tiles.values():
            storage.observe(barrier.uid, barrier.completed)

    # asynchronous copies ------------------------------------------------------------
    def add_async_copy(self, storage: SharedStorage, pos: np.ndarray) -> None:
        """Record a copy_async for the next commit_group."""
        self.uncommitted.append((storage, pos))

    def commit_group(self) -> None:
        """Close the open group of async copies."""
        self.groups.append(self.uncommitted)
        self.uncommitted = []

    def wait_group(self, n: int) -> None:
        """Complete the oldest groups until at most ``n`` remain in flight."""
        while len(self.groups) > n:
            for storage, pos in self.groups.pop(0):
                storage.land(pos)

    def sync(self) -> None:
        """Block barrier."""
        for storage in self.shared_tiles.values():
            storage.sync()


class _BoundBuffer:
    """A global buffer together with the instruction using it (for error messages)."""

    def __init__(self, buffer: GlobalBuffer, inst: Instruction, st: BlockState) -> None:
        self.buffer, self.inst, self.st = buffer, inst, st

    def read(self, offsets: np.ndarray) -> np.ndarray:
        return self.buffer.read(offsets, self.inst, self.st)

    def write(self, offsets: np.ndarray, values: np.ndarray) -> None:
        self.buffer.write(offsets, values, self.inst, self.st)
