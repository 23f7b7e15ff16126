"""Decode speed of a tensor-parallel random Llama: ``torchrun -m lowvm.serving.tp_bench``.

Run as ``torchrun --nproc-per-node W -m lowvm.serving.tp_bench --config llama3-70b
--dtype int4,float16 --batch-sizes 1,16 --json OUT`` (one process per GPU; without
torchrun it runs as one rank, tp=1, the baseline).

Why it builds the model as shards: a 70B model does not fit one GPU in float16, and
building the dense model to split it would need it whole somewhere. So the model is made
on the ``meta`` device, each planned projection is replaced by this rank's shard (a
``QuantLinear`` of the shard's shape, or a float16 ``nn.Linear``), and only then is memory
allocated, on the rank's GPU; random codes and scales are written with ``set_codes``.
Each rank draws its own shards (weights are random: only shapes matter for speed). The
split is Megatron's, as :mod:`lowvm.nn.serve.tensor_parallel` makes it: q/k/v and gate/up
colwise, o and down rowwise with an all-reduce of their outputs, ``lm_head`` colwise
with its outputs gathered; embeddings and norms are replicated. A float16 run is skipped
(its row says why) where the rank's shards would not fit the GPU's free memory. With
``--fuse`` (the default) each rank's q/k/v shards and gate/up shards, quantized or
float16 alike, become one GEMM each (``lowvm.fuse_projections``; colwise shards are whole
heads and whole MLP columns, so a rank's concatenation is exactly its part of the fused
layer); every row records ``fused``.

Per (type, batch): a :class:`~lowvm.serving.decode_loop.DecodeLoop` (an eager prefill,
then each decode step captured in one CUDA graph per rank, NCCL's all-reduces inside it)
gives ``step_ms`` (one step replayed alone, :meth:`DecodeLoop.step_ms`) and ``tok_s =
batch * 1000 / step_ms``; ``mem_gib_per_gpu`` is ``torch.cuda.memory_allocated()`` after
building (weights only); ``allreduce_ms_per_step`` is the time between CUDA events around
each all-reduce of an eager step, summed (it includes waiting for the slowest rank's
host, so it bounds the communication from above); ``allreduce_graph_ms_per_step`` is the
same number of all-reduces of the same size replayed alone in one CUDA graph (what a
graphed step spends communicating); ``tokens_agree`` says every rank produced the
same greedy tokens. Rank 0 rewrites ``--json`` after each row, so a run cut short keeps
what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import gc
import json
import os
import socket
import statistics
import sys
import time
import traceback
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from lowvm.dtypes import dtype as lowvm_dtype
from lowvm.nn.layer.quant_linear import QuantLinear
from lowvm.nn.serve.tensor_parallel import AllReduceOutput, GatherOutput, communication_hook
from lowvm.nn.swap import set_module
from lowvm.serving.decode_loop import DecodeLoop
from lowvm.serving.errors import ServingError
from lowvm.serving.models import random_config

__all__ = ["CONFIGS", "LAYER_STYLES", "build_model", "shard_shape", "measure_row", "main"]

#: model shapes by name (random_config's fields); llama3-70b: Llama-3-70B's
CONFIGS: dict[str, tuple[str, dict[str, int]]] = {
    "tiny": ("tiny", {"hidden": 256, "intermediate": 512, "heads": 4, "kv_heads": 2}),
    "llama3-8b": ("llama3-8b", {}),
    "llama3-70b": ("llama3-8b", {"hidden": 8192, "intermediate": 28672, "layers": 80,
                                 "heads": 64, "kv_heads": 8, "vocab": 128256}),
}
#: the split of a Llama decoder layer's projections (transformers' base_model_tp_plan)
LAYER_STYLES = {"self_attn.q_proj": "colwise", "self_attn.k_proj": "colwise",
                "self_attn.v_proj": "colwise", "self_attn.o_proj": "rowwise",
                "mlp.gate_proj": "colwise", "mlp.up_proj": "colwise",
                "mlp.down_proj": "rowwise"}


def shard_shape(in_features: int, out_features: int, style: str, world: int
                ) -> tuple[int, int]:
    """``(in, out)`` of one rank's shard of an ``[out, in]`` projection."""
    if style == "rowwise":
        return in_features // world, out_features
    return in_features, out_features // world


