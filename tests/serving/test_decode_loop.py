"""``lowvm.serving``'s ``loop`` mode: our own greedy decode loop over a static cache, one
CUDA graph per decode step on a GPU, plain calls on the CPU (what CI runs here)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from transformers import StaticCache

from lowvm.serving import cli
from lowvm.serving.decode_loop import DecodeLoop, chunked_argmax
from lowvm.serving.generation import generate, leading_equal, prompts
from lowvm.serving.measure import LOOP_ATTR, loop_compile_mode, loop_compile_modes, release
from lowvm.serving.models import init_random, quantized_copy, random_config
from tests.helpers.serving import run_serving

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.layer.backend.LowvmFallbackWarning")

@pytest.fixture(scope="module")
def models() -> dict:
    """The tiny random Llama in float16 and its int4 copy (group 64), on the CPU."""
    torch.manual_seed(0)
    dense = init_random(random_config("tiny"), "cpu")
    quant, _ = quantized_copy(dense, "int4", 64, ("lm_head",))
    return {"float16": dense, "int4": quant}


def static_generate(model, ids: torch.Tensor, tokens: int) -> torch.Tensor:
    """``generate``'s greedy tokens with a StaticCache (not compiled on the CPU)."""
    cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + tokens)
    return generate(model, ids, tokens, cache)[:, ids.shape[1]:]


@pytest.mark.parametrize("name", ["float16", "int4"])
def test_loop_tokens_equal_generate_with_static_cache(models, name):
    model = models[name]
    ids = prompts(2, 6, model.config.vocab_size, "cpu", 3)
    loop = DecodeLoop(model, ids, 8)
    first = loop(8)
    assert first.shape == (2, 8)
    assert torch.equal(first, static_generate(model, ids, 8))
    assert torch.equal(loop(8), first)  # each run resets the cache: the same tokens again
    assert torch.equal(loop(3), first[:, :3]) and torch.equal(loop(1), first[:, :1])
    assert loop.graph is None  # no capture on the CPU: plain calls


def test_loop_tokens_equal_generate_with_dynamic_cache_in_float32(models):
    """In float32 the static cache's padded attention rounds like the dynamic cache's, so
    the loop gives exactly ``generate``'s default greedy tokens."""
    model = copy.deepcopy(models["float16"]).float()
    ids = prompts(2, 5, model.config.vocab_size, "cpu", 4)
    want = generate(model, ids, 10)[:, ids.shape[1]:]
    assert torch.equal(DecodeLoop(model, ids, 10)(10), want)


def test_loop_never_picks_end_of_sequence_like_min_new_tokens(models):
    model = copy.deepcopy(models["float16"])
    ids = prompts(1, 6, model.config.vocab_size, "cpu", 5)
    model.generation_config.eos_token_id = None
    free = DecodeLoop(model, ids, 6)(6)
    model.generation_config.eos_token_id = [int(free[0, 0]), 2]  # the loop's first choice
    banned = DecodeLoop(model, ids, 6)(6)
    assert int(banned[0, 0]) != int(free[0, 0])
    assert not torch.isin(banned, torch.tensor([int(free[0, 0]), 2])).any()
    assert torch.equal(banned, static_generate(model, ids, 6))


def test_compiled_step_traces_in_one_graph(models):
    """The step compiles with fullgraph=True (the eager backend here: no inductor on CI),
    through the lowvm custom op, without graph breaks, and gives the same tokens."""
    from torch._dynamo.utils import counters

    model = models["int4"]
    ids = prompts(2, 6, model.config.vocab_size, "cpu", 6)
    torch._dynamo.reset()
    counters.clear()
    try:
        compiled = DecodeLoop(model, ids, 5, compile_mode="default", backend="eager")
        assert compiled.step_fn is not compiled._forward_pick
        tokens = compiled(5)
        assert torch.equal(compiled(5), tokens)
        assert counters["stats"]["unique_graphs"] == 1  # no recompilation per step or run
        assert sum(counters["graph_break"].values()) == 0
    finally:
        torch._dynamo.reset()
    assert torch.equal(tokens, DecodeLoop(model, ids, 5)(5))


