"""The interpreter's memories: global buffers bound to user arrays, checked shared tiles.

:class:`GlobalBuffer` reads and writes the caller's numpy array or CPU torch tensor in
place (bfloat16 through its bit pattern), refusing any offset outside it.
:class:`SharedStorage` keeps, next to each shared element's value, the state a race
detector needs: never written, written by one thread and not yet synced, in flight in an
async copy, landed but not synced, or visible to all; and who read it since the last
barrier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from lowvm.dtypes import DType, bfloat16
from lowvm.instructions.values import from_codes, to_codes
from lowvm.ir import ProgramError, SharedTensor

if TYPE_CHECKING:
    from lowvm.instructions.base import Instruction
    from lowvm.interpreter.state import BlockState

__all__ = ["GlobalBuffer", "SharedStorage", "InterpretError", "bind_pointer"]


class InterpretError(ProgramError):
    """A program that went wrong while running in the interpreter (race, bad access)."""


_NUMPY_NAMES = {
    "float16": "float16",
    "float32": "float32",
    "int32": "int32",
    "int8": "int8",
    "uint8": "uint8",
    "bfloat16": "bfloat16",
}


class GlobalBuffer:
    """A flat, writable view of one pointer argument's memory."""

    def __init__(self, name: str, dtype: DType, flat: np.ndarray, as_bits: bool) -> None:
        self.name, self.dtype, self.flat, self.as_bits = name, dtype, flat, as_bits

    def _check(self, offsets: np.ndarray, inst: Instruction, st: BlockState) -> None:
        if offsets.size and (offsets.min() < 0 or offsets.max() >= self.flat.size):
            bad = offsets[(offsets < 0) | (offsets >= self.flat.size)][0]
            raise st.runtime_error(
                inst,
                f"reads or writes element {int(bad)} of the argument {self.name!r}, which "
                f"has {self.flat.size} elements: the global view is larger than the array "
                "passed in",
            )

    def read(self, offsets: np.ndarray, inst: Instruction, st: BlockState) -> np.ndarray:
        """Values at flat ``offsets``, in storage form."""
        self._check(offsets, inst, st)
        raw = self.flat[offsets]
        if self.as_bits:
            return from_codes(raw.view(np.uint16).astype(np.uint64), self.dtype)
        return raw.astype(np.float64 if self.dtype.is_float else np.int64)

    def write(self, offsets: np.ndarray, values: np.ndarray, inst: Instruction,
              st: BlockState) -> None:
        """Store ``values`` (exactly representable) at flat ``offsets``."""
        self._check(offsets, inst, st)
        if self.as_bits:
            self.flat[offsets] = to_codes(values, self.dtype).astype(np.uint16).view(
                self.flat.dtype)
        else:
            self.flat[offsets] = values.astype(self.flat.dtype)


def bind_pointer(name: str, dtype: DType, arg: Any) -> GlobalBuffer:
    """Wrap the user's array for pointer parameter ``name`` of element type ``dtype``."""
    what = f"argument {name!r} (ptr<{dtype.name}>)"
    if hasattr(arg, "detach") and hasattr(arg, "device"):  # torch tensor
        if arg.device.type != "cpu":
            raise ProgramError(
                f"{what}: the interpreter runs on the CPU; got a tensor on {arg.device}. "
                "Pass tensor.cpu() (and copy results back)"
            )
        if not arg.is_contiguous():
            raise ProgramError(f"{what}: the tensor must be contiguous (call .contiguous())")
        import torch

        tensor = arg.detach()
        if tensor.dtype == torch.bfloat16:
            if dtype != bfloat16:
                raise ProgramError(f"{what}: got a bfloat16 tensor; need {dtype.name}")
            return GlobalBuffer(name, dtype, tensor.view(torch.int16).numpy().reshape(-1), True)
        arr = tensor.numpy()
    elif isinstance(arg, np.ndarray):
        arr = arg
    else:
        raise ProgramError(
            f"{what}: expected a numpy array or CPU torch tensor, got {type(arg).__name__}"
        )
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        raise ProgramError(f"{what}: the array must be C-contiguous and writeable")
    expected = _NUMPY_NAMES.get(dtype.name)
    if arr.dtype.name != expected:
        raise ProgramError(
            f"{what}: got an array of {arr.dtype.name}; accepted: {expected} arrays"
            + (" (pack low-bit values into uint8 with lowvm.dtypes.pack)"
               if dtype.nbits < 8 else "")
        )
    flat = arr.reshape(-1)
    if dtype == bfloat16:
        return GlobalBuffer(name, dtype, flat.view(np.int16), True)
    return GlobalBuffer(name, dtype, flat, False)


