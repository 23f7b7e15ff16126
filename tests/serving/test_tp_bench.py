"""The tensor-parallel benchmark's CPU-runnable parts: shard shapes, per-rank weight bytes
counted on the meta device, and a tiny 2-rank run (gloo) writing its JSON."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch

from lowvm.errors import DTypeError
from lowvm.nn.layer.quant_linear import QuantLinear
from lowvm.serving import tp_bench
from tests.helpers.ranks import free_port, rank_log, run_ranks

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.layer.backend.LowvmFallbackWarning")


def test_shard_shape() -> None:
    assert tp_bench.shard_shape(8192, 28672, "colwise", 4) == (8192, 7168)
    assert tp_bench.shard_shape(28672, 8192, "rowwise", 4) == (7168, 8192)


def test_70b_shape() -> None:
    config = tp_bench._config(tp_bench._parse(["--config", "llama3-70b"]))
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers,
            config.num_attention_heads, config.num_key_value_heads, config.vocab_size) == \
        (8192, 28672, 80, 64, 8, 128256)
    assert tp_bench._config(tp_bench._parse(["--config", "llama3-70b", "--layers", "2"])
                            ).num_hidden_layers == 2


@pytest.mark.slow
def test_meta_build_holds_one_rank_of_the_projections() -> None:
    config = tp_bench._config(tp_bench._parse(["--config", "tiny"]))

    def projection_bytes(world: int) -> int:
        model, hooks = tp_bench.build_model(config, "int4", 128, 0, world, None,
                                            torch.device("meta"))
        assert hooks == []  # nothing allocated, nothing hooked
        return sum(layer.weight_bytes() for layer in model.modules()
                   if isinstance(layer, QuantLinear))

    model, _ = tp_bench.build_model(config, "int4", 128, 0, 2, None, torch.device("meta"))
    attn = model.model.layers[0].self_attn
    assert (attn.q_proj.out_features, attn.o_proj.in_features) == (128, 128)
    assert model.lm_head.out_features == config.vocab_size // 2
    one, two = projection_bytes(1), projection_bytes(2)
    assert abs(two * 2 - one) <= 0.02 * one  # scales of rowwise shards are not split
    assert tp_bench._meta_bytes(config, "float16", 128, 2) < \
        tp_bench._meta_bytes(config, "float16", 128, 1)


def test_bad_type_fails_before_any_process_group() -> None:
    with pytest.raises(DTypeError):
        tp_bench._parse(["--dtype", "int4,int99"])


_TIMEOUT_S = 600.0


def _worker(rank: int, world: int, port: int, path: str) -> None:
    rank_log(os.path.dirname(path), rank, _TIMEOUT_S)
    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    tp_bench.main(["--config", "tiny", "--layers", "1", "--dtype", "int4,float16",
                   "--batch-sizes", "1,2", "--prompt-len", "4", "--tokens", "3", "--steps",
                   "1", "--device", "cpu", "--json", path])


@pytest.mark.slow
def test_two_ranks_write_rows(tmp_path) -> None:
    path = tmp_path / "tp.json"
    run_ranks(_worker, 2, (2, free_port(), str(path)), tmp_path, _TIMEOUT_S)
    result = json.loads(path.read_text())
    assert result["ok"] and result["environment"]["world"] == 2
    rows = result["rows"]
    assert [(r["dtype"], r["batch"]) for r in rows] == [
        ("int4", 1), ("int4", 2), ("float16", 1), ("float16", 2)]
    for row in rows:
        assert row["tp"] == 2 and row["tokens_agree"] and row["tok_s"] > 0
        assert row["allreduces_per_step"] == 2  # o_proj and down_proj of the one layer
    assert rows[0]["fused"] and rows[2]["fused"]  # float16 shards are fused too (--fuse)


@pytest.mark.gpu
def test_one_gpu_run(tmp_path) -> None:
    path = tmp_path / "tp.json"
    out = tp_bench.main(["--config", "tiny", "--dtype", "int4,float16", "--batch-sizes",
                         "1,4", "--tokens", "8", "--steps", "4", "--json", str(path)])
    assert out["ok"], out
    for row in out["rows"]:
        assert row["cuda_graph"] and row["tok_s"] > 0 and row["mem_gib_per_gpu"] > 0