class FakeCuda:
    """Stands in for torch.cuda on the CPU to check ``capture()``'s control flow (streams,
    warm-up, one capture, replays): a "replay" runs the step that was captured."""

    def __init__(self, loop) -> None:
        self.loop, self.events = loop, []
        self.max_length = 0

    def track(self) -> None:  # the cache's write position after each warm-up/capture step
        self.max_length = max(self.max_length, int(self.loop.cache.get_seq_length()))

    def install(self, monkeypatch) -> None:
        fake = self

        class Stream:
            def wait_stream(self, other) -> None:
                fake.events.append("wait")

        class Graph:
            def replay(self) -> None:
                fake.events.append("replay")
                fake.loop._step()

            def reset(self) -> None:
                fake.events.append("reset")

        class StreamContext:
            def __init__(self, stream) -> None:
                pass

            def __enter__(self) -> None:
                fake.events.append("side stream")

            def __exit__(self, *exc) -> None:
                fake.track()

        class GraphContext(StreamContext):
            def __enter__(self) -> None:
                fake.events.append("capture")

        for name, value in {"Stream": Stream, "current_stream": Stream,
                            "stream": StreamContext, "CUDAGraph": Graph,
                            "graph": GraphContext, "synchronize": lambda: None}.items():
            monkeypatch.setattr(torch.cuda, name, value)


def test_capture_control_flow_with_a_fake_cuda(models, monkeypatch):
    model = models["int4"]
    ids = prompts(2, 5, model.config.vocab_size, "cpu", 8)
    plain = DecodeLoop(model, ids, 4)(4)
    loop = DecodeLoop(model, ids, 4)
    fake = FakeCuda(loop)
    fake.install(monkeypatch)
    loop.capture()
    assert fake.events == ["wait", "side stream", "wait", "capture"]
    assert fake.max_length <= ids.shape[1] + 4 - 1  # warm-up never fills the cache's room
    assert loop.graph is not None and loop.build_s >= 0
    assert torch.equal(loop(4), plain)
    assert fake.events.count("replay") == 3  # one replay per decode step
    loop.close()
    assert fake.events[-1] == "reset" and loop.graph is None


def test_loop_refuses_more_tokens_than_its_cache_holds(models):
    loop = DecodeLoop(models["float16"], torch.zeros(1, 4, dtype=torch.long), 3)
    with pytest.raises(ValueError, match=r"tokens must be in \[1, 3\].*got 4"):
        loop(4)
    with pytest.raises(ValueError, match="got 0"):
        loop(0)


def test_step_ms_times_plain_steps_on_cpu_and_close_drops_state(models):
    model = models["float16"]
    loop = DecodeLoop(model, torch.ones(1, 4, dtype=torch.long), 4)
    assert loop.step_ms(50, "cpu") > 0  # capped at the cache's room (3 steps)
    assert DecodeLoop(model, torch.ones(1, 4, dtype=torch.long), 1).step_ms(
        5, "cpu") is None  # one token: no decode step at all
    model.__dict__[LOOP_ATTR] = loop
    release(model)
    assert LOOP_ATTR not in model.__dict__ and loop.cache is None


def test_loop_options():
    parse = cli.parse_args
    args = parse(["--modes", "loop,eager"])
    assert args.mode_list == ["loop", "eager"]
    assert loop_compile_mode(args.loop_compile, "cuda") == "default"
    assert loop_compile_mode(args.loop_compile, "cpu") is None
    args = parse(["--loop-compile", "max-autotune-no-cudagraphs"])
    assert loop_compile_mode(args.loop_compile, "cpu") == "max-autotune-no-cudagraphs"
    assert loop_compile_mode(parse(["--loop-compile", "off"]).loop_compile, "cuda") is None
    modes = loop_compile_modes()
    assert "default" in modes and "reduce-overhead" not in modes and "max-autotune" not in modes
    for bad in (["--loop-compile", "reduce-overhead"], ["--modes", "loops"]):
        with pytest.raises(SystemExit):
            parse(bad)