# shared element states (SIGNALLED: written by a copy that signals an mbarrier, readable
# once a wait saw the phase it completed)
UNINIT, VISIBLE, WRITTEN, IN_FLIGHT, LANDED, SIGNALLED = range(6)
_NOBODY = np.iinfo(np.int32).max


class SharedStorage:
    """Values and visibility of one shared tile, for one thread block."""

    def __init__(self, tensor: SharedTensor) -> None:
        size = max(tensor.layout.cosize, int(tensor.layout.offsets().max()) + 1)
        self.tensor = tensor
        self.values = np.zeros(size, dtype=np.float64 if tensor.dtype.is_float else np.int64)
        self.state = np.full(size, UNINIT, dtype=np.int8)
        self.writer_min = np.full(size, _NOBODY, dtype=np.int32)
        self.writer_max = np.full(size, -1, dtype=np.int32)
        self.reader_min = np.full(size, _NOBODY, dtype=np.int32)
        self.reader_max = np.full(size, -1, dtype=np.int32)
        #: read by a dot_shared still in flight (no dot_wait yet): no write may touch it
        self.tensor_core_reads = np.zeros(size, dtype=bool)
        #: read by a store_tma not yet waited for (store_tma_wait): no write may touch it
        self.bulk_reads = np.zeros(size, dtype=bool)
        #: for SIGNALLED elements: the barrier (uid) and the phase their copy completes
        self.signal_barrier = np.full(size, -1, dtype=np.int64)
        self.signal_phase = np.full(size, -1, dtype=np.int64)
        self.barrier_names: dict[int, str] = {}

    def _fail(self, inst: Instruction, st: BlockState, mask: np.ndarray, pos: np.ndarray,
              message: str) -> None:
        where = np.argwhere(mask)[0]
        thread = int(where[0]) if mask.ndim == 2 else None
        offset = int(pos[tuple(where)])
        who = f"thread {thread} " if thread is not None else ""
        raise st.runtime_error(
            inst, f"{who}{message} (shared %{self.tensor.name}, element offset {offset})"
        )

    def read(self, pos: np.ndarray, inst: Instruction, st: BlockState) -> np.ndarray:
        """Values at ``pos`` ([threads, locals]), checking each read is visible."""
        state = self.state[pos]
        threads = np.broadcast_to(np.arange(pos.shape[0], dtype=np.int32)[:, None], pos.shape)
        if (state == UNINIT).any():
            self._fail(inst, st, state == UNINIT, pos, "reads shared memory never written")
        if (state == IN_FLIGHT).any():
            self._fail(inst, st, state == IN_FLIGHT, pos,
                       "reads data of a copy_async not yet completed: commit_group, "
                       "wait_group and sync before reading")
        if (state == SIGNALLED).any():
            first = pos[state == SIGNALLED].ravel()[0]
            name = self.barrier_names.get(int(self.signal_barrier[first]), "its barrier")
            self._fail(inst, st, state == SIGNALLED, pos,
                       f"reads data of a copy_tma or copy_bulk before an mbarrier_wait on "
                       f"{name} returned for the phase its bytes complete (phase "
                       f"{int(self.signal_phase[first])})")
        if (state == LANDED).any():
            self._fail(inst, st, state == LANDED, pos,
                       "reads data of a copy_async after wait_group but before a sync; "
                       "add vm.sync() so every thread sees every thread's copies")
        foreign = (state == WRITTEN) & ~(
            (self.writer_min[pos] == threads) & (self.writer_max[pos] == threads)
        )
        if foreign.any():
            t = int(np.argwhere(foreign)[0][0])
            writer = int(self.writer_min[pos][foreign][0])
            self._fail(inst, st, foreign, pos,
                       f"reads shared memory that thread {writer} wrote without a sync in "
                       f"between (thread {t} reading); add vm.sync() after the store")
        np.minimum.at(self.reader_min, pos.ravel(), threads.ravel())
        np.maximum.at(self.reader_max, pos.ravel(), threads.ravel())
        return self.values[pos]

    def _check_overwrite(self, pos: np.ndarray, threads: np.ndarray | None,
                         inst: Instruction, st: BlockState) -> None:
        if self.tensor_core_reads[pos].any():
            self._fail(inst, st, self.tensor_core_reads[pos], pos,
                       "overwrites shared memory that a dot_shared issued with wait=False "
                       "may still be reading; vm.dot_wait() first")
        if self.bulk_reads[pos].any():
            self._fail(inst, st, self.bulk_reads[pos], pos,
                       "overwrites shared memory that a store_tma may still be reading; "
                       "vm.store_tma_wait() first")
        if (self.state[pos] == IN_FLIGHT).any():
            self._fail(inst, st, self.state[pos] == IN_FLIGHT, pos,
                       "overwrites shared memory that a copy_async is still writing")
        if (self.state[pos] == SIGNALLED).any():
            self._fail(inst, st, self.state[pos] == SIGNALLED, pos,
                       "overwrites shared memory that a copy_tma or copy_bulk may still be "
                       "writing (no mbarrier_wait saw its phase complete)")
        read = self.reader_max[pos] >= 0
        if threads is None:
            conflict = read
        else:
            conflict = read & ~((self.reader_min[pos] == threads) &
                                (self.reader_max[pos] == threads))
        if conflict.any():
            self._fail(inst, st, conflict, pos,
                       "overwrites shared memory that another thread read since the last "
                       "sync (write-after-read race); add vm.sync() before the write")
        if threads is not None:
            written = (self.state[pos] == WRITTEN) & ~(
                (self.writer_min[pos] == threads) & (self.writer_max[pos] == threads))
            if written.any():
                self._fail(inst, st, written, pos,
                           "overwrites shared memory that another thread wrote since the "
                           "last sync (write-after-write race); add vm.sync() between the "
                           "writes")

    def write(self, pos: np.ndarray, values: np.ndarray, inst: Instruction,
              st: BlockState) -> None:
        """Thread t writes ``values[t]`` at ``pos[t]``."""
        threads = np.broadcast_to(np.arange(pos.shape[0], dtype=np.int32)[:, None], pos.shape)
        self._check_overwrite(pos, threads, inst, st)
        self.values[pos] = values
        flat, who = pos.ravel(), threads.ravel()
        fresh = self.state[flat] != WRITTEN
        self.writer_min[flat[fresh]] = _NOBODY
        self.writer_max[flat[fresh]] = -1
        np.minimum.at(self.writer_min, flat, who)
        np.maximum.at(self.writer_max, flat, who)
        self.state[flat] = WRITTEN

    def copy_async(self, pos: np.ndarray, values: np.ndarray, inst: Instruction,
                   st: BlockState) -> None:
        """Start an asynchronous copy of ``values`` to ``pos``."""
        self._check_overwrite(pos, None, inst, st)
        self.values[pos] = values
        self.state[pos] = IN_FLIGHT
        st.add_async_copy(self, pos)

    def copy_signalled(self, pos: np.ndarray, values: np.ndarray, inst: Instruction,
                       st: BlockState, barrier: Any, phase: int) -> None:
        """A copy that signals ``barrier`` (an interpreter Mbarrier) wrote ``values`` at
        ``pos``; readable once a wait saw ``phase`` complete."""
        self._check_overwrite(pos, None, inst, st)
        self.values[pos] = values
        self.state[pos] = SIGNALLED
        self.signal_barrier[pos] = barrier.uid
        self.signal_phase[pos] = phase
        self.barrier_names[barrier.uid] = barrier.name

    def observe(self, uid: int, completed: int) -> None:
        """A wait saw barrier ``uid`` complete its first ``completed`` phases: the copies
        that signalled those phases are visible to every thread."""
        seen = ((self.state == SIGNALLED) & (self.signal_barrier == uid)
                & (self.signal_phase < completed))
        self.state[seen] = VISIBLE

    def read_bulk(self, pos: np.ndarray, inst: Instruction, st: BlockState) -> np.ndarray:
        """Values a store_tma reads at ``pos`` (flat): written and synced before it; they
        stay busy until store_tma_wait."""
        state = self.state[pos]
        bad = state != VISIBLE
        if bad.any():
            what = {UNINIT: "never written", WRITTEN: "written without a sync before it",
                    IN_FLIGHT: "still being written by a copy_async",
                    LANDED: "landed by a copy_async but not synced",
                    SIGNALLED: "written by a copy not yet waited for"}
            self._fail(inst, st, bad, pos, "store_tma reads shared memory "
                       + what[int(state[bad][0])])
        self.bulk_reads[pos] = True
        return self.values[pos]

    def release_bulk_reads(self) -> None:
        """store_tma_wait: every store_tma has finished reading."""
        self.bulk_reads[:] = False

    def land(self, pos: np.ndarray) -> None:
        """The async copy to ``pos`` completed (not yet visible to other threads)."""
        self.state[pos[self.state[pos] == IN_FLIGHT]] = LANDED

    def sync(self) -> None:
        """A block barrier: completed writes become visible; read records reset."""
        done = (self.state == WRITTEN) | (self.state == LANDED)
        self.state[done] = VISIBLE
        self.writer_min[:] = _NOBODY
        self.writer_max[:] = -1
        self.reader_min[:] = _NOBODY
        self.reader_max[:] = -1
