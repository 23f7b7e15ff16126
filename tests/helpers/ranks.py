"""Run a function on several local ranks with a deadline, so that a hung collective fails
the test with where each rank stopped instead of hanging the run.

Each rank calls ``rank_log(root, rank)`` first: a line-buffered log file in ``root`` that
the worker writes its progress to and that ``faulthandler`` dumps every thread's stack to
shortly before the deadline. On a timeout or a rank's failure the logs' tails are in the
assertion message.
"""

from __future__ import annotations

import faulthandler
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch.multiprocessing as mp

__all__ = ["free_port", "rank_log", "run_ranks"]

_DUMP_MARGIN_S = 15.0


def free_port() -> int:
    """A TCP port free on this host now, for the ranks' rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _log_path(root: str | Path, rank: int) -> Path:
    return Path(root) / f"rank{rank}.log"


def rank_log(root: str | Path, rank: int, timeout_s: float) -> IO[str]:
    """The rank's progress log; its stacks are dumped into it before the deadline."""
    log = open(_log_path(root, rank), "a", buffering=1)  # noqa: SIM115 (lives with the rank)
    faulthandler.dump_traceback_later(max(timeout_s - _DUMP_MARGIN_S, 1.0), file=log)
    return log


def _tails(root: str | Path, world: int, lines: int = 40) -> str:
    parts = []
    for rank in range(world):
        path = _log_path(root, rank)
        text = path.read_text() if path.exists() else "(no log)"
        parts.append(f"--- rank {rank} ---\n" + "\n".join(text.splitlines()[-lines:]))
    return "\n".join(parts)


def run_ranks(fn: Callable[..., None], world: int, args: tuple[Any, ...], root: str | Path,
              timeout_s: float) -> None:
    """``fn(rank, *args)`` on ``world`` spawned processes; fails after ``timeout_s``."""
    context = mp.start_processes(fn, args=args, nprocs=world, join=False,
                                 start_method="spawn")
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=max(deadline - time.monotonic(), 0.0)):
            if time.monotonic() >= deadline:
                raise AssertionError(f"ranks still running after {timeout_s:.0f} s\n"
                                     + _tails(root, world))
    except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
        raise AssertionError(f"a rank failed: {exc}\n" + _tails(root, world)) from None
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
