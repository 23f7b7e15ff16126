"""GemLite's Triton low-bit GEMMs as a baseline: quantise, pack, choose a config, run.

What is timed: GemLite's weight-only "A16Wn INT" path, the layer that
``gemlite.helper.A16Wn().from_weights`` builds from HQQ-style weights: a
``GemLiteLinearTriton(nbits, group, K, N, input_dtype=FP16, output_dtype=FP16)`` with
fp32 accumulation, codes packed 32 bits wide along K and one fp16 scale and zero per
(row, group). GemLite takes 1, 2, 4 and 8-bit codes (:data:`GEMLITE_BITS`).

Conventions (GemLite 0.6, HQQ format, ``fma_mode`` at its default):

* ``pack(W_q, scales, zeros)`` takes uint8 codes ``q[n, k]`` in ``0 .. 2**nbits - 1`` and
  fp16 ``scales``/``zeros`` ``[N, K/group]`` with ``W ~ (q - zeros) * scales``;
* it stores ``zeros' = fp16(-zeros * scales)`` (``W_group_mode`` 4) and its kernels
  dequantise with one fp16 fma, ``W_kernel[n, k] = fp16(q * scale + zero')``: that is
  the weight :func:`dequantized` returns for the float64 check, built from the scales and
  zeros the layer holds, so the check measures the GEMM and not the quantisation.

Configs and autotuning. GemLite's default autotune mode ("fast") is kept: its Triton
autotuner takes the config GemLite ships for this GPU (``configs/h100.json``, loaded by
``import gemlite`` on an H100) when the call's signature (M bucket, N, K, group, packing,
type) is in the file, and otherwise benchmarks about twenty configs, each compiled first,
for every new (shape, M bucket): tens of seconds each, minutes over the Llama shapes.
So that a run prepares GemLite in seconds, :func:`plan_call` routes each M:

1. GemLite's own kernel for this M (``get_matmul_type``) where the file has its config;
2. else the other GemLite kernel that serves this M (GEMM_SPLITK up to M = 64, GEMM
   above) where the file has its config: the shipped H100 file predates GemLite's
   current dispatch (GEMV up to M = 4, GEMM from M = 64) and covers M = 4 and 64 only
   through GEMM_SPLITK;
3. else the config the file has for the nearest shape (same kernel, M bucket, group and
   width; nearest in log N + log K), copied into GemLite's config cache under this
   signature: Llama-3-70B's shapes are not in the file;
4. else (nothing shipped for this width and group: int2, int8, groups other than 64
   and 128) GemLite autotunes as it would for any user.

``LOWVM_GEMLITE_AUTOTUNE=1`` turns 2 and 3 off: GemLite's own kernel choice, autotuned
wherever nothing is shipped (GemLite out of the box; slow to prepare). On another sm_90
GPU (an H200), where ``import gemlite`` loads no file, the H100 file is loaded.

Accuracy at M = 1 (GemLite's own path, not the routing). GemLite's M = 1 kernel,
GEMV_REVSPLITK, gives each program ``2 * BLOCK_SIZE_K`` of K, sums them in fp32 and adds
the partial sum into the fp16 output with an fp16 atomic: ``K / (2 BLOCK_SIZE_K)`` fp16
roundings per output (BLOCK_SIZE_K is 8 in most shipped H100 configs: 256 at K = 4096,
1792 at K = 28672). The error grows as their square root: 2.3e-3 at K = 4096, 3.4e-3 at
8192, 4.3e-3 at 14336, 6.2e-3 at 28672 against float64 (H100, 2026-11-24), so from
K = 8192 GemLite's M = 1 rows fail the harness's fp16 tolerance (3e-3, the same for every
kernel). GEMM_SPLITK (M > 1) adds only SPLIT_K <= 16 partials and stays near 6e-4
(measured with the same kernel writing an fp32 output).
"""

from __future__ import annotations

import ast
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lowvm.bench.errors import BenchError

__all__ = [
    "GEMLITE_BITS",
    "PACKING_BITS",
    "AUTOTUNE_ENV",
    "Plan",
    "GemliteWeight",
    "check_args",
    "quantize",
    "fma_zeros",
    "dequantize",
    "signature",
    "nearest_key",
    "plan_call",
    "autotune_requested",
    "prepare",
    "run",
    "dequantized",
]

#: Code widths GemLite's INT path packs (its ``SUPPORTED_BITS_TRITON`` less 16).
GEMLITE_BITS = (1, 2, 4, 8)
#: GemLite's default packing word (``GemLiteLinearTriton.PACKING_BITWIDTH``).
PACKING_BITS = 32
#: GemLite's ``DType.FP16.value``: with the width it makes the configs' ``type_id``.
_FP16_ID = 1
#: Environment variable that lets GemLite autotune instead of routing to shipped configs.
AUTOTUNE_ENV = "LOWVM_GEMLITE_AUTOTUNE"
#: Below this many rows GemLite's GEMM_SPLITK is the batched alternative; above, GEMM.
_SPLITK_MAX_M = 64


