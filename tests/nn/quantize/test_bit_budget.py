"""Bits fitted to a budget: the planner against brute force, budgets that are respected
and monotone, and quantize_model(bits=...) on a tiny model."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import lowvm
from lowvm.nn.errors import QuantizationError
from lowvm.nn.layer.quant_linear import QuantLinear
from lowvm.nn.layer.quantize import rounded_weight
from lowvm.nn.layer.spec import make_spec
from lowvm.nn.quantize.bit_budget import layer_bytes, layer_error, solve_budget
from lowvm.nn.quantize.calibration import output_fisher, prepare_calibration
from tests.helpers.models import tiny_llama

pytestmark = pytest.mark.filterwarnings("ignore::lowvm.nn.layer.backend.LowvmFallbackWarning")


def _options(seed: int, layers: int, cands: int, scale: int = 1, jitter: bool = False):
    """Random (bytes, error) per layer and candidate: more bytes, less error, as for types.
    ``jitter``: sizes off by a few bytes, so that no common step divides them."""
    rng = np.random.default_rng(seed)
    options, weights = {}, {}
    for i in range(layers):
        n = int(rng.integers(1, 5)) * 64 * scale
        sizes = np.sort(rng.choice(np.arange(1, 20), cands, replace=False)) * n // 8
        if jitter:
            sizes = sizes + np.sort(rng.integers(0, 8, cands))
        errors = np.sort(rng.random(cands))[::-1] * rng.random() * 10
        options[f"l{i}"] = {f"t{j}": (int(sizes[j]), float(errors[j])) for j in range(cands)}
        weights[f"l{i}"] = n
    return options, weights


def _brute_force(options, weights, bits):
    names = list(options)
    best = None
    for combo in itertools.product(*(list(options[n]) for n in names)):
        size = sum(options[n][c][0] for n, c in zip(names, combo))
        if 8 * size <= bits * sum(weights.values()):
            err = sum(options[n][c][1] for n, c in zip(names, combo))
            best = err if best is None else min(best, err)
    return best


@pytest.mark.parametrize("seed", range(4))
def test_the_plan_is_the_brute_force_optimum_within_the_budget(seed):
    options, weights = _options(seed, layers=5, cands=3)
    smallest = 8 * sum(min(s for s, _ in o.values()) for o in options.values())
    largest = 8 * sum(max(s for s, _ in o.values()) for o in options.values())
    total = sum(weights.values())
    for bits in np.linspace(smallest / total, largest / total, 9):
        plan = solve_budget(options, weights, float(bits))
        assert 8 * sum(r.bytes for r in plan.rows) <= bits * total
        assert plan.bits_per_weight <= bits
        assert plan.total_error == pytest.approx(_brute_force(options, weights, bits), abs=1e-12)
        assert [r.name for r in plan.rows] == list(options)
        for row in plan.rows:
            assert options[row.name][row.dtype] == (row.bytes, row.error)


def test_a_looser_budget_never_gives_a_higher_error_and_always_fits():
    options, weights = _options(7, layers=40, cands=6, scale=4096, jitter=True)  # discretised
    total = sum(weights.values())
    lowest = 8 * sum(min(s for s, _ in o.values()) for o in options.values()) / total
    previous = None
    for bits in np.linspace(lowest, 20, 30):
        plan = solve_budget(options, weights, float(bits))
        assert plan.bits_per_weight <= bits
        if previous is not None:
            assert plan.total_error <= previous
        previous = plan.total_error
    best = sum(min(e for _, e in o.values()) for o in options.values())
    assert previous == pytest.approx(best)  # an unbinding budget: each layer's least error


def test_a_budget_of_exactly_a_uniform_types_size_can_choose_that_type_everywhere():
    """Real layer shapes, each error ``weights · 4^-bits`` (convex in bits, the same curve
    per weight for every layer): the best plan at int3's exact size is int3 everywhere."""
    cands = ("int2", "int3", "int4", "int5", "int6", "int7", "int8")
    shapes = [(512, 512), (512, 128), (512, 128), (512, 512), (512, 1536), (512, 1536),
              (1536, 512)] * 8
    options, weights = {}, {}
    for i, (k, n) in enumerate(shapes):
        weights[f"l{i}"] = k * n
        options[f"l{i}"] = {c: (layer_bytes(k, n, make_spec(c, 128, None, k, n), False),
                                k * n * 4.0 ** -int(c[3:])) for c in cands}
    total = sum(weights.values())
    for uniform in cands:
        bits = 8 * sum(o[uniform][0] for o in options.values()) / total
        plan = solve_budget(options, weights, bits)
        assert set(plan.dtypes().values()) == {uniform}
        assert plan.bits_per_weight == bits


