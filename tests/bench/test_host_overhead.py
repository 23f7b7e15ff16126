"""``python -m lowvm.bench.host_overhead``: its timing loop, rows, table and arguments
without a GPU, and one short run on a GPU."""

from __future__ import annotations

import json

import pytest
import torch

from lowvm.bench import host_overhead as ho


class Clock:
    """A nanosecond clock that advances only when a call runs (``cost`` ns each)."""

    def __init__(self, cost: int) -> None:
        self.now, self.cost, self.calls, self.syncs = 0, cost, 0, []

    def __call__(self) -> int:
        return self.now

    def call(self) -> None:
        self.calls += 1
        self.now += self.cost

    def sync(self) -> None:
        self.syncs.append(self.calls)
        self.now += 10**9  # a long wait, which must not be counted


@pytest.mark.parametrize("calls,chunk", [(10, 3), (9, 3), (1, 200), (500, 200)])
def test_host_time_counts_only_the_calls_and_syncs_between_chunks(calls, chunk):
    clock = Clock(cost=7_500)
    us = ho.host_time_us(clock.call, calls, chunk, clock.sync, clock)
    assert us == pytest.approx(7.5)
    assert clock.calls == calls
    # one sync before each chunk and one after the last: never inside a timed window
    assert clock.syncs == list(range(0, calls, chunk)) + [calls]


def test_host_time_refuses_empty_loops():
    with pytest.raises(ValueError, match="calls=0"):
        ho.host_time_us(lambda: None, 0, 10, lambda: None)
    with pytest.raises(ValueError, match="chunk=0"):
        ho.host_time_us(lambda: None, 5, 0, lambda: None)


def test_rows_ok_and_table():
    rows = [ho.make_row(1, 11.234, 75.0, 9.1, 1000, 200, "lowvm_quant_gemm_x",
                        launch_us=4.25, alloc_us=3.5),
            ho.make_row(256, 20.0, 80.0, 48.0, 1000, 200),
            ho.make_row(16, 20.5, 90.0, 12.0, 1000, 200, limit_us=25.0)]
    assert [r["host_ok"] for r in rows] == [True, True, True]
    assert ho.summarize(rows, device="d")["ok"] is True
    late = ho.make_row(16, 20.01, 90.0, 12.0, 1000, 200)
    doc = ho.summarize([*rows, late], device="d")
    assert doc["ok"] is False and doc["device"] == "d" and len(doc["rows"]) == 4
    assert ho.summarize([])["ok"] is False  # nothing measured is not a pass
    json.dumps(doc)
    table = ho.format_table([rows[0], late]).splitlines()
    assert len(table) == 3 and "host <= 20 us" in table[0]
    assert table[1].split()[:5] == ["1", "11.23", "75.00", "9.10", "yes"]
    assert table[1].split()[5:] == ["lowvm_quant_gemm_x", "4.25", "3.50"]
    assert table[2].split()[4] == "NO" and table[2].split()[6:] == ["-", "-"]
    assert len({len(line) for line in table}) == 1  # aligned


def test_arguments():
    args = ho.parse_args(["--json", "out.json", "--m", "1,32", "--calls", "50"])
    assert (args.json, args.m, args.calls, args.chunk, args.limit_us) == (
        "out.json", [1, 32], 50, 200, ho.LIMIT_US)
    for bad in (["--m", "0"], ["--m", "a,b"], ["--calls", "-3"], ["--chunk", "1,2"]):
        with pytest.raises(SystemExit):
            ho.parse_args(bad)


def test_main_without_cuda_says_so(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "r.json"
    assert ho.main(["--json", str(out)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err and not out.exists()


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_short_run_writes_the_document(tmp_path):
    out = tmp_path / "r.json"
    code = ho.main(["--json", str(out), "--calls", "400", "--copies", "2", "--m", "1,256"])
    doc = json.loads(out.read_text())
    assert code == (0 if doc["ok"] else 1)
    assert [r["m"] for r in doc["rows"]] == [1, 256]
    for row in doc["rows"]:
        assert 0 < row["host_us"] < row["op_host_us"]  # the eager path beats the custom op
        assert row["kernel_us"] > 0 and row["kernel"]
        # the floors are measured (loops of their own, so only bounded loosely here: other
        # work on the machine moves short loops)
        for floor in ("launch_us", "alloc_us"):
            assert 0 < row[floor] < row["op_host_us"]
