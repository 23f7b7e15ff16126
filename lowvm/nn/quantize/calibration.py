"""Feed calibration inputs through a Hugging Face decoder one block at a time, collecting
each linear layer's input Hessian ``H = 2/n Σ x xᵀ`` (float32) on the model's device.

Why block by block: a calibrated quantizer must see each layer's inputs as the *quantized*
model produces them, and holding every layer's activations for the whole model at once
would cost far more memory than the model. So the inputs of the first decoder block are
captured (a forward pre-hook stops the model's forward there), and then, per block:
hooks on its linears accumulate their Hessians while the block runs on the stored inputs;
the caller uses them (quantizes the block's layers, or measures them); if it changed the
block, the block runs once more so that its outputs, the next block's inputs, come from
the quantized layers. Memory: one block's activations for all samples, plus the Hessians
of that block's layers.

Linears outside the block list (``lm_head`` when not skipped, for instance) get their
Hessian from one more forward pass of the whole model (blocks already processed) on the
calibration inputs, after the last block. A linear that no input reached gets no Hessian
(None): callers fall back to round to nearest for it.

:func:`output_fisher` weighs each layer's output channels by how much the model's output
distribution depends on them (what bit budgets need to compare errors across layers): one
forward and backward pass of the whole dense model per calibration item.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lowvm.nn.errors import QuantizationError

__all__ = ["prepare_calibration", "find_blocks", "run_blocks", "HessianHook", "output_fisher"]

#: ``handle(hessians)`` gets ``{layer name: H [K, K] float32 or None}`` for the planned layers
#: of one block (or of the layers outside the blocks) and says whether it changed the model.
Handler = Callable[[dict[str, "torch.Tensor | None"]], bool]


#: the index dtypes torch's embedding takes
_ID_DTYPES = (torch.int64, torch.int32)


class _Stop(Exception):
    """Raised by the capture hook: the model's forward is not needed past block 0."""


def prepare_calibration(calibration: Any, where: str = "quantize_model") -> list[dict[str, Any]]:
    """The calibration samples as model keyword arguments, checked before any work.

    Each item is an integer ``input_ids`` tensor (``[B, T]``, or ``[T]`` for one sequence)
    or a dict of model inputs (``input_ids``, ``attention_mask``, ...). The iterable is read
    once; an empty one, or an item of another kind, is a QuantizationError.
    """
    if calibration is None or isinstance(calibration, (str, bytes)) or not isinstance(
            calibration, Iterable):
        raise QuantizationError(f"{where}: calibration must be an iterable of input_ids "
                                f"tensors or dicts of model inputs; got "
                                f"{type(calibration).__name__}")
    samples: list[dict[str, Any]] = []
    for i, item in enumerate(calibration):
        if isinstance(item, torch.Tensor):
            sample: dict[str, Any] = {"input_ids": item}
        elif isinstance(item, Mapping) and item and all(isinstance(k, str) for k in item):
            sample = dict(item)
        else:
            raise QuantizationError(
                f"{where}: calibration item {i} is {_describe(item)}; each item must be an "
                "integer input_ids tensor ([batch, tokens] or [tokens]) or a non-empty dict "
                "of model inputs with string keys")
        ids = sample.get("input_ids")
        if ids is not None:
            if (not isinstance(ids, torch.Tensor) or ids.dtype not in _ID_DTYPES
                    or ids.dim() not in (1, 2) or ids.numel() == 0):
                raise QuantizationError(
                    f"{where}: calibration item {i}: input_ids is {_describe(ids)}; it must "
                    "be a non-empty torch.int64 or torch.int32 tensor (what an embedding "
                    "takes) of shape [batch, tokens] or [tokens]")
            if ids.dim() == 1:
                sample["input_ids"] = ids.unsqueeze(0)
                mask = sample.get("attention_mask")
                if isinstance(mask, torch.Tensor) and mask.dim() == 1:
                    sample["attention_mask"] = mask.unsqueeze(0)
        samples.append(sample)
    if not samples:
        raise QuantizationError(f"{where}: calibration is empty; give at least one batch of "
                                "input_ids (a few hundred thousand tokens of text is usual)")
    return samples