def test_budgets_below_the_smallest_plan_are_refused():
    options, weights = _options(3, layers=4, cands=3)
    total = sum(weights.values())
    lowest = 8 * sum(min(s for s, _ in o.values()) for o in options.values()) / total
    with pytest.raises(QuantizationError, match=r"bits=.* is below the smallest plan.*bits >="):
        solve_budget(options, weights, lowest * 0.99)
    plan = solve_budget(options, weights, lowest)
    assert all(r.bytes == min(s for s, _ in options[r.name].values()) for r in plan.rows)


@pytest.mark.parametrize("wtype, group, act_order", [("int3", 64, False), ("uint4", 128, True),
                                                     ("float4_e2m1", -1, False)])
def test_layer_bytes_is_what_the_layer_stores_without_its_bias(wtype, group, act_order):
    linear = torch.nn.Linear(256, 128, bias=True).half()
    spec = make_spec(wtype, group, None, 256, 128)
    layer = QuantLinear(256, 128, wtype, group, None, bias=True, act_order=act_order)
    bias = layer.bias.numel() * layer.bias.element_size()
    assert layer_bytes(256, 128, spec, act_order) == layer.weight_bytes() - bias
    built = QuantLinear.from_linear(linear, wtype, group)
    assert layer_bytes(256, 128, spec, False) == built.weight_bytes() - bias


@pytest.mark.parametrize("wtype, group", [("int3", 64), ("uint4", -1), ("float4_e2m1", 64)])
def test_the_measured_round_to_nearest_weight_is_the_layers_own(wtype, group):
    linear = torch.nn.Linear(256, 128).half()
    spec = make_spec(wtype, group, None, 256, 128)
    assert torch.equal(rounded_weight(linear.weight, spec),
                       QuantLinear.from_linear(linear, wtype, group).dequantize())


def _calibration(n: int = 2) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (2, 32), generator=g) for _ in range(n)]


def _stored_bits(model) -> float:
    """Bits per weight the model's QuantLinear layers hold (biases excluded), counted from
    the layers themselves."""
    layers = [m for m in model.modules() if isinstance(m, QuantLinear)]
    stored = sum(m.weight_bytes() - (m.bias.numel() * m.bias.element_size()
                                     if m.bias is not None else 0) for m in layers)
    return 8 * stored / sum(m.in_features * m.out_features for m in layers)


@pytest.mark.slow
def test_model_budget_with_gptq_is_respected_recorded_and_reloads(tmp_path, capsys):
    model = tiny_llama()
    cands = ("int2", "int4", "int8")
    report = lowvm.quantize_model(model, bits=3.5, calibration=_calibration(), group_size=64,
                                  candidates=cands, progress=True)
    printed = capsys.readouterr().out
    plan = report.plan
    assert report.method == "gptq" and plan is not None and report.layers_replaced == 14
    assert "bits/weight" in printed and "model.layers.1.mlp.down_proj" in printed
    assert plan.sensitivity == "fisher" and "est. KL" in printed  # the default measure
    assert set(plan.hessian_errors) == set(plan.options) and all(
        r.hessian_error == plan.hessian_errors[r.name][r.dtype] for r in plan.rows)
    assert _stored_bits(model) <= 3.5 and _stored_bits(model) == pytest.approx(
        plan.bits_per_weight)
    assert len({r.dtype for r in plan.rows}) > 1  # 3.5 bits cannot be one of these types
    layers = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear)}
    assert {n: m.wtype.name for n, m in layers.items()} == plan.dtypes()
    assert set(plan.options) == set(layers) and all(
        set(o) == set(cands) for o in plan.options.values())
    config = model.config.quantization_config
    assert config.dtype == plan.dtypes()
    assert {n: e["dtype"] for n, e in config.modules.items()} == plan.dtypes()
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert saved["dtype"] == plan.dtypes()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    for name, layer in layers.items():
        other = loaded.get_submodule(name)
        assert other.wtype == layer.wtype
        assert all(torch.equal(v, other.state_dict()[k]) for k, v in layer.state_dict().items())
    # the measured errors, re-planned: a looser budget never costs error
    weights = {n: m.in_features * m.out_features for n, m in layers.items()}
    errors = [solve_budget(plan.options, weights, b).total_error for b in (2.5, 3, 3.5, 5, 9)]
    assert errors == sorted(errors, reverse=True) and errors[2] == pytest.approx(
        plan.total_error)


