"""Tensor-parallel lowvm layers: shards equal slices of the full layer exactly, a split
that cannot be made names the layer and the reason, and a 2-rank model (gloo, CPU) gives
the single-process logits, by ``lowvm.tensor_parallel`` and by ``from_pretrained(...,
tp_plan="auto")`` (a lowvm checkpoint, a model quantized on load, an imported GPTQ
checkpoint)."""

from __future__ import annotations

import importlib.util
import os
import time
import warnings

import pytest
import torch
from torch import nn

from lowvm.nn.layer.backend import LowvmFallbackWarning
from lowvm.nn.layer.quant_linear import QuantLinear
from lowvm.nn.serve.tensor_parallel import (
    TensorParallelError,
    generic_name,
    lowvm_styles,
    model_tp_plan,
    shard_problem,
    shard_quant_linear,
)
from tests.helpers.ranks import free_port, rank_log, run_ranks

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.layer.backend.LowvmFallbackWarning")


def _layer(k: int = 256, n: int = 256, dtype: str = "int4", group: int | None = 64,
           bias: bool = True, seed: int = 0) -> QuantLinear:
    torch.manual_seed(seed)
    linear = nn.Linear(k, n, bias=bias).to(torch.float16)
    return QuantLinear.from_linear(linear, dtype, group)


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("dtype,group", [("int4", 64), ("uint3", 64), ("int8", None)])
def test_shards_are_exact_slices(world: int, dtype: str, group: int | None) -> None:
    layer = _layer(dtype=dtype, group=group)
    full = layer.dequantize()
    n, k = full.shape
    for rank in range(world):
        col = shard_quant_linear(layer, "colwise", rank, world, "l")
        rows = slice(rank * n // world, (rank + 1) * n // world)
        assert torch.equal(col.dequantize(), full[rows])
        assert torch.equal(col.bias, layer.bias[rows])
        row = shard_quant_linear(layer, "rowwise", rank, world, "l")
        cols = slice(rank * k // world, (rank + 1) * k // world)
        assert torch.equal(row.dequantize(), full[:, cols])
        assert (row.bias is not None) == (rank == 0)
        if rank == 0:
            assert torch.equal(row.bias, layer.bias)


def test_fused_parts_split_apart() -> None:
    """A fused q/k/v layer keeps whole parts per rank: q rows, then k rows, then v rows."""
    layer = _layer(n=512)
    parts = [256, 128, 128]
    full = layer.dequantize()
    chunks = full.split(parts)
    for rank in range(2):
        shard = shard_quant_linear(layer, "colwise", rank, 2, "qkv_proj", parts)
        want = torch.cat([c[rank * c.shape[0] // 2:(rank + 1) * c.shape[0] // 2]
                          for c in chunks])
        assert torch.equal(shard.dequantize(), want)


def test_rowwise_partial_outputs_sum_to_the_layer() -> None:
    layer = _layer()
    x = torch.randn(3, 256, dtype=torch.float16)
    ref = x.double() @ layer.dequantize(torch.float64).t() + layer.bias.double()
    total = sum(shard_quant_linear(layer, "rowwise", r, 2)(x[:, r * 128:(r + 1) * 128]).double()
                for r in range(2))
    assert (total - ref).abs().max() <= 1e-2 * ref.abs().max()


def _snapshot(layer: QuantLinear) -> list[torch.Tensor]:
    return [b.clone() for b in layer.buffers()]


@pytest.mark.parametrize("style,world,parts,words", [
    ("colwise", 2, None, ["'model.x'", "out_features=192", "64", "96"]),
    ("rowwise", 4, None, ["'model.x'", "in_features=256", "64 per rank", "groups of 128"]),
    ("diagonal", 2, None, ["'model.x'", "'diagonal'", "colwise"]),
    ("rowwise", 2, [96, 96], ["'model.x'", "fused"]),
])
def test_unsplittable_layers_are_named_with_the_reason(style: str, world: int, parts,
                                                        words: list[str]) -> None:
    layer = _layer(n=192, group=128)
    before = _snapshot(layer)
    with pytest.raises(TensorParallelError) as err:
        shard_quant_linear(layer, style, 0, world, "model.x", parts)
    for word in words:
        assert word in str(err.value), str(err.value)
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(layer), strict=True))


def test_act_order_rowwise_refused_colwise_kept() -> None:
    torch.manual_seed(1)
    layer = QuantLinear(256, 128, "int4", 64, act_order=True)
    perm = torch.randperm(256)
    layer.set_codes(torch.randint(0, 16, (128, 256)), torch.rand(4, 128) + 0.1, None, perm)
    with pytest.raises(TensorParallelError, match="act-order"):
        shard_quant_linear(layer, "rowwise", 0, 2, "down_proj")
    full = layer.dequantize()
    shard = shard_quant_linear(layer, "colwise", 1, 2, "gate_proj")
    assert torch.equal(shard.dequantize(), full[64:])
    assert torch.equal(shard.input_perm, perm)


@pytest.mark.parametrize("rank,world", [(2, 2), (-1, 2), (0, 0), (0, True)])
def test_bad_rank_or_world(rank, world) -> None:
    with pytest.raises(TensorParallelError, match="rank|world"):
        shard_quant_linear(_layer(), "colwise", rank, world)


def test_shard_is_not_split_twice_and_dense_refused() -> None:
    shard = shard_quant_linear(_layer(), "colwise", 0, 2)
    assert "already" in shard_problem(shard, "colwise", 2)
    assert "not a lowvm QuantLinear" in shard_problem(nn.Linear(256, 256), "colwise", 2)


@pytest.mark.slow
def test_plan_of_a_llama_and_its_lowvm_layers() -> None:
    from lowvm.nn.quantize.model import quantize_model
    from tests.helpers.models import tiny_llama

    model = tiny_llama()
    plan = model_tp_plan(model)
    assert plan["model.layers.*.self_attn.q_proj"] == "colwise"
    assert plan["model.layers.*.mlp.down_proj"] == "rowwise"
    assert plan["lm_head"] == "colwise_gather_output"
    assert generic_name("model.layers.12.mlp.up_proj") == "model.layers.*.mlp.up_proj"
    quantize_model(model, dtype="int4", group_size=64, progress=False)
    styles = lowvm_styles(model)
    assert styles["model.layers.1.self_attn.o_proj"] == ("rowwise", None)
    assert "lm_head" not in styles  # skipped by default: dense, transformers' to split
    assert len(styles) == 14


# ------------------------------------------------------------------------------------
# Two ranks on the CPU (gloo)

_CONFIG = {"vocab_size": 256, "hidden_size": 256, "intermediate_size": 256,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "max_position_embeddings": 64}
_IDS = torch.arange(12).view(2, 6) * 7 % 256


def _dense(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**_CONFIG)).to(torch.float16).eval()


