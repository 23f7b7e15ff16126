"""Run ``python -m lowvm.serving`` in-process for the CPU tests."""

from __future__ import annotations

import torch

from lowvm.serving import cli


def run_serving(*args: str) -> None:
    """``python -m lowvm.serving`` with ``args``, on one CPU thread (tiny matmuls: threads
    only contend, 5x slower on a busy CI machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cli.main(list(args))
    finally:
        torch.set_num_threads(threads)