def find_blocks(model: nn.Module, where: str = "quantize_model") -> tuple[str, nn.ModuleList]:
    """The decoder's block list: ``model.model.layers`` where it exists, else the
    ``nn.ModuleList`` holding the most ``nn.Linear`` modules (the outermost on ties)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if isinstance(layers, nn.ModuleList) and len(layers) and _count_linears(layers):
        return "model.layers", layers
    best: tuple[int, str, nn.ModuleList | None] = (0, "", None)
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module):
            count = _count_linears(module)
            if count > best[0]:
                best = (count, name, module)
    if best[2] is None:
        raise QuantizationError(f"{where}: {type(model).__name__} has no list of blocks (an "
                                "nn.ModuleList of layers holding nn.Linear modules, like "
                                "model.model.layers of a Hugging Face decoder); calibrated "
                                "quantization walks the blocks one at a time")
    return best[1], best[2]


def _count_linears(module: nn.Module) -> int:
    return sum(isinstance(m, nn.Linear) for m in module.modules())


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"


class HessianHook:
    """Accumulates ``Σ x xᵀ`` (float32) over every row of a linear's inputs."""

    def __init__(self, module: nn.Linear) -> None:
        self.sum: torch.Tensor | None = None
        self.rows = 0
        self.handle = module.register_forward_hook(self._hook)

    def _hook(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        x = args[0].detach()
        x = x.reshape(-1, x.shape[-1]).float()
        if self.sum is None:
            self.sum = torch.zeros(x.shape[1], x.shape[1], dtype=torch.float32, device=x.device)
        self.sum.addmm_(x.t(), x)
        self.rows += x.shape[0]

    def hessian(self) -> torch.Tensor | None:
        """``2/n Σ x xᵀ``, or None if no input reached the layer."""
        if self.sum is None or self.rows == 0:
            return None
        return self.sum.mul_(2.0 / self.rows)

    def remove(self) -> None:
        self.handle.remove()


@dataclass
class _Call:
    """One sample's call of a block: positional and keyword arguments, hidden states first
    (or as the ``hidden_states`` keyword)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def with_hidden(self, hidden: torch.Tensor) -> _Call:
        if self.args:
            return _Call((hidden, *self.args[1:]), self.kwargs)
        return _Call((), {**self.kwargs, "hidden_states": hidden})


def _model_device(model: nn.Module) -> torch.device:
    embeddings = getattr(model, "get_input_embeddings", lambda: None)()
    weight = getattr(embeddings, "weight", None)
    if isinstance(weight, torch.Tensor):
        return weight.device
    return next(model.parameters()).device


def _to(value: Any, device: torch.device) -> Any:
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _forward(model: nn.Module, sample: Mapping[str, Any], device: torch.device) -> Any:
    inputs = {key: _to(value, device) for key, value in sample.items()}
    inputs["use_cache"] = False
    return model(**inputs)


def _capture(model: nn.Module, block: nn.Module, samples: list[dict[str, Any]],
             where: str) -> list[_Call]:
    """The arguments the first block receives for each sample."""
    calls: list[_Call] = []

    def grab(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not args and not isinstance(kwargs.get("hidden_states"), torch.Tensor):
            raise QuantizationError(f"{where}: the first block was called without hidden "
                                    "states (neither a first positional argument nor "
                                    "hidden_states=)")
        calls.append(_Call(tuple(args), dict(kwargs)))
        raise _Stop

    _check_token_ids(model, samples, where)
    handle = block.register_forward_pre_hook(grab, with_kwargs=True)
    device = _model_device(model)
    try:
        for i, sample in enumerate(samples):
            try:
                _forward(model, sample, device)
            except _Stop:
                continue
            except (TypeError, ValueError, IndexError) as exc:  # the model refused the input
                raise QuantizationError(f"{where}: the model's forward refused calibration "
                                        f"item {i} ({type(exc).__name__}: {exc})") from exc
            raise QuantizationError(f"{where}: the model's forward never reached its first "
                                    "block; calibration needs a decoder that runs its blocks")
    finally:
        handle.remove()
    return calls


def _check_token_ids(model: nn.Module, samples: list[dict[str, Any]], where: str) -> None:
    """Token ids must index the input embeddings (on a GPU a bad id is a device assert)."""
    embeddings = getattr(model, "get_input_embeddings", lambda: None)()
    vocab = getattr(embeddings, "num_embeddings", None)
    if not isinstance(vocab, int):
        return
    for i, sample in enumerate(samples):
        ids = sample.get("input_ids")
        if isinstance(ids, torch.Tensor) and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise QuantizationError(
                f"{where}: calibration item {i} holds token ids in [{int(ids.min())}, "
                f"{int(ids.max())}]; the model's vocabulary takes ids in [0, {vocab - 1}]")


def _hidden(output: Any) -> torch.Tensor:
    """A block's output hidden states (blocks return a tensor or a tuple led by one)."""
    if isinstance(output, (tuple, list)):
        output = output[0]
    return output


def _run(block: nn.Module, calls: list[_Call]) -> list[torch.Tensor]:
    return [_hidden(block(*call.args, **call.kwargs)) for call in calls]


def run_blocks(model: nn.Module, samples: list[dict[str, Any]], layers: Iterable[str],
               handle: Handler, *, progress: bool = False, desc: str = "lowvm: calibrating",
               where: str = "quantize_model") -> None:
    """Walk ``model``'s blocks with ``samples`` (see the module docstring), calling
    ``handle`` with the Hessians of the named ``layers`` of each block, then of the named
    layers outside the blocks. No gradients; the model is in eval mode meanwhile."""
    blocks_name, blocks = find_blocks(model, where)
    modules = dict(model.named_modules())
    wanted = list(layers)
    per_block: list[list[str]] = [[] for _ in blocks]
    outside: list[str] = []
    prefix = blocks_name + "."
    for name in wanted:
        index, _, sub = (name[len(prefix):] if name.startswith(prefix) else "").partition(".")
        if index.isdigit() and int(index) < len(blocks) and sub:
            per_block[int(index)].append(name)
        else:
            outside.append(name)
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            calls = _capture(model, blocks[0], samples, where)
            bar = _bar(len(blocks), progress, desc)
            for i, block in enumerate(blocks):
                outputs = _with_hessians(modules, per_block[i], handle,
                                         lambda b=block, c=calls: _run(b, c))
                if outputs is None:
                    outputs = _run(block, calls)
                calls = [call.with_hidden(out) for call, out in zip(calls, outputs)]
                if bar is not None:
                    bar.update(1)
            if bar is not None:
                bar.close()
            if outside:
                _with_hessians(modules, outside, handle, lambda: _run_model(model, samples))
    finally:
        model.train(training)


def _run_model(model: nn.Module, samples: list[dict[str, Any]]) -> list[Any]:
    """The whole model on every sample, outputs dropped (only the hooks' sums are kept)."""
    device = _model_device(model)
    for sample in samples:
        _forward(model, sample, device)
    return []


def _with_hessians(modules: dict[str, nn.Module], names: list[str], handle: Handler,
                   run: Callable[[], list[Any]]) -> list[Any] | None:
    """Run with Hessian hooks on ``names``; hand the Hessians over; return the run's
    outputs when ``handle`` left the model unchanged (else None: run again)."""
    hooks = {name: HessianHook(modules[name]) for name in names}
    try:
        outputs = run()
    finally:
        for hook in hooks.values():
            hook.remove()
    if not names:
        return outputs
    changed = handle({name: hook.hessian() for name, hook in hooks.items()})
    return None if changed else outputs


def _bar(total: int, enabled: bool, desc: str) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="block")