def _quantized():
    from lowvm.nn.quantize.model import quantize_model

    model = _dense()
    quantize_model(model, dtype="int4", group_size=64, progress=False)
    return model


_CPU_TIMEOUT_S = 900.0  # a 2-core CI machine, two ranks, several loads each


def _worker(rank: int, world: int, port: int, root: str) -> None:
    import torch.distributed as dist

    rank_log(root, rank, _CPU_TIMEOUT_S)
    warnings.simplefilter("ignore", LowvmFallbackWarning)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        import lowvm
        from lowvm.nn.hf.config import LowvmConfig
        from tests.helpers.models import tiny_llama

        out = {}
        # whole heads of the tiny Llama's k_proj (64 rows) cannot be split over 2 ranks
        small = tiny_llama()
        lowvm.quantize_model(small, dtype="int4", group_size=64, progress=False)
        before = small.model.layers[0].self_attn.q_proj
        try:
            lowvm.tensor_parallel(small)
        except TensorParallelError as exc:
            out["error"] = str(exc)
        out["unchanged"] = small.model.layers[0].self_attn.q_proj is before

        model = _quantized()
        done = lowvm.tensor_parallel(model)
        out["split"] = len(done)
        out["q_rows"] = model.model.layers[0].self_attn.q_proj.out_features
        with torch.no_grad():
            out["manual"] = model(_IDS).logits
        fused = _quantized()  # fused q/k/v and gate/up: each part split apart
        assert lowvm.fuse_projections(fused).attention_fused == 2
        lowvm.tensor_parallel(fused)
        out["fused_qkv_rows"] = fused.model.layers[0].self_attn.qkv_proj.out_features
        with torch.no_grad():
            out["fused"] = fused(_IDS).logits
        if importlib.util.find_spec("accelerate") is not None:  # transformers' TP needs it
            from transformers import AutoModelForCausalLM

            for key, path, kw in (
                    ("auto_saved", f"{root}/quantized", {}),
                    ("auto_on_load", f"{root}/dense",
                     {"quantization_config": LowvmConfig(dtype="int4", group_size=64)})):
                loaded = AutoModelForCausalLM.from_pretrained(path, tp_plan="auto", **kw)
                layer = loaded.model.layers[1].mlp.down_proj
                out[key + "_down_in"] = layer.in_features
                with torch.no_grad():
                    out[key] = loaded(_IDS).logits
            imported = lowvm.from_pretrained(f"{root}/gptq", tp_plan="auto")
            out["gptq_q_rows"] = imported.model.layers[0].self_attn.q_proj.out_features
            with torch.no_grad():
                out["gptq"] = imported(_IDS).logits
            try:  # act-order permutes K across every rank's slice: refused, named
                lowvm.from_pretrained(f"{root}/gptq_act_order", tp_plan="auto")
            except TensorParallelError as exc:
                out["act_order_error"] = str(exc)
        torch.save(out, f"{root}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_match_one_process(tmp_path) -> None:
    warnings.simplefilter("ignore", LowvmFallbackWarning)
    _dense().save_pretrained(tmp_path / "dense")
    single = _quantized()
    single.save_pretrained(tmp_path / "quantized")
    with torch.no_grad():
        ref = single(_IDS).logits.float()
    import lowvm
    from tests.helpers.hub_checkpoints import write_hub_checkpoint

    shape = {k: _CONFIG[k] for k in ("hidden_size", "intermediate_size",
                                     "num_attention_heads", "num_key_value_heads")}
    for folder, act_order in (("gptq", False), ("gptq_act_order", True)):
        write_hub_checkpoint(tmp_path / folder, "gptq", bits=4, group=64,
                             act_order=act_order, **shape)
    with torch.no_grad():
        gptq_ref = lowvm.from_pretrained(tmp_path / "gptq")(_IDS).logits.float()
    run_ranks(_worker, 2, (2, free_port(), str(tmp_path)), tmp_path, _CPU_TIMEOUT_S)
    outs = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    tol = 1e-2 * float(ref.abs().max())
    for out in outs:
        assert "model.layers.0.self_attn.k_proj" in out["error"]
        assert "64 per rank" in out["error"] or "multiple of 64" in out["error"]
        assert out["unchanged"]
        assert out["split"] == 14 and out["q_rows"] == 128
        assert out["fused_qkv_rows"] == 256  # 128 of q, 64 of k, 64 of v
        keys = ["manual", "fused"]
        if importlib.util.find_spec("accelerate") is not None:
            keys += ["auto_saved", "auto_on_load"]
            assert out["auto_saved_down_in"] == out["auto_on_load_down_in"] == 128
            assert out["gptq_q_rows"] == 128  # 256 rows of q_proj over 2 ranks
            diff = (out["gptq"].float() - gptq_ref).abs().max().item()
            assert diff <= 1e-2 * float(gptq_ref.abs().max()), ("gptq", diff)
            assert "o_proj" in out["act_order_error"] and "act-order" in out["act_order_error"]
        for key in keys:
            diff = (out[key].float() - ref).abs().max().item()
            assert diff <= tol, (key, diff, tol)
    assert torch.equal(outs[0]["manual"], outs[1]["manual"])


_GPU_TIMEOUT_S = 480.0  # cold kernel compiles in both ranks, then NCCL set-up


def _gpu_worker(rank: int, world: int, port: int, root: str) -> None:
    import torch.distributed as dist

    log = rank_log(root, rank, _GPU_TIMEOUT_S)
    start = time.monotonic()

    def step(what: str) -> None:
        log.write(f"{time.monotonic() - start:7.1f} s  {what}\n")

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    step("process group up")
    loop = None
    try:
        from transformers import AutoModelForCausalLM

        import lowvm  # noqa: F401  (registers lowvm with transformers)
        from lowvm.serving.decode_loop import DecodeLoop

        model = AutoModelForCausalLM.from_pretrained(f"{root}/quantized", tp_plan="auto")
        step("loaded")
        ids = _IDS.cuda()
        with torch.no_grad():
            logits = model(ids).logits
        torch.cuda.synchronize()
        step("forward done")
        loop = DecodeLoop(model, ids, 8)
        loop.capture()  # NCCL's all-reduces inside one CUDA graph per rank
        step("step captured")
        out = {"logits": logits.cpu(), "tokens": loop(8).cpu(),
               "graph": loop.graph is not None,
               "q_rows": model.model.layers[0].self_attn.q_proj.out_features}
        step("decoded")
        torch.save(out, f"{root}/gpu{rank}.pt")
    finally:
        if loop is not None:  # a live graph holding NCCL kernels blocks the teardown
            loop.close()
            torch.cuda.synchronize()
        dist.destroy_process_group()
        step("process group down")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2
                    or importlib.util.find_spec("accelerate") is None,
                    reason="needs 2 GPUs and accelerate (transformers' tp_plan)")
def test_tp_plan_auto_on_two_gpus(tmp_path) -> None:
    single = _quantized()
    single.save_pretrained(tmp_path / "quantized")
    single = single.cuda()
    with torch.no_grad():
        ref = single(_IDS.cuda()).logits.float().cpu()
    run_ranks(_gpu_worker, 2, (2, free_port(), str(tmp_path)), tmp_path, _GPU_TIMEOUT_S)
    outs = [torch.load(tmp_path / f"gpu{r}.pt") for r in range(2)]
    for out in outs:
        assert out["graph"] and out["q_rows"] == 128
        diff = (out["logits"].float() - ref).abs().max().item()
        assert diff <= 1e-2 * float(ref.abs().max()), diff
    assert torch.equal(outs[0]["tokens"], outs[1]["tokens"])
