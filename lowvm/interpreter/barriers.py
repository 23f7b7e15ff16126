"""The interpreter's mbarriers: exact phase, arrival and transaction-byte counts.

One :class:`Mbarrier` per barrier of a block. A phase completes when its pending
arrivals reach zero and its transaction count is zero; arrivals beyond a phase's count
belong to the next phase, as on the GPU. Bytes delivered before they are announced make
the transaction count negative for a while, which the hardware allows too.
"""

from __future__ import annotations

__all__ = ["Mbarrier"]


class Mbarrier:
    """One mbarrier's state: ``completed`` phases so far and the counts of the next."""

    def __init__(self, uid: int, name: str, arrivals: int) -> None:
        self.uid = uid
        self.name = name
        self.arrivals = arrivals
        self.pending = arrivals  # arrivals the phase in progress still waits for
        self.tx = 0  # transaction bytes announced and not yet delivered (may be < 0)
        self.completed = 0  # phases completed

    @property
    def phase(self) -> int:
        """The number of the phase in progress (= phases completed)."""
        return self.completed

    def arrive(self, count: int) -> None:
        """``count`` arrivals, spilling into the following phases as they complete."""
        while count:
            take = min(count, self.pending)
            self.pending -= take
            count -= take
            if not self._try_complete() and count:
                # arrivals beyond this phase's count while its bytes are outstanding:
                # the hardware's count underflows here, a program error
                raise ValueError(f"{self.name}: {count} more arrivals than the phase "
                                 f"waits for ({self.arrivals}) while {self.tx} transaction "
                                 "bytes are outstanding")

    def expect(self, nbytes: int) -> None:
        """Announce ``nbytes`` more transaction bytes for the phase in progress."""
        self.tx += nbytes

    def deliver(self, nbytes: int) -> int:
        """A copy delivered ``nbytes``; return the phase they completed towards."""
        phase = self.completed
        self.tx -= nbytes
        self._try_complete()
        return phase

    def _try_complete(self) -> bool:
        if self.pending == 0 and self.tx == 0:
            self.completed += 1
            self.pending = self.arrivals
            return True
        return False

    def done(self, parity: int) -> bool:
        """Whether a wait for the phase of ``parity`` returns now: the phase in progress
        has the other parity (so a wait for parity 1 before any phase completed returns
        at once, as the hardware's ``try_wait.parity`` does: a producer's first wait for
        a free stage)."""
        return self.completed % 2 != parity

    def describe(self) -> str:
        """The counts a deadlock report names."""
        return (f"phase {self.completed} in progress, waiting for {self.pending} of its "
                f"{self.arrivals} arrivals and {self.tx} transaction bytes")
