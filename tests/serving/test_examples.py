"""The serving measurement (``python -m lowvm.serving``) and the serving examples run on
the CPU with tiny settings (what CI runs); the Llama-3-8B configuration is checked on the
meta device (nothing allocated); the CUDA-graph path runs tiny on the GPU (``gpu``)."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch

from lowvm.serving import cli
from lowvm.serving.compare import model_name
from lowvm.serving.models import init_random, quantized_copy, random_config, weight_bytes
from lowvm.serving.quality import layer_errors
from serving_examples import custom_program
from tests.helpers.serving import run_serving

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.layer.backend.LowvmFallbackWarning")


@pytest.mark.slow
def test_quantize_and_generate_tiny(tmp_path, capsys):
    out = tmp_path / "result.json"
    run_serving("--dtype", "int4", "--group-size", "64", "--new-tokens", "3",
                "--batch-sizes", "1,2", "--prompt-len", "6", "--repeats", "1",
                "--json", str(out))
    result = json.loads(out.read_text())
    int4, fp16 = result["models"]["int4"], result["models"]["float16"]
    assert int4["layers_replaced"] == 14 and int4["layers_skipped"] == ["lm_head"]
    assert int4["weight_bytes"]["stored"] < fp16["weight_bytes"]["stored"]
    assert int4["quantized_layer_bytes"]["lowvm"] < int4["quantized_layer_bytes"]["float16"]
    assert len(int4["generated"]) == 3 and len(fp16["generated"]) == 3
    rows = result["speed"]
    assert [(r["model"], r["batch"], r["mode"]) for r in rows] == [  # batch-major priority
        ("float16", 1, "eager"), ("int4", 1, "eager"), ("float16", 1, "loop"),
        ("int4", 1, "loop"), ("float16", 2, "eager"), ("int4", 2, "eager"),
        ("float16", 2, "loop"), ("int4", 2, "loop")]  # CPU default modes: eager, loop
    for r in rows:  # a 3-token run on a loaded CPU may time no slower than a 1-token one:
        # the decode rate is then NaN, never zero or negative
        assert not r["decode_tokens_per_s"] <= 0 and r["e2e_tokens_per_s"] > 0
        assert r["attention"] == ("lowvm" if r["model"] == "int4" else "sdpa")
        assert r["full_s"] > r["prefill_s"] > 0 and len(r["runs_full_s"]) == 1
    for r in rows[2:4] + rows[6:]:  # the loop's greedy tokens start like generate's
        assert r["leading_tokens_equal"]["eager"] >= 1 and r["cuda_graph"] is False
    assert 0.0 <= int4["quality"]["top1_agreement"] <= 1.0
    assert 0.0 < int4["quality"]["last_logits_rel_error"] < 1.0
    assert int4["quality"]["layers_compared"] == 14  # every quantized layer, once
    assert 0.0 < int4["quality"]["layer_rel_error_median"] <= int4["quality"][
        "layer_rel_error_max"] < 1.0
    assert result["errors"] == []
    table = capsys.readouterr().out.rsplit("device:", 1)[1]  # the table is printed last
    int4_b2 = next(line for line in table.splitlines() if line.startswith(f"{'int4':12s} {2:5d}"))
    want = rows[5]["decode_tokens_per_s"] / rows[4]["decode_tokens_per_s"]
    assert f"{want:7.2f}" in int4_b2  # speed-up over float16 at the same batch and mode


@pytest.mark.slow
def test_graphs_mode_plumbing_on_cpu(tmp_path):
    """Static cache + the forward transformers compiles (eager backend: no CUDA here) gives
    the eager path's greedy tokens, without graph breaks through the lowvm custom op."""
    out = tmp_path / "result.json"
    run_serving("--dtype", "int4", "--group-size", "64", "--new-tokens", "4",
                "--batch-sizes", "2", "--prompt-len", "5", "--repeats", "1",
                "--modes", "eager,graphs", "--compile-backend", "eager", "--forward-steps",
                "2", "--no-fp16-speed", "--json", str(out))
    result = json.loads(out.read_text())
    assert result["errors"] == [] and result["compile"]["cuda_graphs"] is False
    eager, graphs = result["speed"]
    assert (eager["mode"], graphs["mode"]) == ("eager", "graphs")
    assert graphs["graphs_compiled"] >= 1 and graphs["graph_breaks"] == 0
    assert eager["graphs_compiled"] == 0
    assert graphs["leading_tokens_equal_other_mode"] == 4
    assert graphs["forward_ms"] > 0
    assert "float16" not in {r["model"] for r in result["speed"]}


