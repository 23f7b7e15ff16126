"""The float16 baseline of the serving measurements is fused like the quantized models, so
their speed ratio measures the weights, not the fusion (python -m lowvm.serving, tp_bench)."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch
import torch.distributed as dist

from lowvm.nn.serve.fuse import FusedGateUpMLP, fuse_projections
from lowvm.serving import cli as serving_cli
from lowvm.serving import tp_bench
from tests.helpers.ranks import free_port, rank_log, run_ranks

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.layer.backend.LowvmFallbackWarning")

SERVING = ["--dtype", "int4", "--group-size", "64", "--new-tokens", "3", "--batch-sizes", "1",
           "--prompt-len", "6", "--repeats", "1", "--modes", "eager", "--forward-steps", "0",
           "--fp16-attention", "sdpa,lowvm"]


@pytest.mark.slow
@pytest.mark.parametrize("fuse", [True, False])
def test_serving_fuses_the_float16_rows_too(tmp_path, fuse):
    out = tmp_path / "result.json"
    serving_cli.main([*SERVING, "--json", str(out), *([] if fuse else ["--no-fuse"])])
    result = json.loads(out.read_text())
    assert result["errors"] == [] and result["fuse"] is fuse
    models = result["models"]
    assert list(models) == ["float16", "float16+attn", "int4"]
    if fuse:
        assert models["float16"]["fuse_report"] == {"attention_fused": 2, "mlps_fused": 2,
                                                    "dense_fused": 4, "skipped": []}
        assert models["int4"]["fuse_report"]["dense_fused"] == 0
    else:
        assert "fuse_report" not in models["float16"]
    assert models["float16"]["fused"] is models["float16+attn"]["fused"] is fuse
    # the quantized copy is compared with the float16 layers as they were, before fusing
    assert models["int4"]["quality"]["layers_compared"] == 14
    rows = result["speed"]
    assert [(r["model"], r["fused"]) for r in rows] == [
        ("float16", fuse), ("float16+attn", fuse), ("int4", fuse)]
    assert all(r["e2e_tokens_per_s"] > 0 for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("flag", [[], ["--no-fuse"]])
def test_tp_bench_one_rank_fuses_float16(tmp_path, flag):
    out = tp_bench.main(["--config", "tiny", "--layers", "1", "--dtype", "float16",
                         "--batch-sizes", "1", "--prompt-len", "4", "--tokens", "3",
                         "--steps", "1", "--device", "cpu", *flag])
    assert out["ok"] and [r["fused"] for r in out["rows"]] == [not flag]


_TIMEOUT_S = 600.0


def _colwise_worker(rank: int, world: int, port: int, path: str) -> None:
    """One rank's float16 shards, fused against unfused: the same logits on every rank."""
    rank_log(os.path.dirname(path), rank, _TIMEOUT_S)
    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        config = tp_bench._config(tp_bench._parse(["--config", "tiny", "--layers", "2"]))
        model, _ = tp_bench.build_model(config, "float16", 128, rank, world, None,
                                        torch.device("cpu"))
        attn = model.model.layers[0].self_attn
        shard = (attn.q_proj.out_features, attn.k_proj.out_features)
        ids = torch.randint(0, config.vocab_size, (2, 5), generator=torch.Generator()
                            .manual_seed(0))
        with torch.no_grad():
            unfused = model(ids).logits.float()
            report = fuse_projections(model)
            fused = model(ids).logits.float()
        mlp = model.model.layers[1].mlp
        with open(f"{path}.{rank}", "w") as f:
            json.dump({"report": [report.attention_fused, report.mlps_fused,
                                  report.dense_fused, report.skipped],
                       "shard": shard, "fused_mlp": isinstance(mlp, FusedGateUpMLP),
                       "qkv": model.model.layers[0].self_attn.qkv_proj.out_features,
                       "gate_up": mlp.gate_up_proj.out_features,
                       "max_diff": (fused - unfused).abs().max().item(),
                       "scale": unfused.abs().max().item()}, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_fuse_their_colwise_shards(tmp_path):
    """Each rank's q/k/v (gate/up) shards are whole heads (MLP columns): fused, a rank's
    attention and MLP compute what its unfused shards did, all-reduced as before."""
    path = str(tmp_path / "rank")
    run_ranks(_colwise_worker, 2, (2, free_port(), path), tmp_path, _TIMEOUT_S)
    for rank in range(2):
        got = json.loads(open(f"{path}.{rank}").read())
        assert got["report"] == [2, 2, 4, []] and got["fused_mlp"]
        q, k = got["shard"]  # tiny: 4 heads of 64, 2 KV heads, hidden 256, MLP 512
        assert (q, k) == (256 // 2, 128 // 2) and got["qkv"] == q + 2 * k
        assert got["gate_up"] == 2 * 512 // 2
        # the same dot products: bitwise here; within one float16 ulp for any BLAS
        assert got["max_diff"] <= 2.0**-10 * got["scale"]