@pytest.mark.slow
def test_model_budget_with_round_to_nearest_spends_more_bits_for_less_error():
    results = {}
    for bits in (3.0, 5.0):
        model = tiny_llama()
        report = lowvm.quantize_model(model, bits=bits, calibration=_calibration(1),
                                      group_size=64, method="rtn", sensitivity="hessian",
                                      progress=False)
        assert report.method == "rtn" and not report.errors
        assert report.plan.sensitivity == "hessian" and not report.plan.hessian_errors
        assert _stored_bits(model) <= bits
        results[bits] = report.plan
    assert results[5.0].total_error < results[3.0].total_error
    assert results[5.0].bits_per_weight > results[3.0].bits_per_weight


def test_budget_argument_errors_change_nothing():
    model = tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cal = _calibration(1)
    cases = [
        ({"bits": 3.5, "dtype": "int4", "calibration": cal}, "dtype='int4' and bits=3.5 both"),
        ({"bits": 3.5}, "bits=3.5 needs calibration"),
        ({"bits": 0, "calibration": cal}, "bits must be a positive number.*got 0"),
        ({"bits": float("nan"), "calibration": cal}, "bits must be a positive number"),
        ({"bits": True, "calibration": cal}, "bits must be a positive number.*got True"),
        ({"bits": "3.5", "calibration": cal}, "bits must be a positive number.*'3.5'"),
        ({"bits": 4, "calibration": cal, "candidates": ()}, "candidates is empty"),
        ({"bits": 4, "calibration": cal, "candidates": "int4"}, "candidates must be a sequence"),
        ({"bits": 4, "calibration": cal, "candidates": ("int4", "int4")}, "name a type twice"),
        ({"bits": 4, "calibration": cal, "candidates": ("int4", "int12")}, "int12"),
        ({"bits": 4, "calibration": cal, "group_size": 96}, "group_size=96"),
        ({"bits": 4, "calibration": [], "group_size": 64}, "calibration is empty"),
        ({"bits": 1.5, "calibration": cal, "group_size": 64}, "below the smallest plan"),
        ({"bits": 4, "calibration": cal, "method": "rtn", "act_order": True},
         "act_order=True needs method='gptq'"),
        ({"bits": 4, "calibration": cal, "sensitivity": "kl"},
         r"sensitivity must be one of \('fisher', 'hessian'\).*got 'kl'"),
        ({"dtype": "int4", "sensitivity": "fisher"}, "sensitivity='fisher' is only used with bits"),
    ]
    for kwargs, needle in cases:
        with pytest.raises((QuantizationError, lowvm.DTypeError), match=needle):
            lowvm.quantize_model(model, progress=False, **kwargs)
    assert not any(isinstance(m, QuantLinear) for m in model.modules())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert getattr(model.config, "quantization_config", None) is None


# ---- the planner's sensitivity: output gradients (Fisher) against the Hessian error alone ----