@dataclass(frozen=True)
class Plan:
    """How one M is run: which GemLite kernel, and where its config comes from."""

    kernel: str                       # GemLite matmul type, e.g. "GEMV_REVSPLITK"
    source: str                       # "shipped", "nearest (...)", "autotune"
    seed: tuple[str, dict[str, Any]] | None = None  # (signature, config) to add to the cache


@dataclass
class GemliteWeight:
    """A packed GemLite layer and what the float64 check needs."""

    layer: Any                        # gemlite.GemLiteLinearTriton
    codes: Any                        # uint8 [N, K]
    scales: Any                       # fp16 [N, K / group], as the layer holds them
    zeros: Any                        # fp16 [N, K / group]: zero' = -zero * scale, held
    nbits: int
    group: int
    autotune: bool
    plans: dict[int, Plan] = field(default_factory=dict)  # by M, made on first use


def check_args(n: int, k: int, nbits: int, group: int) -> None:
    """Raise :class:`BenchError` where GemLite's INT path cannot take the weight."""
    if nbits not in GEMLITE_BITS:
        raise BenchError(f"gemlite: nbits={nbits} is not supported; GemLite packs "
                         f"{', '.join(map(str, GEMLITE_BITS))}-bit codes")
    if group < 32 or group % 32:
        raise BenchError(f"gemlite: group={group} is not supported; GemLite takes groups "
                         "that are multiples of 32")
    if k % 32 or k % group:
        raise BenchError(f"gemlite: K={k} must be a multiple of 32 and of group={group}")
    if k == group:
        raise BenchError(f"gemlite: K={k} must hold at least two groups of {group}: with "
                         "one group per row GemLite switches to channel-wise scales")
    if n < 1:
        raise BenchError(f"gemlite: N={n} must be positive")