def output_fisher(model: nn.Module, samples: list[dict[str, Any]], layers: Iterable[str], *,
                  seed: int = 0, progress: bool = False, desc: str = "lowvm: output gradients",
                  where: str = "quantize_model") -> dict[str, torch.Tensor | None]:
    """Per output channel ``j`` of each named linear, ``f_j``: the mean over calibration
    tokens of ``g_j²``, ``g = ∂ log p(y) / ∂(layer output)``, with every next token ``y``
    drawn from the model's own prediction (a seeded generator, so the result repeats).

    Why: ``f`` is the diagonal of the Fisher information of the model's output distribution
    with respect to the layer's output, so a weight change ``ΔW`` moves the output by about
    ``KL ≈ ¼ Σ_j f_j (ΔW H ΔWᵀ)_jj`` nats per token (``H = 2/n Σ x xᵀ``). Unlike
    ``tr(ΔW H ΔWᵀ)`` alone, that is comparable across layers: it counts what the rest of the
    network (attention softmax, the residual stream's norm, later blocks) does to an error.
    Labels are sampled rather than taken from the text so that ``f`` measures the change of
    the output distribution, whatever the model's loss on the calibration text.

    One forward and backward pass of the whole model per calibration sequence (items of
    several rows are split), parameters frozen (no weight gradients): memory is the autograd
    activations of the whole model for one sequence, plus its logits' probabilities in
    float32. The model is left as it was (eval mode meanwhile). A named layer whose output
    no gradient reaches gets None.
    """
    _, blocks = find_blocks(model, where)
    _check_token_ids(model, samples, where)
    modules = dict(model.named_modules())
    names = list(layers)
    sums: dict[str, torch.Tensor] = {}
    rows: dict[str, int] = dict.fromkeys(names, 0)
    device = _model_device(model)
    generators: dict[torch.device, torch.Generator] = {}  # one per device the logits are on

    def watch(name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if isinstance(output, torch.Tensor) and output.requires_grad:
                rows[name] += output.numel() // output.shape[-1]
                output.register_hook(lambda grad: _add_square(sums, name, grad))
        return hook

    def leaf(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The first block's hidden states become the leaf that gradients flow back to."""
        if args:
            return (args[0].detach().requires_grad_(), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": kwargs["hidden_states"].detach()
                      .requires_grad_()}

    handles = [modules[name].register_forward_hook(watch(name)) for name in names]
    handles.append(blocks[0].register_forward_pre_hook(leaf, with_kwargs=True))
    frozen = [p for p in model.parameters() if p.requires_grad]
    training = model.training
    rows_of = [_sequences(sample) for sample in samples]
    bar = _bar(sum(len(r) for r in rows_of), progress, desc)
    try:
        for p in frozen:
            p.requires_grad_(False)
        model.eval()
        with torch.enable_grad():
            for i, sequences in enumerate(rows_of):
                for sample in sequences:
                    try:
                        output = _forward(model, sample, device)
                    except (TypeError, ValueError, IndexError) as exc:
                        raise QuantizationError(f"{where}: the model's forward refused "
                                                f"calibration item {i} ({type(exc).__name__}: "
                                                f"{exc})") from exc
                    loss = _sampled_log_likelihood(_logits(output, where), sample, generators, seed)
                    del output
                    try:
                        loss.backward()
                    except RuntimeError as exc:  # out of memory, or a layer with no backward
                        raise QuantizationError(
                            f"{where}: output gradients failed on calibration item {i} "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0]}); the "
                            "'fisher' sensitivity needs a backward pass of the whole model "
                            "(every layer differentiable, memory for one sequence's "
                            "activations); accepted: such a model, or sensitivity='hessian'"
                        ) from exc
                    if bar is not None:
                        bar.update(1)
    finally:
        for handle in handles:
            handle.remove()
        for p in frozen:
            p.requires_grad_(True)
        model.train(training)
        if bar is not None:
            bar.close()
    result: dict[str, torch.Tensor | None] = {}
    for name in names:
        total = sums.get(name)
        if total is not None and not bool(torch.isfinite(total).all()):
            raise QuantizationError(f"{where}: the output gradients of layer {name!r} overflow "
                                    f"{modules[name].weight.dtype} (non-finite); accepted: a "
                                    "model whose backward pass stays finite, or "
                                    "sensitivity='hessian' (no gradients)")
        result[name] = None if total is None or rows[name] == 0 else total / rows[name]
    return result


