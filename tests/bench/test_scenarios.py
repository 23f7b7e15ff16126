"""CPU tests of the scenario table, its command line and the plans ``--list`` prints."""

from __future__ import annotations

import pytest

from lowvm.bench import BenchError, cli
from lowvm.bench.scenarios import ADHOC, SCENARIOS, Scenario, scenario, weight_type_names
from lowvm.bench.shapes import LLAMA_SHAPES, Shape
from lowvm.runtime.timing import METHODS, copies_for


def test_the_required_scenarios_exist_with_their_kinds():
    kinds = {name: sc.kind for name, sc in SCENARIOS.items()}
    assert kinds == {"gemm-decode": "gemm", "gemm-prefill": "gemm", "types": "gemm",
                     "schedules": "schedules", "serving-loop": "serving",
                     "quality": "json", "fuzz": "json", "load-memory": "json",
                     "tensor-parallel": "json", "host-overhead": "json", "profile": "json",
                     "gpu-suite": "pytest", "sanitizers": "sanitizers",
                     "sanitizers-fuzz": "sanitizers"}


def test_gemm_scenarios_hold_their_shapes_m_and_methods():
    decode, prefill = SCENARIOS["gemm-decode"], SCENARIOS["gemm-prefill"]
    assert decode.shapes == prefill.shapes == LLAMA_SHAPES
    assert decode.ms == (1, 2, 4, 8, 16) and decode.dtypes == ("int4",)
    assert decode.groups == (128,) and "graph" in decode.methods
    assert prefill.ms[0] == 64 and prefill.ms[-1] == 4096
    assert {"cublas_fp16", "tinygemm", "gemlite", "marlin"} <= set(decode.baselines)
    types = SCENARIOS["types"]
    assert types.shapes == (Shape(4096, 4096),) and types.ms == (1, 16)
    assert set(types.dtypes) == set(weight_type_names())
    assert {"uint1", "int8", "uint4", "float4_e2m1", "float8_e4m3"} <= set(types.dtypes)
    assert "int1" not in types.dtypes  # no symmetric scale maps a group onto {-1, 0}
    assert all(m in METHODS for sc in SCENARIOS.values() for m in sc.methods)


def test_scenario_lookup_and_validation():
    assert scenario("schedules") is SCENARIOS["schedules"]
    assert scenario("adhoc") is ADHOC
    with pytest.raises(BenchError, match="gemm-decode"):
        scenario("gemm-decoder")
    with pytest.raises(BenchError, match="kind"):
        Scenario("x", "nonsense", "")
    with pytest.raises(BenchError, match="method 'cold'"):
        Scenario("x", "gemm", "", methods=("cold",))


def test_a_scenario_takes_the_options_given():
    cfg, opts = cli.parse_config(["gemm-decode", "--m", "1,16", "--shape", "4096,6144",
                                  "--methods", "eager,read-flushed", "--baselines",
                                  "cublas_fp16,marlin"])
    assert opts.resolved.name == "gemm-decode" and cfg.scenario == "gemm-decode"
    assert cfg.ms == (1, 16) and cfg.shapes == (Shape(4096, 6144),)
    assert cfg.methods == ("eager", "read-flushed")
    assert cfg.baselines == ("cublas_fp16",) and cfg.optional == ("marlin",)
    untouched, _ = cli.parse_config(["gemm-decode"])
    assert untouched.ms == (1, 2, 4, 8, 16) and untouched.methods == ("graph", "write-flushed")


def test_flag_style_calls_stay_an_adhoc_scenario_timed_write_flushed():
    cfg, opts = cli.parse_config(["--shape", "512,256", "--m", "1"])
    assert opts.resolved.name == "adhoc" and cfg.scenario == "adhoc"
    assert cfg.methods == ("write-flushed",)


@pytest.mark.parametrize("argv, needle", [
    (["gemm-decode", "--methods", "cold"], "--methods"),
    (["no-such-scenario"], "invalid choice"),
    (["schedules", "--neighbours", "-1"], "--neighbours"),
])
def test_bad_scenario_options_exit_with_a_message(argv, needle, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.parse_config(argv)
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err


def test_list_without_a_scenario_names_every_scenario(capsys):
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert "scenario: adhoc" in out
    for name in SCENARIOS:
        assert name in out


def test_gemm_scenario_plan(capsys):
    assert cli.main(["gemm-decode", "--list"]) == 0
    out = capsys.readouterr().out
    assert "M: 1, 2, 4, 8, 16" in out and "methods: graph, write-flushed" in out
    assert "lowvm_int4_g128" in out and "cublas_fp16" in out and "marlin" in out
    assert "rows: 75 per method (2)" in out  # 5 shapes x 5 M x (lowvm, cuBLAS, tinygemm)


def test_schedules_plan_lists_the_choice_and_its_neighbours(capsys):
    assert cli.main(["schedules", "--list", "--shape", "4096,6144", "--m", "1",
                     "--dtype", "int4", "--neighbours", "3"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "M=1:" in x)
    specs = line.split(": ", 1)[1].split(", ")
    assert specs[0] == "chosen" and len(specs) == 4
    assert all("=" in s for s in specs[1:])


@pytest.mark.parametrize("name, needle", [
    ("serving-loop", "-m lowvm.serving --config llama3-8b --dtype int4,int3,int2 "
                     "--batch-sizes 1,16 --modes loop --new-tokens 128 "
                     "--json <scratch>/serving.json"),
    ("gpu-suite", "-m pytest -m gpu"),
    ("sanitizers", "compute-sanitizer --tool memcheck"),
])
def test_command_scenarios_show_their_command(name, needle, capsys):
    assert cli.main([name, "--list"]) == 0
    assert needle in capsys.readouterr().out


def test_copies_fill_at_least_200_mb():
    assert copies_for(12_000_000) * 12_000_000 >= 200e6
    assert copies_for(10**9) == 2  # two copies at least, even for a weight beyond the L2
    with pytest.raises(ValueError):
        copies_for(0)