def quantize(weight: Any, nbits: int, group: int) -> tuple[Any, Any, Any]:
    """Asymmetric round-to-nearest per group of ``weight [N, K]`` in GemLite's (HQQ's)
    form ``W ~ (q - zero) * scale``: ``(codes uint8 [N, K], scales fp16 [N, K/group],
    zeros fp16 [N, K/group])``. Codes are rounded with the fp16 scale and zero, so they
    are the nearest codes for the metadata GemLite is given."""
    import torch

    if weight.dim() != 2:
        raise BenchError(f"gemlite: weight must be 2-D [N, K], got shape "
                         f"{tuple(weight.shape)}")
    n, k = weight.shape
    check_args(n, k, nbits, group)
    qmax = (1 << nbits) - 1
    w = weight.to(torch.float32).reshape(n, k // group, group)
    lo = w.amin(dim=2)
    hi = w.amax(dim=2)
    scale = ((hi - lo) / qmax).clamp(min=1e-4).to(torch.float16)
    zero = (-lo / scale.float()).to(torch.float16)
    q = (w / scale.float().unsqueeze(2) + zero.float().unsqueeze(2)).round().clamp(0, qmax)
    return q.to(torch.uint8).reshape(n, k), scale, zero


def fma_zeros(scales: Any, zeros: Any) -> Any:
    """The zero GemLite's ``pack`` stores in fma mode: ``fp16(-zero * scale)``, the
    product taken in fp32 (as GemLite does) and rounded once."""
    import torch

    return (-zeros.float() * scales.float()).to(torch.float16)


def dequantize(codes: Any, scales: Any, zeros_fma: Any, group: int) -> Any:
    """``fp16(q * scale + zero')`` per element, in float64 ``[N, K]``: the weight
    GemLite's kernels multiply by (one fp16 fma per element). The product and sum are
    exact in float64, so the one rounding is to fp16, as in the kernel."""
    import torch

    expand = lambda t: t.to(torch.float64).repeat_interleave(group, dim=1)  # noqa: E731
    exact = codes.to(torch.float64) * expand(scales) + expand(zeros_fma)
    return exact.to(torch.float16).to(torch.float64)


def signature(m_bucket: int, n: int, k: int, group: int, nbits: int) -> str:
    """The key of GemLite's config files for an fp16-activation INT call:
    ``str((M bucket, N, K, group, elements per packed word, type_id))``."""
    return str((m_bucket, n, k, group, PACKING_BITS // nbits, _FP16_ID * 100 + nbits))


def nearest_key(configs: Mapping[str, Any], m_bucket: int, n: int, k: int, group: int,
                nbits: int) -> str | None:
    """The signature in ``configs`` with this M bucket, group and width whose (N, K) is
    nearest to ``(n, k)`` in ``|log N'/N| + |log K'/K|`` (ties: the smaller key)."""
    want = ast.literal_eval(signature(m_bucket, n, k, group, nbits))
    best: tuple[float, tuple[int, ...]] | None = None
    for key in configs:
        try:
            sig = ast.literal_eval(key)
        except (ValueError, SyntaxError):
            continue
        if not (isinstance(sig, tuple) and len(sig) == 6):
            continue
        if (sig[0], sig[3], sig[4], sig[5]) != (want[0], want[3], want[4], want[5]):
            continue
        dist = abs(math.log(sig[1] / n)) + abs(math.log(sig[2] / k))
        if best is None or (dist, sig) < best:
            best = (dist, sig)
    return None if best is None else str(best[1])


def _alternative(m: int) -> str:
    return "GEMM_SPLITK" if m <= _SPLITK_MAX_M else "GEMM"


def plan_call(m: int, m_bucket: int, n: int, k: int, group: int, nbits: int, auto: str,
              cache: Mapping[str, Mapping[str, Any]], autotune: bool = False) -> Plan:
    """Choose the GemLite kernel and config source for ``M = m`` (module docstring, steps
    1-4). ``auto`` is GemLite's own choice, ``cache`` its loaded config files by kernel,
    ``m_bucket`` its M bucket for ``m``. Pure: the caller applies ``Plan.seed``."""
    if autotune:
        return Plan(auto, "autotune")
    key = signature(m_bucket, n, k, group, nbits)
    order = list(dict.fromkeys((auto, _alternative(m))))
    for name in order:
        if key in cache.get(name, {}):
            return Plan(name, "shipped")
    for name in order:
        configs = cache.get(name, {})
        near = nearest_key(configs, m_bucket, n, k, group, nbits)
        if near is not None:
            return Plan(name, f"nearest {near}", (key, dict(configs[near])))
    return Plan(auto, "autotune")


def autotune_requested() -> bool:
    """Whether :data:`AUTOTUNE_ENV` asks for GemLite's own autotuning (1/true/yes)."""
    value = os.environ.get(AUTOTUNE_ENV, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise BenchError(f"{AUTOTUNE_ENV}={value!r}: expected 1/true/yes or 0/false/no")


def _ensure_configs(gemlite: Any) -> None:
    """Load GemLite's H100 file on an sm_90 GPU where ``import gemlite`` loaded none (the
    H200: same chip, GemLite matches files by device name)."""
    import torch

    core = gemlite.core
    if core.GEMLITE_TRITON_CONFIG_CACHE or torch.cuda.get_device_capability() != (9, 0):
        return
    path = os.path.join(os.path.dirname(gemlite.__file__), "configs", "h100.json")
    if os.path.isfile(path):
        gemlite.load_config(path)


def _check_weight(weight: Any) -> None:
    """GemLite's kernels are Triton CUDA kernels and the baseline is its fp16 path."""
    import torch

    if weight.dtype != torch.float16:
        raise BenchError(f"gemlite: weight dtype {weight.dtype} is not supported; the "
                         "baseline takes fp16 weights (fp16 activations)")
    if weight.device.type != "cuda":
        raise BenchError(f"gemlite: the weight must be on a CUDA device, got "
                         f"{weight.device}")


def prepare(weight: Any, nbits: int = 4, group: int = 128) -> GemliteWeight:
    """Quantise ``weight [N, K]`` (fp16, CUDA) and pack it into a GemLite layer."""
    import gemlite

    _check_weight(weight)
    autotune = autotune_requested()
    codes, scales, zeros = quantize(weight, nbits, group)
    n, k = weight.shape
    _ensure_configs(gemlite)
    layer = gemlite.GemLiteLinearTriton(
        nbits, group_size=group, in_features=k, out_features=n,
        input_dtype=gemlite.DType.FP16, output_dtype=gemlite.DType.FP16,
        scaled_activations=False)
    layer.pack(codes, scales, zeros, bias=None)
    if layer.W_group_mode != 4:
        raise RuntimeError(f"gemlite: expected the fma dequantisation (W_group_mode 4), "
                           f"the layer has {layer.W_group_mode}")
    held_scales = layer.scales.t().contiguous()
    held_zeros = layer.zeros.t().contiguous()
    return GemliteWeight(layer, codes, held_scales, held_zeros, nbits, group, autotune)


def _plan(w: GemliteWeight, m: int) -> Plan:
    import gemlite

    layer = w.layer
    n, k = layer.out_features, layer.in_features
    plan = plan_call(m, gemlite.triton_kernels.utils.get_closest_m(m), n, k, w.group,
                     w.nbits, gemlite.core.get_matmul_type(m, w.nbits),
                     gemlite.core.GEMLITE_TRITON_CONFIG_CACHE, w.autotune)
    if plan.seed is not None:
        key, config = plan.seed
        gemlite.core.GEMLITE_TRITON_CONFIG_CACHE.setdefault(plan.kernel, {})[key] = config
    w.plans[m] = plan
    return plan


def run(w: GemliteWeight, x: Any) -> Any:
    """``x [M, K] fp16 @ W_kernel^T`` -> ``[M, N]`` fp16, on the kernel planned for M."""
    m = x.shape[0]
    plan = w.plans.get(m) or _plan(w, m)
    if w.autotune:
        return w.layer(x)
    return w.layer.forward_manual(x, matmul_type=plan.kernel)


def dequantized(w: GemliteWeight) -> Any:
    """The ``[N, K]`` float64 weight GemLite's kernels use (see :func:`dequantize`)."""
    return dequantize(w.codes, w.scales, w.zeros, w.group)
