"""``run_ranks`` fails a hung rank at its deadline with the rank's stack, and a rank's
exception with its progress log."""

from __future__ import annotations

import time

import pytest

from tests.helpers.ranks import rank_log, run_ranks


def _sleeper(rank: int, root: str) -> None:
    log = rank_log(root, rank, 16.0)
    log.write(f"rank {rank} waiting\n")
    if rank == 1:
        time.sleep(60)


def _raiser(rank: int, root: str) -> None:
    rank_log(root, rank, 60.0).write("about to fail\n")
    if rank == 0:
        raise ValueError("boom")


@pytest.mark.slow
def test_hung_rank_fails_with_its_stack(tmp_path) -> None:
    start = time.monotonic()
    with pytest.raises(AssertionError) as info:
        run_ranks(_sleeper, 2, (str(tmp_path),), tmp_path, 16.0)
    assert time.monotonic() - start < 40
    text = str(info.value)
    assert "still running after 16 s" in text and "rank 1 waiting" in text
    assert "_sleeper" in text  # faulthandler's dump of the hung rank


@pytest.mark.slow
def test_failed_rank_reports_its_log(tmp_path) -> None:
    with pytest.raises(AssertionError) as info:
        run_ranks(_raiser, 2, (str(tmp_path),), tmp_path, 60.0)
    assert "boom" in str(info.value) and "about to fail" in str(info.value)
