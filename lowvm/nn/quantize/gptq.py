"""GPTQ: quantize one layer's weight column by column, feeding each column's rounding
error forward into the columns not yet quantized, weighted by the layer's input Hessian.

For a linear layer ``y = x W^T`` with calibration inputs ``x``, ``H = 2/n Σ x xᵀ`` makes
``tr(ΔW H ΔWᵀ)`` the summed squared output error a weight change ``ΔW`` causes. Rounding
column ``k`` moves the output; GPTQ cancels that move as well as the remaining columns can,
using the upper Cholesky factor ``U`` of ``H⁻¹``: ``err = (w_k - q_k) / U[k, k]`` and
``W[:, j] -= err · U[k, j]`` for ``j > k``. Updates inside a block of columns are applied at
once, and to the rest of the matrix once per block (lazy batch updates), so the work is
matrix products rather than one rank-1 update of the whole weight per column.

The rounding is lowvm's own (:mod:`lowvm.kernels.quantize`): a group's scale (float16) and
zero point are chosen when the loop reaches the group's first column, from the weights as
the error feedback has left them, optionally shrinking the range (``clip_search``) where
that lowers the group's Hessian-weighted error; each column's codes then decode, through
lowvm's value tables, to exactly the value the error feedback assumed.

Act-order processes columns by decreasing ``diag(H)`` (the inputs that matter most first,
while many columns remain to absorb their error); the groups are contiguous in that order,
which is the order a :class:`~lowvm.nn.layer.quant_linear.QuantLinear` with ``input_perm``
stores, so the kernels need nothing new.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from lowvm.kernels.quantize import dequantize_with, group_params, quantize_with
from lowvm.nn.errors import QuantizationError
from lowvm.nn.layer.quantize import check_quantizable
from lowvm.nn.layer.spec import QuantSpec

__all__ = ["gptq_quantize", "GPTQResult", "CLIP_RATIOS", "proxy_error"]

#: the range shrink factors the clipping search tries (1.0 first: ties keep the full range)
CLIP_RATIOS = tuple(1.0 - 0.05 * i for i in range(7))
_MAX_DAMP = 1.0  # relative damping beyond which a Hessian is refused


@dataclass
class GPTQResult:
    """One layer quantized by GPTQ, ready for :meth:`QuantLinear.set_codes`.

    ``codes [N, K]`` uint8 and ``scales [G, N]`` float16 (``zeros`` too, for uintN) are in
    the stored K order, i.e. after ``input_perm`` (None without act-order). ``weight`` is the
    float32 weight they decode to, in the original input order; ``error`` is
    ``tr(ΔW H ΔWᵀ)`` for ``ΔW = W - weight`` with the Hessian as given; ``damp`` the relative
    damping used (raised tenfold, up to 1, where float32 Cholesky needed it).
    Unpacks as ``codes, scales, zeros, input_perm = gptq_quantize(...)``.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    input_perm: torch.Tensor | None
    weight: torch.Tensor
    error: float
    damp: float

    def __iter__(self) -> Iterator[torch.Tensor | None]:
        return iter((self.codes, self.scales, self.zeros, self.input_perm))


def proxy_error(weight: torch.Tensor, quantized: torch.Tensor, hessian: torch.Tensor) -> float:
    """``tr(ΔW H ΔWᵀ)`` for ``ΔW = weight - quantized``: the summed squared output error
    (times 2/n for ``H = 2/n Σ x xᵀ``), accumulated in float64."""
    delta = (weight.detach().float() - quantized.float()).double()
    h = hessian.to(device=delta.device, dtype=torch.float64)
    return float(((delta @ h) * delta).sum())


