"""Train a small Llama from scratch on the corpus for a fixed wall-clock budget.

A wall-clock budget (not a step count) keeps the benchmark's time fixed on any GPU; the
learning rate follows the fraction of the budget spent (linear warm-up, then cosine decay),
so the schedule ends when the time does. With ``max_steps`` the schedule follows steps
instead (the time budget still stops it), so a run is repeatable bit for bit on a CPU:
tests train a tiny model for a few steps. Weights are kept in float32, the forward runs
under bfloat16 autocast on CUDA, and the result is returned in float16, the type lowvm
quantizes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import LlamaForCausalLM

from lowvm.evaluation.configs import ModelRecipe, llama_config
from lowvm.evaluation.corpus import random_batch
from lowvm.evaluation.errors import EvaluationError

__all__ = ["Trained", "build_model", "learning_rate", "train"]


@dataclass
class Trained:
    """A trained model (float16, eval mode, no gradients) and how it got there."""

    model: Any
    steps: int
    seconds: float
    tokens: int
    train_loss: float  # mean over the last tenth of the steps
    loss_curve: list[tuple[int, float]] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        return {"steps": self.steps, "train_seconds": round(self.seconds, 1),
                "tokens_seen": self.tokens, "train_loss": self.train_loss,
                "loss_curve": [[s, round(v, 4)] for s, v in self.loss_curve]}


def build_model(r: ModelRecipe, seed: int, device: str | torch.device) -> Any:
    """A float32 model of ``r`` initialised from ``seed`` (transformers' initialisation)."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(llama_config(r))
    return model.float()


def learning_rate(progress: float, r: ModelRecipe) -> float:
    """The rate at ``progress`` in [0, 1] of training: linear warm-up over ``r.warmup``,
    then cosine decay from ``r.learning_rate`` to ``r.final_lr`` of it."""
    progress = min(max(progress, 0.0), 1.0)
    if progress < r.warmup:
        return r.learning_rate * (progress / r.warmup if r.warmup else 1.0)
    span = (progress - r.warmup) / max(1.0 - r.warmup, 1e-12)
    floor = r.final_lr * r.learning_rate
    return floor + (r.learning_rate - floor) * 0.5 * (1.0 + math.cos(math.pi * span))


def train(tokens: torch.Tensor, r: ModelRecipe, device: str | torch.device, *,
          seconds: float | None = None, max_steps: int | None = None, seed: int = 0,
          log: Callable[[str], None] | None = print, log_every: int = 100) -> Trained:
    """Train a model of ``r`` on the 1-D byte tensor ``tokens`` for ``seconds`` of wall
    clock (default ``r.train_seconds``) or ``max_steps`` steps, whichever ends first."""
    seconds = r.train_seconds if seconds is None else seconds
    if not (isinstance(seconds, (int, float)) and seconds > 0):
        raise EvaluationError(f"seconds={seconds!r}: accepted: a positive number")
    if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
        raise EvaluationError(f"max_steps={max_steps!r}: accepted: a positive int or None")
    device = torch.device(device)
    cuda = device.type == "cuda"
    model = build_model(r, seed, device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": r.weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=r.learning_rate, betas=(0.9, 0.95), eps=1e-8, **({"fused": True} if cuda else {}))
    data = tokens.to(device)
    generator = torch.Generator().manual_seed(seed)
    losses: list[torch.Tensor] = []
    curve: list[tuple[int, float]] = []
    step = 0
    start = time.perf_counter()
    while True:
        elapsed = time.perf_counter() - start
        if elapsed >= seconds or (max_steps is not None and step >= max_steps):
            break
        progress = step / max_steps if max_steps else elapsed / seconds
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(progress, r)
        batch = random_batch(data, r.seq_len + 1, r.batch_size, generator)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            logits = model(input_ids=batch[:, :-1], use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                 batch[:, 1:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(loss.detach())
        step += 1
        if step % log_every == 0 or step == 1:
            value = loss.item()
            if not math.isfinite(value):
                raise EvaluationError(f"training diverged: loss {value} at step {step}; "
                                      "accepted: a lower learning rate in the recipe")
            curve.append((step, value))
            if log:
                log(f"  step {step:6d}  {time.perf_counter() - start:7.1f} s  loss {value:.4f}"
                    f"  lr {optimizer.param_groups[0]['lr']:.2e}")
    if cuda:
        torch.cuda.synchronize(device)
    took = time.perf_counter() - start
    tail = torch.stack(losses[-max(1, len(losses) // 10):]).float().mean().item() if losses \
        else float("nan")
    if losses and (not curve or curve[-1][0] != step):
        curve.append((step, losses[-1].item()))
    model = model.half().eval().requires_grad_(False)
    return Trained(model, step, took, step * r.batch_size * r.seq_len, tail, curve)