def test_time_budget_skips_and_records(tmp_path, capsys):
    out = tmp_path / "result.json"
    run_serving("--dtype", "int4,int2", "--batch-sizes", "1", "--new-tokens",
                "2", "--time-budget", "0", "--json", str(out))
    result = json.loads(out.read_text())
    assert [(r["model"], r["mode"], r.get("skipped", "")[:11]) for r in result["speed"]] == [
        (model, mode, "time budget") for mode in ("eager", "loop")
        for model in ("float16", "int4", "int2")]
    assert result["models"]["int2"]["layers_replaced"] == 14  # memory and quality still
    capsys.readouterr()
    run_serving("--print-table", str(out), str(out))
    assert "not measured: time budget" in capsys.readouterr().out


def test_layer_errors_follow_the_width_and_leave_the_models_alone():
    """Per-layer errors against float16 on the float16 model's own activations: wider types
    err less; int4 with group 64 on Gaussian weights lands near its rounding noise (step
    ~absmax/7 with absmax ~2.4 sigma over 64 draws: ~0.1 of the output); the hooks are
    removed, and the float16 model's logits are what they were."""
    torch.manual_seed(0)
    dense = init_random(random_config("tiny"), "cpu")
    ids = torch.randint(0, 512, (2, 8))
    before = dense(ids, use_cache=False).logits
    medians = {}
    for dtype in ("int8", "int4", "int2"):
        quant, _ = quantized_copy(dense, dtype, 64, ("lm_head",))
        errors = layer_errors(dense, quant, ids)
        assert errors["layers_compared"] == 14
        medians[dtype] = errors["layer_rel_error_median"]
    assert 0 < medians["int8"] < medians["int4"] < medians["int2"], medians
    assert 0.05 < medians["int4"] < 0.2 and medians["int8"] < 0.02, medians
    assert not any(m._forward_hooks for m in dense.modules())
    assert torch.equal(dense(ids, use_cache=False).logits, before)


def test_llama3_8b_is_built_on_meta_without_memory():
    config = cli.random_config_of(cli.parse_args(["--config", "llama3-8b"]))
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers,
            config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == (
        4096, 14336, 32, 32, 8, 128256)
    model = init_random(config, "meta")
    tensors = [*model.parameters(), *model.buffers()]
    assert all(t.is_meta for t in tensors)
    assert {p.dtype for p in model.parameters()} == {torch.float16}
    h, f, v, kv = 4096, 14336, 128256, 8 * 128
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h  # q, o; k, v; MLP; two norms
    expected = 2 * v * h + 32 * per_layer + h  # embedding, lm_head (untied), final norm
    assert sum(p.numel() for p in model.parameters()) == expected
    assert 7.9e9 < expected < 8.1e9
    assert weight_bytes(model)["stored"] == 2 * expected  # float16


def test_random_init_on_device_and_shared_quantized_copy():
    torch.manual_seed(0)
    dense = init_random(random_config("tiny"), "cpu")
    up = dense.model.layers[0].mlp.up_proj.weight
    assert up.dtype == torch.float16 and abs(up.float().std().item() - 0.02) < 2e-3
    assert torch.equal(dense.model.norm.weight, torch.ones_like(dense.model.norm.weight))
    before = up.clone()
    quant, report = quantized_copy(dense, "int3", 64, ("lm_head",))
    assert report.layers_replaced == 14
    assert type(quant.model.layers[0].mlp.up_proj).__name__ == "QuantLinear"
    assert type(dense.model.layers[0].mlp.up_proj).__name__ == "Linear"
    assert torch.equal(dense.model.layers[0].mlp.up_proj.weight, before)
    assert quant.model.embed_tokens.weight is dense.model.embed_tokens.weight
    assert quant.lm_head.weight is dense.lm_head.weight