def _shard_module(linear: nn.Linear, style: str, world: int, wtype: str,
                  group_size: int) -> nn.Module:
    """An empty shard on the meta device: a QuantLinear, or a float16 Linear."""
    k, n = shard_shape(linear.in_features, linear.out_features, style, world)
    if wtype == "float16":
        return nn.Linear(k, n, bias=False, device="meta", dtype=torch.float16)
    group = group_size if group_size < linear.in_features else -1
    return QuantLinear(k, n, wtype, group, device="meta")


@torch.no_grad()
def _fill_quant(layer: QuantLinear, gen: torch.Generator) -> None:
    """Random codes; scales that give the weights a spread of about 0.02."""
    nbits = layer.spec.wtype.nbits
    device = layer.qweight.device
    codes = torch.randint(0, 1 << nbits, (layer.out_features, layer.in_features),
                          generator=gen, device=device, dtype=torch.uint8)
    scales = torch.full_like(layer.scales, 0.04 / (1 << nbits))
    zeros = (torch.full_like(layer.zeros, float(1 << (nbits - 1)))
             if layer.zeros is not None else None)
    layer.set_codes(codes, scales, zeros)


@torch.no_grad()
def build_model(config: Any, wtype: str, group_size: int, rank: int, world: int,
                group: Any, device: torch.device, seed: int = 0) -> tuple[Any, list[Any]]:
    """``(model, communication hooks)``: this rank's part of a random Llama of ``config``,
    its projections ``wtype`` shards (``float16`` or a lowvm type), on ``device``."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    styles: dict[str, str] = {}
    for i in range(config.num_hidden_layers):
        for local, style in LAYER_STYLES.items():
            name = f"model.layers.{i}.{local}"
            set_module(model, name, _shard_module(model.get_submodule(name), style, world,
                                                  wtype, group_size))
            styles[name] = style
    head = model.lm_head
    if world > 1 and head.out_features % world == 0:
        model.lm_head = nn.Linear(head.in_features, head.out_features // world, bias=False,
                                  device="meta", dtype=torch.float16)
        styles["lm_head"] = "colwise_gather_output"
    if device.type == "meta":  # shapes only (what a rank would hold)
        return model, []
    model.to_empty(device=device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed * 1_000_003 + rank)
    for module in model.modules():
        if isinstance(module, QuantLinear):
            _fill_quant(module, gen)
        elif isinstance(module, nn.Linear | nn.Embedding):
            module.weight.normal_(0.0, 0.02, generator=gen)
        elif hasattr(module, "weight") and isinstance(module.weight, torch.Tensor) \
                and module.weight.dim() == 1:  # norms
            module.weight.fill_(1.0)
    rotary = model.model.rotary_emb  # its buffers were left uninitialised by to_empty
    model.model.rotary_emb = type(rotary)(config=config).to(device)  # built on the CPU
    hooks = [communication_hook(model.get_submodule(name), style, group)
             for name, style in styles.items()] if world > 1 else []
    model.requires_grad_(False)
    return model.eval(), [h for h in hooks if h is not None]


def _meta_bytes(config: Any, wtype: str, group_size: int, world: int) -> int:
    """Bytes of one rank's weights, counted on the meta device (nothing allocated)."""
    model, _ = build_model(config, wtype, group_size, 0, world, None, torch.device("meta"))
    seen = {id(t): t.numel() * t.element_size()
            for t in (*model.parameters(), *model.buffers())}
    return sum(seen.values())


def _eager_comm_ms(loop: DecodeLoop, hooks: Sequence[Any], repeats: int = 3
                   ) -> tuple[float | None, float | None, float | None]:
    """(all-reduce ms, gather ms, whole step ms) of an eager decode step, medians."""
    if not hooks or not torch.cuda.is_available():
        return None, None, None
    reduce_ms, gather_ms, step_ms = [], [], []
    for _ in range(repeats):
        loop._prefill()
        loop.ids.copy_(loop.out[:, :1])
        loop.pos.copy_(loop.step_pos[:, :1])
        for hook in hooks:
            hook.timer = []
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        loop.next.copy_(loop._forward_pick(loop.ids, loop.pos))
        end.record()
        torch.cuda.synchronize()
        step_ms.append(start.elapsed_time(end))
        for kind, out in ((AllReduceOutput, reduce_ms), (GatherOutput, gather_ms)):
            out.append(sum(a.elapsed_time(b) for h in hooks if isinstance(h, kind)
                           for a, b in h.timer or ()))
        for hook in hooks:
            hook.timer = None
    return (statistics.median(reduce_ms), statistics.median(gather_ms),
            statistics.median(step_ms))