def _check_args(weight: torch.Tensor, hessian: torch.Tensor, spec: QuantSpec, damp: float,
                block_size: int, act_order: bool) -> None:
    where = "gptq_quantize"
    if not isinstance(spec, QuantSpec):
        raise QuantizationError(f"{where}: spec must be a lowvm.nn.layer.spec.QuantSpec (make_spec "
                                f"builds one); got {type(spec).__name__}")
    if (not isinstance(weight, torch.Tensor) or weight.dim() != 2
            or not weight.dtype.is_floating_point):
        got = (f"{weight.dtype} tensor of shape {tuple(weight.shape)}"
               if isinstance(weight, torch.Tensor) else type(weight).__name__)
        raise QuantizationError(f"{where}: weight must be a 2-D floating tensor [out, in]; "
                                f"got {got}")
    k = weight.shape[1]
    if (not isinstance(hessian, torch.Tensor) or tuple(hessian.shape) != (k, k)
            or not hessian.dtype.is_floating_point):
        got = (f"{hessian.dtype} tensor of shape {tuple(hessian.shape)}"
               if isinstance(hessian, torch.Tensor) else type(hessian).__name__)
        raise QuantizationError(f"{where}: hessian must be a floating tensor of shape "
                                f"({k}, {k}) (in_features squared); got {got}")
    if not bool(torch.isfinite(hessian).all()):
        raise QuantizationError(f"{where}: the hessian holds non-finite values; calibration "
                                "activations must be finite")
    if spec.group_size <= 0 or k % spec.group_size:
        raise QuantizationError(f"{where}: spec.group_size={spec.group_size} does not divide "
                                f"in_features={k}")
    if (isinstance(damp, bool) or not isinstance(damp, (int, float)) or not math.isfinite(damp)
            or not 0 <= damp <= _MAX_DAMP):
        raise QuantizationError(f"{where}: damp must be a number in [0, {_MAX_DAMP:g}] (a "
                                f"fraction of mean(diag H)); got {damp!r}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise QuantizationError(f"{where}: block_size must be a positive int; got "
                                f"{block_size!r}")
    if not isinstance(act_order, bool):
        raise QuantizationError(f"{where}: act_order must be True or False; got {act_order!r}")


def _inverse_factor(h: torch.Tensor, damp: float) -> tuple[torch.Tensor, float]:
    """Upper Cholesky factor of ``(H + damp·mean(diag H)·I)⁻¹``, raising the damping tenfold
    (up to 1) while float32 Cholesky fails; returns ``(U, damp used)``."""
    mean_diag = float(h.diagonal().mean())
    eye = torch.eye(h.shape[0], device=h.device, dtype=h.dtype)
    tried = damp
    while True:
        lower, info = torch.linalg.cholesky_ex(h + tried * mean_diag * eye)
        if int(info) == 0:
            upper, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(lower), upper=True)
            if int(info) == 0 and bool(torch.isfinite(upper).all()):
                return upper, tried
        if tried >= _MAX_DAMP:
            raise QuantizationError(f"gptq_quantize: the hessian is not positive definite even "
                                    f"with damp={tried:g}; check the calibration activations")
        tried = min(_MAX_DAMP, max(tried, 1e-4) * 10)


