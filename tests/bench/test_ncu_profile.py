"""The profile's report handling: ncu's raw CSV is parsed, cut at the markers into one
group per call, and each group summarised; a report that does not match the calls is an
error, not a shifted table."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from lowvm.bench import ncu_profile as prof

_HEADER = ["ID", "Kernel Name", "gpu__time_duration.sum", "dram__bytes.sum.per_second",
           "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
           "sm__throughput.avg.pct_of_peak_sustained_elapsed",
           "sm__warps_active.avg.pct_of_peak_sustained_active",
           "launch__registers_per_thread", "launch__grid_size",
           "sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active",
           "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
           "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio",
           "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio"]
_UNITS = ["", "", "ns", "byte/s", "%", "%", "%", "register/thread", "", "%", "%", "", "",
          "", ""]


def _launch(i, name, ns, rate, dram=50.0, tensor=10.0, long_sb=1.0):
    """One launch: ``rate`` DRAM bytes per second over ``ns`` nanoseconds."""
    return [str(i), name, f"{ns:,}", f"{rate:,.2f}", str(dram), "20", "30", "128", "264",
            "5", str(tensor), str(long_sb), "2.5", "1.0", "0.25"]


def _csv(rows):
    lines = ['==PROF== Disconnected from process 1',
             ",".join(f'"{h}"' for h in _HEADER), ",".join(f'"{u}"' for u in _UNITS)]
    lines += [",".join(f'"{v}"' for v in row) for row in rows]
    return "\n".join(lines)


def test_groups_are_cut_at_markers_and_summarised():
    text = _csv([
        _launch(0, "spin_kernel(long)", 1000, 0),
        _launch(1, "quant_gemm_int4", 20000, 3e12, dram=81.2, tensor=12.0, long_sb=7.5),
        _launch(2, "spin_kernel(long)", 1000, 0),
        _launch(3, "fill_kernel", 2000, 1e9),
        _launch(4, "Marlin<256>", 30000, 2e12, dram=70.0, tensor=40.0),
    ])
    launches = prof.parse_raw_csv(text)
    assert len(launches) == 5
    groups = prof.group_launches(launches, 2)
    assert [len(g) for g in groups] == [1, 2]
    first, second = (prof.summarize_launches(g) for g in groups)
    assert first["time_us"] == 20.0 and first["dram_mb"] == 60.0  # 3 TB/s for 20 us
    assert first["dram_tbps"] == 3.0
    assert first["dram_pct"] == 81.2 and first["registers"] == 128 and first["grid"] == 264
    assert first["top_pipe"] == "tensor_op_hmma 12%"
    # "selected" (1.0) is the issuing warp, not a stall
    assert first["top_stalls"] == "long_scoreboard 7.5, barrier 2.5, math_pipe_throttle 0.2"
    # the longest launch gives the counters; the time is the group's sum
    assert second["launches"] == 2 and second["time_us"] == 32.0
    assert second["dram_mb"] == 60.0  # 2 MB of the fill, 60 MB (2 TB/s for 30 us) of Marlin
    assert second["kernel_name"] == "Marlin<256>" and second["top_pipe"] == "tensor_op_hmma 40%"
    table = prof.format_table([{"shape": "4096x6144", "m": 1, "kernel": "marlin", **second}])
    assert "marlin" in table and " 128 " in table and "barrier 2.5" in table


@pytest.mark.parametrize("calls,rows", [
    (3, [_launch(0, "spin_kernel", 1, 0), _launch(1, "k", 5, 5)]),   # a call went missing
    (2, [_launch(0, "spin_kernel", 1, 0), _launch(1, "spin_kernel", 1, 0),
         _launch(2, "k", 5, 5)]),                                     # one group is empty
])
def test_a_report_that_does_not_match_the_calls_is_refused(calls, rows):
    with pytest.raises(prof.ProfileError, match="marked groups"):
        prof.group_launches(prof.parse_raw_csv(_csv(rows)), calls)


def test_a_real_h100_report():
    """ncu 2025's raw page from an H100 (columns trimmed): lowvm, cuBLAS (its GEMV and a
    split-K reduction: two launches) and Marlin at 4096 x 4096, M = 1 and 256."""
    text = (Path(__file__).parent / "data" / "ncu_raw_h100.csv").read_text()
    groups = prof.group_launches(prof.parse_raw_csv(text), 6)
    rows = [prof.summarize_launches(g) for g in groups]
    assert [r["launches"] for r in rows] == [1, 2, 1, 1, 1, 1]
    lowvm = rows[0]
    assert lowvm["kernel_name"].startswith("lowvm_quant_gemm")
    assert lowvm["time_us"] == 9.02 and lowvm["dram_pct"] == 28.9
    assert 8.0 < lowvm["dram_mb"] < 9.5  # the 8.4 MB int4 weight and its scales, read once
    assert lowvm["registers"] == 48 and lowvm["grid"] == 512
    assert lowvm["top_stalls"].startswith("long_scoreboard 8.3")
    assert rows[3]["kernel_name"].startswith("lowvm_quant_gemm_wgmma")
    assert rows[3]["top_pipe"].startswith("tensor_op")


def test_a_report_in_other_units_or_with_a_torn_row_is_refused():
    text = _csv([_launch(0, "spin_kernel", 1, 0), _launch(1, "k", 5, 5)])
    with pytest.raises(prof.ProfileError, match="usecond.*--print-units base"):
        prof.parse_raw_csv(text.replace('"ns"', '"usecond"'))
    torn = text + '\n"2","k2","5"'
    with pytest.raises(prof.ProfileError, match="launch row 2 has a different number"):
        prof.parse_raw_csv(torn)


def test_empty_report_is_refused():
    with pytest.raises(prof.ProfileError, match="no launches"):
        prof.parse_raw_csv("==PROF== nothing profiled")


def test_command_leaves_clocks_alone_and_profiles_only_the_marked_range():
    cmd = prof.ncu_command("ncu", "/tmp/r", ["python", "-m", "x"])
    assert cmd[:1] == ["ncu"] and cmd[-3:] == ["python", "-m", "x"]
    assert cmd[cmd.index("--clock-control") + 1] == "none"
    assert cmd[cmd.index("--profile-from-start") + 1] == "off"
    assert [cmd[i + 1] for i, w in enumerate(cmd) if w == "--section"] == list(prof.SECTIONS)


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("ncu") is None or importlib.util.find_spec("torch") is None,
                    reason="needs Nsight Compute and a GPU")
def test_profile_one_cell_on_the_gpu(tmp_path):
    out = tmp_path / "p.json"
    assert prof.main(["--shape", "4096,4096", "--m", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    kernels = {r["kernel"] for r in rows}
    assert {"lowvm_int4_g128", "cublas_fp16"} <= kernels
    for r in rows:
        assert r["time_us"] > 0 and r["dram_mb"] > 0 and r["registers"] > 0