@pytest.mark.slow
def test_cli_loop_rows_beside_eager_and_graphs(tmp_path, capsys):
    """All three modes on the CPU (graphs and the loop's step compiled with the eager
    backend): the same greedy tokens, timed the same way, compared in the JSON."""
    out = tmp_path / "result.json"
    run_serving("--dtype", "int4", "--group-size", "64", "--new-tokens", "4",
                "--batch-sizes", "2", "--prompt-len", "5", "--repeats", "2",
                "--modes", "eager,graphs,loop", "--compile-backend", "eager",
                "--loop-compile", "default", "--forward-steps", "2", "--no-fp16-speed",
                "--json", str(out))
    result = json.loads(out.read_text())
    assert result["errors"] == []
    assert result["compile"]["loop"] == {"mode": "default", "backend": "eager",
                                         "fullgraph": True, "dynamic": False,
                                         "cuda_graph": False}
    eager, graphs, loop = result["speed"]
    assert [r["mode"] for r in (eager, graphs, loop)] == ["eager", "graphs", "loop"]
    assert graphs["leading_tokens_equal_other_mode"] == 4
    assert loop["leading_tokens_equal"] == {"eager": 4, "graphs": 4}
    assert "leading_tokens_equal_other_mode" not in loop  # two others: the dict only
    assert loop["new_tokens"] == 4 and len(loop["runs_full_s"]) == 2
    # on a loaded CPU the 4-token run's median may not exceed the 1-token run's: the decode
    # rate is then NaN, never zero or negative
    assert loop["full_s"] > 0 and loop["prefill_s"] > 0 and not loop["decode_tokens_per_s"] <= 0
    assert loop["graphs_compiled"] == 1 and loop["graph_breaks"] == 0
    assert loop["cuda_graph"] is False and loop["loop_build_s"] is None
    assert loop["forward_ms"] > 0
    table = capsys.readouterr().out.rsplit("device:", 1)[1]
    assert any(line.startswith(f"{'int4':12s}     2 loop") for line in table.splitlines())


@pytest.mark.gpu
def test_captured_step_replays_the_compiled_step_on_cuda():
    """On the GPU: the compiled step captured in one CUDA graph gives exactly the tokens of
    the same step called plainly, and greedy tokens that start like ``generate``'s."""
    torch.manual_seed(0)
    dense = init_random(random_config("tiny"), "cuda")
    model, _ = quantized_copy(dense, "int4", 64, ("lm_head",))
    ids = prompts(2, 7, model.config.vocab_size, "cuda", 7)
    loop = DecodeLoop(model, ids, 12, compile_mode="default")
    try:
        plain = loop(12)
        loop.capture()
        assert loop.graph is not None and loop.build_s > 0
        graphed = loop(12)
        assert torch.equal(graphed, plain)  # the same kernels (the tiny K has no split-K
        # atomics, whose order could differ), replayed: bit-identical logits, same tokens
        assert torch.equal(loop(12), graphed)
        want = generate(model, ids, 12)[:, ids.shape[1]:]
        assert leading_equal(graphed, want) >= 2  # fused kernels round apart
        assert loop.step_ms(5, "cuda") > 0
    finally:
        loop.close()
        torch._dynamo.reset()
    assert loop.graph is None


@pytest.mark.gpu
def test_cli_loop_mode_on_cuda(tmp_path):
    out = tmp_path / "result.json"
    # 16 tokens, medians of 3: with 8 tokens and one repeat the 1-token call once took
    # longer than the 8-token one on the H100 (decode rate nan; 2026-11-24)
    run_serving("--dtype", "int4", "--group-size", "64", "--new-tokens", "16",
                "--batch-sizes", "1", "--repeats", "3", "--modes", "graphs,loop",
                "--forward-steps", "4", "--no-fp16-speed", "--json", str(out))
    result = json.loads(out.read_text())
    assert result["errors"] == [] and result["compile"]["loop"]["cuda_graph"] is True
    graphs, loop = result["speed"]
    assert loop["cuda_graph"] is True and loop["graph_breaks"] == 0
    assert loop["loop_build_s"] > 0 and loop["first_call_s"] >= loop["loop_build_s"]
    assert loop["leading_tokens_equal"]["graphs"] >= 2
    assert loop["forward_ms"] > 0 and loop["decode_tokens_per_s"] > 0


def test_chunked_argmax_equals_argmax_with_ties_and_padding():
    """The loop's greedy pick: the first index of the maximum, as torch.argmax."""
    torch.manual_seed(0)
    for vocab in (7, 1024, 1500, 128256):
        logits = torch.randn(3, vocab).half()
        logits[1, vocab // 2] = logits[1, -1] = 60.0  # a tie: the first one wins
        logits[2] = 0.0  # all equal: index 0
        got = chunked_argmax(logits)
        assert torch.equal(got, logits.float().argmax(-1)), vocab
        assert got[1].item() == vocab // 2 and got[2].item() == 0