def _choose_params(cur: torch.Tensor, hdiag: torch.Tensor, spec: QuantSpec, clip_search: bool
                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A group's ``(scale [N] fp16, zero [N] | None)`` for its current weights ``cur [N, g]``:
    per row, the clipping ratio with the lowest ``Σ diag(H)·(w - q)²`` (full range on ties)."""
    ratios = CLIP_RATIOS if clip_search else (1.0,)
    best = None
    for ratio in ratios:
        scale, zero = group_params(cur, spec.wtype, spec.zero_point, ratio)
        zcol = None if zero is None else zero.unsqueeze(-1)
        codes = quantize_with(cur, scale.unsqueeze(-1), zcol, spec.wtype)
        deq = dequantize_with(codes, scale.unsqueeze(-1), zcol, spec.wtype)
        err = ((cur - deq).square() * hdiag).sum(dim=-1)
        if best is None:
            best = (err, scale, zero)
            continue
        better = err < best[0]
        best = (torch.where(better, err, best[0]), torch.where(better, scale, best[1]),
                None if zero is None else torch.where(better, zero, best[2]))
    assert best is not None
    return best[1], best[2]


@torch.no_grad()
def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, spec: QuantSpec, *,
                  act_order: bool = False, damp: float = 0.01, block_size: int = 128,
                  clip_search: bool = True, where: str = "gptq_quantize") -> GPTQResult:
    """Quantize ``weight [N, K]`` to ``spec`` by GPTQ with the input Hessian ``hessian [K, K]``
    (float32, on the weight's device; neither argument is changed).

    ``damp``: fraction of ``mean(diag H)`` added to the diagonal; inputs whose ``diag H`` is
    0 (never active) get 1 there and their weight columns are quantized as zeros.
    ``act_order``: columns by decreasing ``diag H`` (the result's ``input_perm``).
    ``block_size``: columns per lazy batch update. ``clip_search``: try shrinking each
    group's range by the :data:`CLIP_RATIOS`. ``where`` names the layer in errors; a weight
    with a NaN or inf, or a group whose scale float16 cannot hold, is refused first.
    """
    _check_args(weight, hessian, spec, damp, block_size, act_order)
    check_quantizable(weight, spec, where)
    dev = weight.device
    n, k = weight.shape
    group, wtype = spec.group_size, spec.wtype
    w = weight.detach().float().clone()
    h = hessian.detach().to(device=dev, dtype=torch.float32).clone()
    dead = h.diagonal() == 0
    h.diagonal()[dead] = 1.0
    w[:, dead] = 0.0
    perm = None
    if act_order:
        perm = torch.argsort(h.diagonal(), descending=True, stable=True)
        w, h = w[:, perm], h[perm][:, perm]
    hdiag = h.diagonal().clone()
    upper, used = _inverse_factor(h, float(damp))
    del h

    groups = k // group
    codes = torch.empty(n, k, dtype=torch.uint8, device=dev)
    quant = torch.empty(n, k, dtype=torch.float32, device=dev)
    scales = torch.empty(groups, n, dtype=torch.float16, device=dev)
    zeros = torch.empty(groups, n, dtype=torch.float32, device=dev) if spec.zero_point else None
    scale: torch.Tensor = scales[0]
    zero: torch.Tensor | None = None
    for b0 in range(0, k, block_size):
        b1 = min(b0 + block_size, k)
        w1 = w[:, b0:b1].clone()
        err1 = torch.zeros_like(w1)
        u1 = upper[b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = b0 + i
            if col % group == 0:  # the group's parameters, from its current weights
                end = col + group
                cur = w1[:, i:min(end, b1) - b0]
                if end > b1:  # later blocks: add this block's pending feedback
                    rest = w[:, b1:end] - err1[:, :i] @ upper[b0:col, b1:end]
                    cur = torch.cat([cur, rest], dim=1)
                scale, zero = _choose_params(cur, hdiag[col:end], spec, clip_search)
                scales[col // group] = scale
                if zeros is not None:
                    zeros[col // group] = zero
            column = w1[:, i]
            code = quantize_with(column, scale, zero, wtype)
            value = dequantize_with(code, scale, zero, wtype)
            codes[:, col], quant[:, col] = code, value
            e = (column - value) / u1[i, i]
            w1[:, i + 1:] -= e.unsqueeze(1) * u1[i, i + 1:].unsqueeze(0)
            err1[:, i] = e
        w[:, b1:] -= err1 @ upper[b0:b1, b1:]

    if perm is not None:
        original = torch.empty_like(quant)
        original[:, perm] = quant
        quant = original
    return GPTQResult(codes=codes, scales=scales,
                      zeros=None if zeros is None else zeros.to(torch.float16),
                      input_perm=perm, weight=quant,
                      error=proxy_error(weight, quant, hessian), damp=used)