def _graph_allreduce_ms(count: int, batch: int, hidden: int, device: torch.device,
                        group: Any) -> float | None:
    """ms of ``count`` all-reduces of a ``[batch, hidden]`` float16 tensor (a decode step's
    o/down outputs) replayed alone in one CUDA graph (:func:`~lowvm.runtime.timing.
    time_graph`, median): the communication a graphed step cannot avoid, without the
    eager timing's wait for the slowest rank's host."""
    if count == 0 or device.type != "cuda":
        return None
    from lowvm.runtime.timing import time_graph

    buf = torch.zeros(batch, hidden, dtype=torch.float16, device=device)
    per_call = time_graph([functools.partial(dist.all_reduce, buf, group=group)] * count)
    return per_call.median_us * count / 1e3


def _agree(tokens: torch.Tensor, group: Any, world: int) -> bool:
    if world == 1:
        return True
    mine = tokens.to(torch.long).contiguous()
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=group)
    return all(torch.equal(every[0], t) for t in every)


def measure_row(model: Any, hooks: Sequence[Any], batch: int, args: argparse.Namespace,
                device: torch.device, group: Any, world: int) -> dict[str, Any]:
    """One (type, batch) row: decode step time in a CUDA graph, all-reduce time."""
    cuda = device.type == "cuda"
    gen = torch.Generator().manual_seed(args.seed + batch)  # the same prompt on every rank
    ids = torch.randint(0, model.config.vocab_size, (batch, args.prompt_len), generator=gen)
    loop = DecodeLoop(model, ids.to(device), args.tokens)
    try:
        if cuda and not args.no_graphs:
            loop.capture()
        tokens = loop(args.tokens)
        step_ms = loop.step_ms(args.steps, "cuda" if cuda else "cpu")
        reduce_ms, gather_ms, eager_ms = _eager_comm_ms(loop, hooks)
        row = {"batch": batch, "step_ms": step_ms,
               "tok_s": batch * 1e3 / step_ms if step_ms else None,
               "allreduce_ms_per_step": reduce_ms,
               "allreduce_graph_ms_per_step": _graph_allreduce_ms(
                   sum(isinstance(h, AllReduceOutput) for h in hooks), batch,
                   model.config.hidden_size, device, group),
               "gather_ms_per_step": gather_ms,
               "eager_step_ms": eager_ms,
               "allreduces_per_step": sum(isinstance(h, AllReduceOutput) for h in hooks),
               "cuda_graph": loop.graph is not None, "loop_build_s": loop.build_s,
               "tokens_agree": _agree(tokens, group, world)}
        if cuda:
            row["peak_gib_per_gpu"] = torch.cuda.max_memory_allocated() / 2**30
        return row
    finally:
        loop.close()


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lowvm.serving.tp_bench",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="tiny", choices=sorted(CONFIGS))
    p.add_argument("--layers", type=int, default=None, help="decoder layers (default: the "
                   "config's)")
    p.add_argument("--dtype", default="int4", help="comma list: float16 and/or lowvm types")
    p.add_argument("--group-size", type=int, default=128)
    p.add_argument("--batch-sizes", default="1", help="comma list")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--tokens", type=int, default=64, help="decode steps the cache holds")
    p.add_argument("--steps", type=int, default=50, help="steps replayed for step_ms")
    p.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=True,
                   help="fuse q/k/v and gate/up shards, quantized and float16 (default on)")
    p.add_argument("--attention", choices=("sdpa", "lowvm"), default="sdpa",
                   help="lowvm: lowvm's decode attention for quantized models")
    p.add_argument("--no-graphs", action="store_true", help="eager steps (diagnostic)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="rank 0 writes the results here")
    args = p.parse_args(argv)
    args.dtypes = [d.strip() for d in args.dtype.split(",") if d.strip()]
    for d in args.dtypes:
        if d != "float16":
            lowvm_dtype(d)  # a bad type fails before any process group work
    args.batches = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    return args


def _free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _init(device_kind: str) -> tuple[torch.device, Any, int, int, bool]:
    """(device, group, rank, world, whether this call started the process group)."""
    cuda = device_kind == "cuda" or (device_kind == "auto" and torch.cuda.is_available())
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    started = False
    if not dist.is_initialized():
        if "RANK" not in os.environ:  # one rank, no launcher
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
            os.environ.update(RANK="0", WORLD_SIZE="1")
        dist.init_process_group("nccl" if cuda else "gloo",
                                timeout=datetime.timedelta(minutes=15),
                                **({"device_id": device} if cuda else {}))
        started = True
    return device, None, dist.get_rank(), dist.get_world_size(), started


def _config(args: argparse.Namespace) -> Any:
    preset, shape = CONFIGS[args.config]
    overrides = dict(shape)
    if args.layers is not None:
        overrides["layers"] = args.layers
    return random_config(preset, **overrides)


def _fits(config: Any, wtype: str, args: argparse.Namespace, device: torch.device,
          world: int) -> tuple[bool, int]:
    """(every rank has room for its weights plus 10 %, the weights' bytes per rank)."""
    need = _meta_bytes(config, wtype, args.group_size, world)
    _empty_cache()
    ok = 1
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        ok = int(need * 1.1 + 2**30 < free)
    flag = torch.tensor([ok], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item()), need


def _environment(device: torch.device, world: int) -> dict[str, Any]:
    import transformers

    env = {"torch": torch.__version__, "transformers": transformers.__version__,
           "world": world, "device": str(device)}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
        version = torch.cuda.nccl.version()
        env["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    return env


def _write(path: str | None, rank: int, result: dict[str, Any]) -> None:
    if path and rank == 0:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, path)


def _empty_cache() -> None:
    """Give freed blocks back to the driver, so free-memory checks see them."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _run_dtype(wtype: str, config: Any, args: argparse.Namespace, device: torch.device,
               group: Any, rank: int, world: int, result: dict[str, Any]) -> None:
    base = {"dtype": wtype, "tp": world, "layers": config.num_hidden_layers}
    fits, need = _fits(config, wtype, args, device, world)
    if not fits:
        for batch in args.batches:
            result["rows"].append({**base, "batch": batch, "skipped":
                                   f"{need / 2**30:.1f} GiB of weights per GPU do not fit "
                                   "the free memory"})
        _write(args.json, rank, result)
        return
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    model, hooks = build_model(config, wtype, args.group_size, rank, world, group, device,
                               args.seed)
    if device.type == "cuda":
        torch.cuda.synchronize()
    build_s = time.perf_counter() - start
    mem = torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else None
    extra: dict[str, Any] = {"weight_gib_per_gpu": need / 2**30, "build_s": build_s,
                             "mem_gib_per_gpu": mem, "fused": False, "attention": "sdpa"}
    if args.fuse:  # float16 too: the shards of q/k/v (gate/up) are all colwise, so the
        # concatenation of one rank's is that rank's heads' q, k, v (its gate and up columns)
        from lowvm.nn.serve.fuse import fuse_projections

        extra["fused"] = fuse_projections(model).attention_fused > 0
    if wtype != "float16":
        if args.attention == "lowvm":
            from lowvm.nn.serve.attention import use_decode_attention

            use_decode_attention(model)
            extra["attention"] = "lowvm"
    try:
        for batch in args.batches:
            row = {**base, **extra}
            try:
                row.update(measure_row(model, hooks, batch, args, device, group, world))
            except Exception as exc:  # noqa: BLE001 - recorded; the other rows still run
                row["error"] = f"{type(exc).__name__}: {exc}"
                if rank == 0:
                    traceback.print_exc()
            result["rows"].append(row)
            if rank == 0:
                print(json.dumps(row), flush=True)
            _write(args.json, rank, result)
    finally:
        model = hooks = None  # the last references: freed before the next type is built
        _empty_cache()


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the benchmark on this rank; returns the result (rank 0 also writes it)."""
    args = _parse(argv)
    if args.steps < 1 or args.tokens < 2 or args.prompt_len < 1 or not args.batches:
        raise ServingError("tp_bench: --steps >= 1, --tokens >= 2, --prompt-len >= 1 and at "
                           "least one batch size are needed")
    device, group, rank, world, started = _init(args.device)
    try:
        config = _config(args)
        result: dict[str, Any] = {"ok": False, "config": args.config,
                                  "shape": {"hidden": config.hidden_size,
                                            "intermediate": config.intermediate_size,
                                            "layers": config.num_hidden_layers,
                                            "heads": config.num_attention_heads,
                                            "kv_heads": config.num_key_value_heads,
                                            "vocab": config.vocab_size},
                                  "settings": {k: v for k, v in vars(args).items()
                                               if k not in ("dtypes", "batches")},
                                  "environment": _environment(device, world), "rows": []}
        for wtype in args.dtypes:
            _run_dtype(wtype, config, args, device, group, rank, world, result)
        result["ok"] = all("error" not in r for r in result["rows"])
        _write(args.json, rank, result)
        return result
    finally:
        if started:
            dist.destroy_process_group()


if __name__ == "__main__":
    out = main()
    sys.exit(0 if out["ok"] else 1)