class _Block(torch.nn.Module):
    """A residual linear block; ``unused`` is a layer the forward never calls."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(d, d, bias=False)
        self.unused = torch.nn.Linear(d, d, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + self.proj(hidden)


class _LinearLM(torch.nn.Module):
    """Embedding, residual linear blocks, a linear head: every layer's Jacobian to the logits
    is a fixed matrix, so the Fisher diagonal has a closed form to test against."""

    def __init__(self, vocab: int = 24, d: int = 8, blocks: int = 2) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.embed = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList(_Block(d) for _ in range(blocks))
        self.head = torch.nn.Linear(d, vocab, bias=False)
        with torch.no_grad():
            for block in self.layers:
                block.proj.weight.mul_(0.5)
            self.head.weight.mul_(torch.linspace(0.5, 4.0, d))  # channels that matter unequally
        self.double()

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.embed

    def forward(self, input_ids: torch.Tensor, use_cache: bool = False) -> Any:
        hidden = self.embed(input_ids)
        for block in self.layers:
            hidden = block(hidden)
        return SimpleNamespace(logits=self.head(hidden))


def _exact_fisher(model: _LinearLM, samples: list[torch.Tensor]) -> dict[str, np.ndarray]:
    """``E_y[g_j²]`` per output channel, averaged over positions, in closed form: for a
    layer whose output reaches the logits through the matrix J, ``g = Jᵀ(e_y - p)`` so
    ``E[g gᵀ] = Jᵀ (diag p - p pᵀ) J``; independent label draws add no cross terms."""
    d = model.embed.embedding_dim
    jac = {"head": np.eye(model.head.out_features)}
    after = model.head.weight.detach().numpy()
    for i in reversed(range(len(model.layers))):
        jac[f"layers.{i}.proj"] = after
        after = after @ (np.eye(d) + model.layers[i].proj.weight.detach().numpy())
    with torch.no_grad():
        probs = np.concatenate([model(ids).logits.softmax(-1).reshape(-1, jac["head"].shape[0])
                                .numpy() for ids in samples])
    out = {}
    for name, j in jac.items():
        cov = np.einsum("tv,vj->tj", probs, j ** 2) - np.einsum("tv,vj->tj", probs, j) ** 2
        out[name] = cov.mean(axis=0)
    return out


def test_output_fisher_is_the_fisher_diagonal_of_the_models_own_distribution():
    model = _LinearLM()
    g = torch.Generator().manual_seed(3)
    samples = [torch.randint(0, 24, (4, 32), generator=g) for _ in range(16)]
    names = ["layers.0.proj", "layers.1.proj", "head", "layers.0.unused"]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fisher = output_fisher(model, prepare_calibration(samples), names)
    again = output_fisher(model, prepare_calibration(samples), names)
    exact = _exact_fisher(model, samples)
    assert fisher["layers.0.unused"] is None  # no gradient reaches a layer never called
    for name in ("layers.0.proj", "layers.1.proj", "head"):
        got = fisher[name].numpy()
        assert torch.equal(fisher[name], again[name])  # seeded: the same labels every time
        # 2048 sampled labels: a few percent of sampling noise, far below what a wrong
        # weighting (labels from the text, no square, another normalisation) would give
        assert got.sum() == pytest.approx(exact[name].sum(), rel=0.1)
        if name != "head":  # a hidden channel's estimate pools every label's gradient
            assert got == pytest.approx(exact[name], rel=0.2)
            assert np.corrcoef(got, exact[name])[0, 1] > 0.95
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.requires_grad and p.grad is None for p in model.parameters())
    assert model.training


def test_layer_error_weighs_each_output_row_by_its_fisher_entry():
    rng = np.random.default_rng(0)
    w, q = rng.normal(size=(6, 5)), rng.normal(size=(6, 5))
    x = rng.normal(size=(40, 5))
    h = 2 / 40 * x.T @ x
    f = rng.random(6)
    delta = w - q
    rows = np.einsum("nk,kl,nl->n", delta, h, delta)
    t = {k: torch.from_numpy(v).float() for k, v in (("w", w), ("q", q), ("h", h), ("f", f))}
    kl, trace = layer_error(t["w"], t["q"], t["h"], t["f"])
    assert kl == pytest.approx(0.25 * (f * rows).sum(), rel=1e-5)
    assert trace == pytest.approx(rows.sum(), rel=1e-5)
    assert layer_error(t["w"], t["q"], t["h"]) == pytest.approx((rows.sum(), rows.sum()),
                                                                rel=1e-5)


def _kl_to(dense, model, samples) -> float:
    """Mean KL(dense || model) of the next-token distributions, in float64."""
    total, count = 0.0, 0
    with torch.no_grad():
        for ids in samples:
            p = dense(input_ids=ids).logits.double().log_softmax(-1)
            q = model(input_ids=ids).logits.double().log_softmax(-1)
            total += float((p.exp() * (p - q)).sum())
            count += ids.numel()
    return total / count


@pytest.mark.slow
def test_fisher_gives_the_bits_to_the_layer_the_output_depends_on():
    """Two down projections of one shape: ``hidden`` (block 1) writes only hidden channels
    the final norm zeroes, with weights scaled up so its Hessian error is the larger;
    ``seen`` (block 0) feeds everything after it. Only one of them can have int8."""
    dense = tiny_llama(seed=1)
    with torch.no_grad():
        half = dense.config.hidden_size // 2
        dense.model.norm.weight[:half] = 0  # the logits never see channels [0, half)
        hidden = dense.model.layers[1].mlp.down_proj
        hidden.weight[half:] = 0
        hidden.weight.mul_(4)
    seen, unseen = "model.layers.0.mlp.down_proj", "model.layers.1.mlp.down_proj"
    skip = [n for n, m in dense.named_modules() if isinstance(m, torch.nn.Linear)
            and n not in (seen, unseen)]
    cal = _calibration(2)
    plans = {}
    for sensitivity in ("hessian", "fisher"):
        model = tiny_llama(seed=1)
        model.load_state_dict(dense.state_dict())
        report = lowvm.quantize_model(model, bits=5.3, calibration=cal, group_size=64,
                                      candidates=("int2", "int8"), method="rtn", skip=skip,
                                      sensitivity=sensitivity, progress=False)
        plans[sensitivity] = report.plan
    # what each layer alone at int2 really does to the output
    truth = {}
    for name in (seen, unseen):
        model = tiny_llama(seed=1)
        model.load_state_dict(dense.state_dict())
        lowvm.quantize_model(model, dtype={name: "int2"}, group_size=64, progress=False)
        truth[name] = _kl_to(dense, model, cal)
    assert truth[seen] > 5 * truth[unseen]
    hessian, fisher = plans["hessian"], plans["fisher"]

    def damage(plan, name):  # what int8 instead of int2 saves, in the plan's own measure
        return plan.options[name]["int2"][1] - plan.options[name]["int8"][1]

    # the Hessian error alone ranks the layers the wrong way round and spends int8 there
    assert damage(hessian, unseen) > damage(hessian, seen)
    assert hessian.dtypes() == {seen: "int2", unseen: "int8"}
    # the Fisher-weighted error follows the output, and so does the plan
    assert damage(fisher, seen) > 5 * damage(fisher, unseen)
    assert fisher.dtypes() == {seen: "int8", unseen: "int2"}
    # same measured tr(ΔW H ΔWᵀ) behind both plans; the Fisher one estimates the real KL
    assert fisher.hessian_errors[seen]["int2"] == pytest.approx(hessian.options[seen]["int2"][1])
    est = fisher.options[seen]["int2"][1]
    assert truth[seen] / 3 < est < 3 * truth[seen]
    assert "est. KL" in str(fisher) and "est. KL" not in str(hessian)


@pytest.mark.slow
def test_fisher_through_a_layer_without_backward_is_a_lowvm_error_and_changes_nothing():
    model = tiny_llama()
    lowvm.quantize_model(model, dtype="int4", group_size=64, skip=["*q_proj"], progress=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(QuantizationError, match="output gradients failed.*sensitivity='hessian'"):
        lowvm.quantize_model(model, bits=4, calibration=_calibration(1), group_size=64,
                             progress=False)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(isinstance(model.get_submodule(f"model.layers.{i}.self_attn.q_proj"),
                          torch.nn.Linear) for i in range(2))
    report = lowvm.quantize_model(model, bits=4, calibration=_calibration(1), group_size=64,
                                  sensitivity="hessian", progress=False)
    assert set(report.plan.dtypes()) == {f"model.layers.{i}.self_attn.q_proj" for i in range(2)}
