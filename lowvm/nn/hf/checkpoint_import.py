"""Import GPTQ and AWQ packed layers into :class:`QuantLinear` by repacking (no requantizing).

**GPTQ** (AutoGPTQ / GPTQModel / transformers ``GPTQConfig``), ``bits`` in 2, 3, 4, 8:
``qweight`` int32 ``[K*bits/32, N]`` packs each column's K codes along K as one
little-endian bit stream across consecutive words (for 3 bits a code may straddle two
words); ``qzeros`` int32 ``[G, N*bits/32]`` packs zero points the same way along N;
``scales`` ``[G, N]``; ``g_idx`` int32 ``[K]`` (input channel -> group). Codes are
unsigned: ``W[n, k] = (q[k, n] - zero[g_idx[k], n]) * scale[g_idx[k], n]``.
``checkpoint_format="gptq"`` (the default: v1, what nearly every published checkpoint
uses) stores ``zero - 1`` and we add the 1 back, without masking, as the v1 kernels do;
``"gptq_v2"`` stores the zero itself. A column's K codes in GPTQ's words are exactly
lowvm's bit-stream row, so the weight repacks by a transpose and a byte view.

**Act-order** (``desc_act``; ``g_idx`` not ascending): the input channels are sorted by
group (a stable argsort of ``g_idx``), the weight's K axis is stored in that order and
the layer keeps the permutation (``input_perm``); ``forward`` gathers ``x[..., perm]``
first, so ``x[:, perm] @ W[:, perm]^T == x @ W^T`` and groups are contiguous for the
kernel. Each group must then hold exactly ``group_size`` channels (as GPTQ produces).

**AWQ** (AutoAWQ "GEMM" format, 4 bits): ``qweight`` int32 ``[K, N/8]`` and ``qzeros``
int32 ``[G, N/8]`` pack 8 output channels per word in the interleaved order: nibble i
(bits 4i..4i+3) of word c holds channel ``8c + (0, 2, 4, 6, 1, 3, 5, 7)[i]``. Zeros are
stored as they are. The "GEMV" variant (packed along K) is not accepted.

**compressed-tensors** "pack-quantized" (what llm-compressor writes for W4A16, W8A16, ...),
``bits`` 2..8: ``weight_packed`` int32 ``[N, ceil(K*bits/32)]`` holds each output row's K
codes as one little-endian bit stream (like a GPTQ column), each code stored as
``q + 2**(bits-1)`` for the signed ``q``; ``weight_scale`` ``[N, G]``; asymmetric layers add
``weight_zero_point`` packed the same way along N (``[ceil(N*bits/32), G]``), and act-order
layers ``weight_g_idx``. ``W[n, k] = (q - zero) * scale``: a symmetric layer becomes
lowvm's ``int{bits}`` (the stored code with its top bit flipped is q's two's complement),
an asymmetric one ``uint{bits}`` with zero points.

Every importer unpacks the codes and hands them to :meth:`QuantLinear.set_codes`, which
repacks them into the GPU kernel's layout (the one copy the layer keeps).
"""

from __future__ import annotations

import sys

import torch

from lowvm.nn.errors import CheckpointImportError
from lowvm.nn.layer.packing import unpack_rows
from lowvm.nn.layer.quant_linear import QuantLinear, bias_dtype_for
from lowvm.nn.layer.quantize import FP16_SCALE_MAX
from lowvm.nn.layer.tensor_checks import bias_problem

__all__ = ["from_gptq", "from_awq", "from_compressed_tensors", "AWQ_ORDER"]

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds channel 8c + AWQ_ORDER[i]
_GPTQ_BITS = (2, 3, 4, 8)
_GPTQ_FORMATS = ("gptq", "gptq_v2")


def _check_int32(name: str, tensor: torch.Tensor, where: str) -> None:
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.int32 or tensor.dim() != 2:
        got = (f"{tensor.dtype} {tuple(tensor.shape)}" if isinstance(tensor, torch.Tensor)
               else type(tensor).__name__)
        raise CheckpointImportError(f"{where}: {name} must be a 2-D torch.int32 tensor; "
                                    f"got {got}")


def _check_scales(scales: torch.Tensor, n: int, where: str) -> int:
    """The number of scale groups of a float ``[groups, n]`` scales tensor (else an error)."""
    if not isinstance(scales, torch.Tensor) or scales.dim() != 2 or scales.shape[1] != n \
            or not scales.dtype.is_floating_point:
        raise CheckpointImportError(f"{where}: scales must be a float [groups, {n}] tensor; got "
                                    f"{getattr(scales, 'dtype', type(scales))} "
                                    f"{tuple(getattr(scales, 'shape', ()))}")
    return scales.shape[0]


def _check_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...], where: str) -> None:
    if tuple(tensor.shape) != shape:
        raise CheckpointImportError(f"{where}: {name} has shape {tuple(tensor.shape)}; "
                                    f"expected {shape} for this qweight")