def _sequences(sample: dict[str, Any]) -> list[dict[str, Any]]:
    """``sample`` one row at a time: every tensor whose first dimension is the batch (that
    of ``input_ids``, else of the first tensor) is sliced, other values are shared."""
    lead = sample.get("input_ids")
    if not isinstance(lead, torch.Tensor):
        lead = next((v for v in sample.values() if isinstance(v, torch.Tensor) and v.dim()), None)
    if lead is None or lead.dim() == 0 or lead.shape[0] <= 1:
        return [sample]
    batch = lead.shape[0]
    return [{key: value[r:r + 1] if isinstance(value, torch.Tensor) and value.dim()
             and value.shape[0] == batch else value for key, value in sample.items()}
            for r in range(batch)]


def _add_square(sums: dict[str, torch.Tensor], name: str, grad: torch.Tensor) -> None:
    """Accumulate ``Σ g²`` per output channel in float32 (returns None: the gradient that
    flows on is unchanged)."""
    square = grad.detach().float().square().reshape(-1, grad.shape[-1]).sum(0)
    if name in sums:
        sums[name] += square
    else:
        sums[name] = square


def _logits(output: Any, where: str) -> torch.Tensor:
    logits = getattr(output, "logits", None)
    if logits is None and isinstance(output, (tuple, list)) and output:
        logits = output[0]
    if not isinstance(logits, torch.Tensor) or logits.dim() < 2:
        raise QuantizationError(f"{where}: the model's forward returned {_describe(output)}; "
                                "output gradients need logits (an output with .logits, or a "
                                "tuple led by them)")
    return logits


def _sampled_log_likelihood(logits: torch.Tensor, sample: Mapping[str, Any],
                            generators: dict[torch.device, torch.Generator], seed: int
                            ) -> torch.Tensor:
    """``Σ log p(y)`` over the positions the attention mask keeps, every ``y`` drawn from
    the model's own distribution at that position."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    with torch.no_grad():
        flat = logp.detach().reshape(-1, logp.shape[-1]).exp()
        if flat.device not in generators:
            generators[flat.device] = torch.Generator(device=flat.device).manual_seed(seed)
        labels = torch.multinomial(flat, 1, generator=generators[flat.device])
        labels = labels.view(*logp.shape[:-1], 1)
        del flat
    picked = logp.gather(-1, labels).squeeze(-1)
    mask = sample.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.shape == picked.shape:
        picked = picked * mask.to(device=picked.device, dtype=picked.dtype)
    return picked.sum()