def test_lm_head_type_option():
    """``--lm-head int8`` quantizes lm_head to int8 beside the rows' type (even though
    --skip names it by default), names the rows after both, and refuses unknown types."""
    args = cli.parse_args(["--lm-head", "int8"])
    assert "lm_head" not in args.skip_globs and model_name(args, "int4") == \
        "int4/lm int8"
    torch.manual_seed(0)
    dense = init_random(cli.random_config_of(args), "cpu")
    quant, report = quantized_copy(dense, "int3", 64, args.skip_globs,
                                              args.lm_head)
    assert report.layers_replaced == 15
    assert quant.lm_head.spec.wtype.name == "int8"
    assert quant.model.layers[0].mlp.up_proj.spec.wtype.name == "int3"
    with pytest.raises(SystemExit):
        cli.parse_args(["--lm-head", "int9"])
    with pytest.raises(ValueError, match="lm_head was left dense"):  # a --skip glob matched
        quantized_copy(dense, "int3", 64, ("lm_*",), "int8")


@pytest.mark.gpu
def test_graphs_mode_on_cuda(tmp_path):
    """The CUDA-graph path of the serving measurement, tiny: compiled without graph breaks
    or CUDA-graph skips, the same first greedy tokens as eager, a replayed forward."""
    out = tmp_path / "result.json"
    run_serving("--dtype", "int4", "--group-size", "64", "--new-tokens", "8",
                "--batch-sizes", "1", "--repeats", "1", "--modes", "eager,graphs",
                "--forward-steps", "4", "--no-fp16-speed", "--json", str(out))
    result = json.loads(out.read_text())
    assert result["errors"] == [] and result["compile"]["cuda_graphs"] is True
    eager, graphs = result["speed"]
    assert graphs["graphs_compiled"] >= 1
    assert graphs["graph_breaks"] == 0 and graphs["cudagraph_skips"] == 0
    assert graphs["leading_tokens_equal_other_mode"] >= 2  # 1st from eager prefill
    assert graphs["forward_ms"] > 0 and graphs["decode_tokens_per_s"] > 0
    added = result["models"]["int4"]["gpu_bytes_added"]
    assert 0 < added < result["models"]["int4"]["quantized_layer_bytes"]["float16"]


def test_custom_program_example(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["custom_program.py", "--seq", "4"])
    custom_program.main()
    text = capsys.readouterr().out
    error = float(re.search(r"max \|error\| vs torch = (\S+)", text).group(1))
    assert error < 1e-3  # fp16 outputs: at most a rounding step apart
    assert "top-1 agreement" in text


def test_custom_program_compiles_for_sm80():
    import lowvm

    kernel_source = lowvm.compile(custom_program.silu_mul, arch="sm_80").source
    assert "__global__" in kernel_source


@pytest.mark.slow
def test_quantize_and_generate_example(capsys):
    """The user example (CI runs it with no arguments): quantize, generate, time, table."""
    from serving_examples import quantize_and_generate

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: threads only contend
    try:
        result = quantize_and_generate.main(["--batch-sizes", "1", "--new-tokens", "3",
                                             "--prompt-len", "6", "--group-size", "64"])
    finally:
        torch.set_num_threads(threads)
    assert [(r["model"], r["mode"]) for r in result["speed"]] == [
        ("float16", "eager"), ("int4", "eager"), ("float16", "loop"), ("int4", "loop")]
    assert all(not r["decode_tokens_per_s"] <= 0 and r["e2e_tokens_per_s"] > 0
               for r in result["speed"])
    int4 = result["models"]["int4"]
    assert int4["fused"] is True and int4["quality"]["layers_compared"] == 14
    assert result["models"]["float16"]["fused"] is True  # the same GEMMs on both sides
    assert all(r["fused"] for r in result["speed"])
    assert int4["weight_bytes"]["stored"] < result["models"]["float16"]["weight_bytes"][
        "stored"]
    table = capsys.readouterr().out.rsplit("device:", 1)[1]
    assert any(line.startswith(f"{'int4':12s}     1 loop") for line in table.splitlines())