def _word_bytes(words: torch.Tensor) -> torch.Tensor:
    """int32 ``[R, W]`` as ``[R, 4W]`` uint8 in little-endian order (the formats' order)."""
    if sys.byteorder != "little":  # pragma: no cover - every CUDA host is little-endian
        raise CheckpointImportError("checkpoint import needs a little-endian host")
    return words.contiguous().view(torch.uint8)


def _group_order(g_idx: torch.Tensor | None, k: int, groups: int, group_size: int,
                 where: str) -> torch.Tensor | None:
    """None when channels are already in group order, else the sorting permutation."""
    if g_idx is None:
        return None
    if not isinstance(g_idx, torch.Tensor) or g_idx.dim() != 1 or g_idx.numel() != k \
            or g_idx.dtype.is_floating_point:
        raise CheckpointImportError(f"{where}: g_idx must be an integer tensor of shape ({k},);"
                                    f" got {getattr(g_idx, 'dtype', type(g_idx))} "
                                    f"{tuple(getattr(g_idx, 'shape', ()))}")
    g = g_idx.long().cpu()
    expected = torch.arange(k) // group_size
    perm = torch.sort(g, stable=True).indices
    if not torch.equal(g[perm], expected):
        counts = torch.bincount(g.clamp(min=0), minlength=groups)[:groups].tolist()
        raise CheckpointImportError(f"{where}: g_idx must give each of the {groups} groups "
                                    f"exactly group_size={group_size} channels; counts "
                                    f"{counts[:8]}{'...' if groups > 8 else ''}")
    return None if torch.equal(perm, torch.arange(k)) else perm


