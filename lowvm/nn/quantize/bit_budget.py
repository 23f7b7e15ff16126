"""Choose each layer's type so that the model fits an average number of bits per weight
with the least estimated damage to the model's output.

Each layer ``l`` and candidate type ``c`` has a size ``bytes[l, c]`` (what the
:class:`~lowvm.nn.layer.quant_linear.QuantLinear` stores: packed codes, float16 scales, zero
points, the act-order permutation; the bias is left out, as it is the same for every
type) and an error ``err[l, c]``. The planner's error is one of two *sensitivities*:

- ``"fisher"`` (the default of ``quantize_model``): the estimated increase of the KL
  divergence of the model's next-token distribution, ``¼ Σ_j f_j (ΔW H ΔWᵀ)_jj`` nats per
  token, where ``f_j`` is the mean squared gradient of the log-likelihood (of tokens drawn
  from the model itself) with respect to the layer's output channel ``j``
  (:func:`lowvm.nn.quantize.calibration.output_fisher`). Errors of different layers differ in how
  much the rest of the network amplifies them (attention softmax, the residual stream's
  norm, later blocks); the Fisher weights put them on one scale, so their sum is
  meaningful.
- ``"hessian"``: ``tr(ΔW H ΔWᵀ)``, the layer's own squared output error, which needs no
  gradients but treats an error in every layer as equally costly.

The plan minimises ``Σ err`` subject to ``8 · Σ bytes ≤ bits · Σ weights``: a
multiple-choice knapsack, solved exactly by dynamic programming over sizes discretised in
steps that depend only on the layers (never on the budget), each size rounded *up* to a
step beyond the layer's smallest candidate. So the plan never exceeds the budget, and a
looser budget never gives a higher total error. The step is the greatest common divisor
of the size differences (or a multiple of it, beyond :data:`_STEPS` steps): layers of
usual shapes then lose nothing to the rounding, so a budget equal to a uniform type's size
can still choose that type everywhere.

Budgets below every layer at its smallest candidate are refused; a budget at or above
every layer at its largest candidate leaves each layer its lowest-error candidate (no
error: the budget simply does not bind).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lowvm.nn.errors import QuantizationError
from lowvm.nn.layer.spec import QuantSpec, weight_type

__all__ = ["BudgetPlan", "PlanRow", "solve_budget", "check_budget", "layer_bytes",
           "check_bits", "check_candidates", "check_sensitivity", "layer_error",
           "DEFAULT_CANDIDATES", "SENSITIVITIES"]

DEFAULT_CANDIDATES = ("int2", "int3", "int4", "int5", "int6", "int7", "int8")
#: what the planner sums over layers (see the module docstring)
SENSITIVITIES = ("fisher", "hessian")
_STEPS = 1 << 16  # most steps the dynamic programme spans (all layers' spreads together)


def check_bits(bits: Any, where: str = "quantize_model") -> float:
    """``bits`` must be a finite positive number (average bits per weight)."""
    if (isinstance(bits, bool) or not isinstance(bits, (int, float)) or not math.isfinite(bits)
            or bits <= 0):
        raise QuantizationError(f"{where}: bits must be a positive number of bits per weight "
                                f"(e.g. 3.5, scales and zero points included); got {bits!r}")
    return float(bits)


def check_candidates(candidates: Any, where: str = "quantize_model") -> tuple[str, ...]:
    """Candidate types: a non-empty sequence of distinct 1..8-bit weight types (names)."""
    if candidates is None:
        return DEFAULT_CANDIDATES
    if isinstance(candidates, str) or not isinstance(candidates, Iterable):
        raise QuantizationError(f"{where}: candidates must be a sequence of types such as "
                                f"('int3', 'int4'); got {candidates!r}")
    names = tuple(weight_type(c, f"{where}: candidates").name for c in candidates)
    if not names:
        raise QuantizationError(f"{where}: candidates is empty; give at least one type, e.g. "
                                f"{DEFAULT_CANDIDATES}")
    if len(set(names)) != len(names):
        raise QuantizationError(f"{where}: candidates name a type twice: {list(names)}")
    return names


def check_sensitivity(sensitivity: Any, where: str = "quantize_model") -> str:
    """``sensitivity``: one of :data:`SENSITIVITIES`."""
    if not isinstance(sensitivity, str) or sensitivity not in SENSITIVITIES:
        raise QuantizationError(f"{where}: sensitivity must be one of {SENSITIVITIES} (what "
                                f"the bit budget minimises); got {sensitivity!r}")
    return sensitivity


def layer_error(weight: torch.Tensor, quantized: torch.Tensor, hessian: torch.Tensor,
                fisher: torch.Tensor | None = None) -> tuple[float, float]:
    """``(planner error, tr(ΔW H ΔWᵀ))`` of replacing ``weight [N, K]`` by ``quantized``
    (float64 sums). With ``fisher [N]`` (per output channel, see
    :func:`lowvm.nn.quantize.calibration.output_fisher`) the planner error is the estimated KL
    increase ``¼ Σ_j f_j (ΔW H ΔWᵀ)_jj``; without it, ``tr(ΔW H ΔWᵀ)`` itself."""
    delta = (weight.detach().float() - quantized.detach().float()).double()
    h = hessian.to(device=delta.device, dtype=torch.float64)
    rows = ((delta @ h) * delta).sum(dim=1)
    trace = float(rows.sum())
    if fisher is None:
        return trace, trace
    f = fisher.to(device=rows.device, dtype=torch.float64)
    return 0.25 * float((f * rows).sum()), trace


def layer_bytes(in_features: int, out_features: int, spec: QuantSpec, act_order: bool) -> int:
    """Bytes a QuantLinear of ``spec`` stores for its weight (``weight_bytes()`` without the
    bias), computed on the meta device (nothing is allocated)."""
    from lowvm.nn.layer.quant_linear import QuantLinear

    layer = QuantLinear(in_features, out_features, spec.wtype, spec.group_size,
                        spec.zero_point, bias=False, act_order=act_order, device="meta")
    return layer.weight_bytes()


@dataclass(frozen=True)
class PlanRow:
    """One layer's choice: its type, size and measured error (the planner's measure, and
    ``tr(ΔW H ΔWᵀ)``)."""

    name: str
    dtype: str
    weights: int  # number of weights (in x out)
    bytes: int
    error: float  # what the planner summed: estimated KL ("fisher") or tr(ΔW H ΔWᵀ)
    hessian_error: float | None = None  # tr(ΔW H ΔWᵀ), where it differs from ``error``

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.bytes / self.weights


@dataclass
class BudgetPlan:
    """The per-layer types chosen for a bits-per-weight budget (``str()``: a table)."""

    bits: float  # the budget asked for
    rows: list[PlanRow]
    candidates: tuple[str, ...]
    #: every measured (bytes, error) per layer and candidate type, error as the planner saw it
    options: dict[str, dict[str, tuple[int, float]]] = field(default_factory=dict)
    sensitivity: str = "hessian"  # what ``error`` is (see the module docstring)
    #: tr(ΔW H ΔWᵀ) per layer and candidate, where the planner's error is another measure
    hessian_errors: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def bits_per_weight(self) -> float:
        """The average the plan reaches over the planned layers."""
        return 8.0 * sum(r.bytes for r in self.rows) / sum(r.weights for r in self.rows)

    @property
    def total_error(self) -> float:
        return sum(r.error for r in self.rows)

    def dtypes(self) -> dict[str, str]:
        """``{layer name: type name}``: what quantize_model applies and records."""
        return {r.name: r.dtype for r in self.rows}

    def __str__(self) -> str:
        width = max([len("layer"), *(len(r.name) for r in self.rows)])
        fisher = self.sensitivity == "fisher"

        def trace(r: PlanRow) -> float:
            return r.error if r.hessian_error is None else r.hessian_error

        head = f"{'layer':<{width}}  {'type':<12} {'bits/weight':>11}"
        lines = [head + (f" {'est. KL':>11}" if fisher else "") + f" {'tr(ΔWHΔWᵀ)':>12}"]
        for r in self.rows:
            lines.append(f"{r.name:<{width}}  {r.dtype:<12} {r.bits_per_weight:>11.3f}"
                         + (f" {r.error:>11.4g}" if fisher else "") + f" {trace(r):>12.4g}")
        note = f"budget {self.bits:g} bits/weight" + (
            "; est. KL: nats per token, what the plan minimises" if fisher else "")
        lines.append(f"{'total':<{width}}  {'':<12} {self.bits_per_weight:>11.3f}"
                     + (f" {self.total_error:>11.4g}" if fisher else "")
                     + f" {sum(trace(r) for r in self.rows):>12.4g}   ({note})")
        return "\n".join(lines)


def check_budget(sizes: Mapping[str, Mapping[str, int]], weights: Mapping[str, int],
                 bits: float, where: str = "quantize_model") -> None:
    """Refuse ``bits`` below every layer at its smallest candidate (``sizes[layer][type]``:
    bytes), before anything is measured."""
    total = sum(weights[n] for n in sizes)
    base = sum(min(s.values()) for s in sizes.values())
    top = sum(max(s.values()) for s in sizes.values())
    if 8 * base > bits * total:
        raise QuantizationError(
            f"{where}: bits={bits:g} is below the smallest plan: every layer at its smallest "
            f"candidate takes {8 * base / total:.4g} bits per weight (scales and zero points "
            f"included); accepted: bits >= {8 * base / total:.4g} (every layer at its largest "
            f"candidate takes {8 * top / total:.4g})")


def solve_budget(options: Mapping[str, Mapping[str, tuple[int, float]]],
                 weights: Mapping[str, int], bits: float, where: str = "quantize_model", *,
                 sensitivity: str = "hessian",
                 hessian_errors: Mapping[str, Mapping[str, float]] | None = None
                 ) -> BudgetPlan:
    """The least-total-error choice of one candidate per layer within ``bits`` per weight.

    ``options[layer][type] = (bytes, error)``; ``weights[layer]``: its number of weights.
    ``sensitivity`` names what the errors are; ``hessian_errors[layer][type]`` (optional)
    the ``tr(ΔW H ΔWᵀ)`` recorded beside them where they are another measure.
    """
    names = list(options)
    cands = [list(options[n]) for n in names]
    size = [np.array([options[n][c][0] for c in cs], dtype=np.int64)
            for n, cs in zip(names, cands)]
    error = [np.array([options[n][c][1] for c in cs], dtype=np.float64)
             for n, cs in zip(names, cands)]
    check_budget({n: {c: options[n][c][0] for c in options[n]} for n in names}, weights, bits,
                 where)
    total_weights = sum(weights[n] for n in names)
    budget = math.floor(bits * total_weights / 8)
    base = sum(int(s.min()) for s in size)
    extra = [s - s.min() for s in size]
    unit = max(1, int(np.gcd.reduce(np.concatenate(extra))))  # 0 where no layer has a choice
    step = unit * max(1, math.ceil(sum(int(e.max()) for e in extra) / (unit * _STEPS)))
    cost = [-(-e // step) for e in extra]  # rounded up: the plan never exceeds the budget
    room = min((budget - base) // step, sum(int(c.max()) for c in cost))
    best = np.zeros(room + 1)  # best[b]: least error of the layers so far within b steps
    choice = np.zeros((len(names), room + 1), dtype=np.int16)
    for i in range(len(names)):
        new = np.full(room + 1, np.inf)
        for j, (c, e) in enumerate(zip(cost[i], error[i])):
            c = int(c)
            if c > room:
                continue
            trial = np.full(room + 1, np.inf)
            trial[c:] = best[:room + 1 - c] + e
            better = trial < new
            new[better] = trial[better]
            choice[i, better] = j
        best = new
    rows: list[PlanRow] = []
    b = room
    for i in reversed(range(len(names))):
        j = int(choice[i, b])
        b -= int(cost[i][j])
        trace = None if hessian_errors is None else float(hessian_errors[names[i]][cands[i][j]])
        rows.append(PlanRow(names[i], cands[i][j], weights[names[i]], int(size[i][j]),
                            float(error[i][j]), trace))
    rows.reverse()
    plan = BudgetPlan(bits=bits, rows=rows, candidates=tuple(dict.fromkeys(
        c for cs in cands for c in cs)), options={n: dict(options[n]) for n in names},
        sensitivity=sensitivity,
        hessian_errors={n: dict(hessian_errors[n]) for n in names} if hessian_errors else {})
    assert 8 * sum(r.bytes for r in rows) <= bits * total_weights
    return plan