def from_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
              g_idx: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
              bits: int, group_size: int | None = None,
              checkpoint_format: str = "gptq") -> QuantLinear:
    """A QuantLinear (``uint{bits}`` with zero points) holding a GPTQ layer's weights."""
    where = "from_gptq"
    if bits not in _GPTQ_BITS:
        raise CheckpointImportError(f"{where}: bits={bits!r}; GPTQ packs 2, 3, 4 or 8 bits")
    if checkpoint_format not in _GPTQ_FORMATS:
        raise CheckpointImportError(f"{where}: checkpoint_format={checkpoint_format!r}; "
                                    f"accepted: {_GPTQ_FORMATS}")
    _check_int32("qweight", qweight, where)
    _check_int32("qzeros", qzeros, where)
    k, n = qweight.shape[0] * 32 // bits, qweight.shape[1]
    groups = _check_scales(scales, n, where)
    if k % groups:
        raise CheckpointImportError(f"{where}: {groups} scale groups do not divide K={k}")
    group_size = k // groups if group_size in (None, -1) else group_size
    if group_size * groups != k:
        raise CheckpointImportError(f"{where}: group_size={group_size} with {groups} scale "
                                    f"groups does not cover K={k}")
    _check_shape("qzeros", qzeros, (groups, n * bits // 32), where)
    _check_bias(bias, n, where)
    perm = _group_order(g_idx, k, groups, group_size, where)

    layer = QuantLinear(k, n, f"uint{bits}", group_size, zero_point=True,
                        bias=bias is not None, act_order=perm is not None,
                        device=qweight.device,
                        bias_dtype=bias_dtype_for(getattr(bias, "dtype", None)))
    zeros = unpack_rows(_word_bytes(qzeros), bits, n).float()
    if checkpoint_format == "gptq":
        zeros = zeros + 1  # v1 stored zero - 1
    rows = _word_bytes(qweight.t())  # [N, K*bits/8]: column n's codes, in K order
    codes = unpack_rows(rows, bits, k)
    if perm is not None:
        codes = codes[:, perm.to(codes.device)]
    layer.set_codes(codes, _fp16_scales(scales, where), zeros, perm)  # repacked
    if bias is not None and layer.bias is not None:
        with torch.no_grad():
            layer.bias.copy_(bias)
    return layer


def _awq_unpack(words: torch.Tensor) -> torch.Tensor:
    """int32 ``[R, C]`` in AWQ's interleaved order -> codes ``[R, 8C]`` in channel order."""
    shifts = torch.arange(0, 32, 4, device=words.device, dtype=torch.int32)
    nibbles = (words.unsqueeze(-1) >> shifts) & 0xF  # [R, C, 8]: nibble i
    codes = torch.empty_like(nibbles)
    codes[..., list(AWQ_ORDER)] = nibbles  # channel AWQ_ORDER[i] <- nibble i
    return codes.reshape(words.shape[0], -1).to(torch.uint8)


def from_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
             bias: torch.Tensor | None = None, *, bits: int = 4,
             group_size: int | None = None) -> QuantLinear:
    """A QuantLinear (``uint4`` with zero points) holding an AWQ GEMM-format layer."""
    where = "from_awq"
    if bits != 4:
        raise CheckpointImportError(f"{where}: bits={bits!r}; AWQ's GEMM format packs 4 bits")
    _check_int32("qweight", qweight, where)
    _check_int32("qzeros", qzeros, where)
    k, n = qweight.shape[0], qweight.shape[1] * 8
    groups = _check_scales(scales, n, where)
    if k % groups or (group_size not in (None, -1) and group_size * groups != k):
        raise CheckpointImportError(f"{where}: {groups} scale groups (group_size={group_size})"
                                    f" do not cover K={k}")
    _check_shape("qzeros", qzeros, (groups, n // 8), where)
    _check_bias(bias, n, where)
    layer = QuantLinear(k, n, "uint4", k // groups, zero_point=True, bias=bias is not None,
                        device=qweight.device,
                        bias_dtype=bias_dtype_for(getattr(bias, "dtype", None)))
    codes = _awq_unpack(qweight).t().contiguous()  # [N, K]
    layer.set_codes(codes, _fp16_scales(scales, where), _awq_unpack(qzeros).to(torch.float16))
    if bias is not None and layer.bias is not None:
        with torch.no_grad():
            layer.bias.copy_(bias)
    return layer


def _check_bias(bias: torch.Tensor | None, n: int, where: str) -> None:
    """A bias must be ``[n]`` floats that stay finite in the dtype the layer keeps."""
    if bias is not None:
        problem = bias_problem(bias, n, bias_dtype_for(getattr(bias, "dtype", None)))
        if problem:
            raise CheckpointImportError(f"{where}: {problem}")


def _fp16_scales(scales: torch.Tensor, where: str) -> torch.Tensor:
    """Scales as float16, refusing what float16 cannot hold (bfloat16 checkpoints)."""
    s = scales.float()
    if not bool(torch.isfinite(s).all()) or bool((s.abs() > FP16_SCALE_MAX).any()):
        raise CheckpointImportError(f"{where}: scales hold values float16 cannot store "
                                    f"(largest magnitude {float(s.abs().max()):.3g}); lowvm "
                                    "keeps float16 scales")
    return s.half()


def from_compressed_tensors(weight_packed: torch.Tensor, weight_scale: torch.Tensor,
                            weight_zero_point: torch.Tensor | None = None,
                            weight_g_idx: torch.Tensor | None = None,
                            bias: torch.Tensor | None = None, *, bits: int,
                            in_features: int, symmetric: bool = True) -> QuantLinear:
    """A QuantLinear (``int{bits}``, or ``uint{bits}`` with zero points when asymmetric)
    holding a compressed-tensors pack-quantized layer."""
    where = "from_compressed_tensors"
    if isinstance(bits, bool) or bits not in range(2, 9):
        raise CheckpointImportError(f"{where}: bits={bits!r}; accepted: 2..8")
    _check_int32("weight_packed", weight_packed, where)
    n, k = weight_packed.shape[0], in_features
    _check_shape("weight_packed", weight_packed, (n, -(-k * bits // 32)), where)
    if not isinstance(weight_scale, torch.Tensor) or weight_scale.dim() != 2 \
            or weight_scale.shape[0] != n or not weight_scale.dtype.is_floating_point:
        raise CheckpointImportError(f"{where}: weight_scale must be a float [{n}, groups] "
                                    f"tensor; got {getattr(weight_scale, 'dtype', None)} "
                                    f"{tuple(getattr(weight_scale, 'shape', ()))}")
    groups = weight_scale.shape[1]
    if k % groups:
        raise CheckpointImportError(f"{where}: {groups} scale groups do not divide K={k}")
    group_size = k // groups
    _check_bias(bias, n, where)
    perm = _group_order(weight_g_idx, k, groups, group_size, where)
    codes = unpack_rows(_word_bytes(weight_packed), bits, k)  # [N, K]: q + 2**(bits-1)
    offset = 1 << (bits - 1)
    if symmetric:
        if weight_zero_point is not None:
            raise CheckpointImportError(f"{where}: a symmetric layer has no weight_zero_point")
        wtype, zeros = f"int{bits}", None
        codes = codes ^ offset  # two's complement of q = stored - offset
    else:
        if weight_zero_point is None:
            raise CheckpointImportError(f"{where}: an asymmetric layer needs weight_zero_point")
        _check_int32("weight_zero_point", weight_zero_point, where)
        _check_shape("weight_zero_point", weight_zero_point, (-(-n * bits // 32), groups), where)
        zp_rows = _word_bytes(weight_zero_point.t())  # [G, words]: each group's N zeros
        wtype, zeros = f"uint{bits}", unpack_rows(zp_rows, bits, n).to(torch.float16)
    layer = QuantLinear(k, n, wtype, group_size, zero_point=not symmetric,
                        bias=bias is not None, act_order=perm is not None,
                        device=weight_packed.device,
                        bias_dtype=bias_dtype_for(getattr(bias, "dtype", None)))
    if perm is not None:
        codes = codes[:, perm.to(codes.device)]
    layer.set_codes(codes, _fp16_scales(weight_scale.t(), where), zeros, perm)
    if bias is not None and layer.bias is not None:
        with torch.no_grad():
            layer.bias.copy_(bias)
    return layer


