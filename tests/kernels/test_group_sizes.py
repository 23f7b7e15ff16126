"""Every group size (16, 32, 64, 128, per-channel) at every batch size runs on the kernel
and schedule ``quant_linear`` picks for it: on sm_90 (wgmma, quant_gemm, prefill) and on
sm_80 (quant_gemm, prefill), for float16 and bfloat16 activations.

The CPU tests ask the dispatcher itself which programs it compiles (its compiler and
launch replaced by a recorder, the device's architecture named), then trace, lower and
compile each of them to a cubin with nvcc/ptxas. The GPU test runs ``QuantLinear`` at the
same sizes against a float64 reference.
"""

from __future__ import annotations

import itertools
import shutil
import types
from typing import Any

import numpy as np
import pytest
import torch

import lowvm
from lowvm.driver import generate_cuda
from lowvm.errors import LowvmError
from lowvm.kernels import dispatch, schedules
from lowvm.kernels.quant_gemm_prefill import PREFILL_MIN_BK
from lowvm.kernels.weights import QuantWeight, weight_bk

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")

GROUPS = [16, 32, 64, 128, -1]
#: one batch size per bucket (1, 2..16, 17..64, 65..128, 129..4096), plus the edges
#: where the choice changes (9: sm_90's wgmma decode tiles on large weights; 33)
M_BUCKETS = [1, 16, 64, 128, 4096]
M_ALL = [1, 2, 9, 16, 17, 33, 64, 65, 128, 129, 256, 1024, 4096]
#: (type, zero point): the representative weight types
WTYPES = [("int4", False), ("int3", False), ("uint4", True), ("float4_e2m1", False),
          ("int8", False)]
#: (N, K): the reported shape, and one large enough for sm_90's wgmma decode tiles
SHAPES = [(4096, 4096), (8192, 8192)]
ARCHS = ["sm_80", "sm_90"]


class _Launch:
    """What the recorder gives the dispatcher in place of a compiled program."""

    cuda = types.SimpleNamespace(waits_prior_grid=False)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        pass


def _weight(wtype: str, group: int, n: int, k: int, zero_point: bool) -> QuantWeight:
    """A weight of this shape with placeholder tensors: planning reads only its shape,
    type and group (the recorded launch reads nothing)."""
    g = k if group == -1 else group
    t = torch.zeros(1, dtype=torch.float16)
    return QuantWeight(torch.zeros(1, dtype=torch.uint8), t, lowvm.dtype(wtype), g, n, k,
                       weight_bk(g, k), t if zero_point else None)


@pytest.fixture
def recorder(monkeypatch):
    """``plans(arch, m, weight, bf16)``: the (program, constants) pairs ``quant_linear``
    compiles for one call, on a GPU of ``arch``, with no tuned schedule registered."""
    compiled: list[tuple[Any, dict]] = []
    arch = ["sm_90"]

    def record(program: Any, **constants: Any) -> _Launch:
        compiled.append((program, constants))
        return _Launch()

    monkeypatch.setattr(dispatch, "_compiled", record)
    monkeypatch.setattr(dispatch, "_device_arch", lambda device: arch[0])
    monkeypatch.setattr(dispatch, "_SM90", {})
    monkeypatch.setattr(dispatch, "_PLANS", {})
    monkeypatch.setattr(dispatch, "_tuned", lambda m, weight: None)
    monkeypatch.setattr(dispatch, "split_buffers", lambda device, ws, tiles: (None, None))

    def plans(target: str, m: int, weight: QuantWeight, bf16: bool) -> list[tuple[Any, dict]]:
        arch[0] = target
        dispatch._SM90.clear()
        dispatch._PLANS.clear()
        compiled.clear()
        x = torch.zeros(m, weight.k, dtype=torch.bfloat16 if bf16 else torch.float16)
        dispatch.quant_linear(x, weight)
        return list(compiled)

    return plans


def _cuda_arch(cuda: Any, arch: str) -> str:
    return "sm_90a" if cuda.needs_sm90a else arch


def _compile_all(programs: dict[tuple, tuple[str, Any, dict]]) -> list[str]:
    """Lower each program and compile it to a cubin with nvcc/ptxas; the failures."""
    from lowvm.runtime import resource_usage

    failures = []
    for arch, program, constants in programs.values():
        try:
            cuda = generate_cuda(program.build(**constants))
            resource_usage(cuda.source, _cuda_arch(cuda, arch))
        except Exception as exc:  # every failure is reported, with its program
            failures.append(f"{arch} {program.name} {constants}: {str(exc)[-400:]}")
    return failures


def _collect(plans, shapes, groups, ms, wtypes, archs, dtypes=(False, True)):
    """The distinct programs the dispatcher compiles over these calls, by key."""
    programs: dict[tuple, tuple[str, Any, dict]] = {}
    for (n, k), group, (wtype, zp), m, bf16, arch in itertools.product(
            shapes, groups, wtypes, ms, dtypes, archs):
        for program, constants in plans(arch, m, _weight(wtype, group, n, k, zp), bf16):
            key = (arch, program.name, tuple(sorted((c, str(v)) for c, v in
                                                     constants.items())))
            programs.setdefault(key, (arch, program, constants))
    return programs


# ---------------------------------------------------------------------------------------
# the reported case, and the rule behind it


@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
def test_group_32_at_m_256_compiles(recorder, arch):
    """int4, group 32, 4096 x 4096 at M = 256: the prefill kernel cannot take 32-deep K
    tiles, so ``quant_gemm`` runs it (and its program compiles)."""
    made = recorder(arch, 256, _weight("int4", 32, 4096, 4096, False), False)
    assert [p.name for p, _ in made if "finish" not in p.name] == ["quant_gemm"]
    programs = {(arch, p.name): (arch, p, c) for p, c in made}
    assert _compile_all(programs) == []


@pytest.mark.parametrize("group", GROUPS)
def test_planned_programs_build_at_every_m(recorder, group):
    """Every program the dispatcher plans for int4 (float16) on either architecture
    traces and lowers: the fast subset of the compile matrix below."""
    programs = _collect(recorder, [(4096, 4096)], [group], M_BUCKETS, [("int4", False)],
                        ARCHS, dtypes=(False,))
    for _, program, constants in programs.values():
        generate_cuda(program.build(**constants))


def test_prefill_takes_no_tile_under_64():
    assert PREFILL_MIN_BK == 64
    for bk in (16, 32):
        for m in (129, 256, 4096, 65536):
            assert schedules.prefill_split(m, 8192, 8192, bk) == 0
        with pytest.raises(LowvmError, match=f"bk={bk}.*group_size >= 64"):
            schedules.choose_prefill_schedule(4096, 4096, 4096, bk, "int4")
    assert schedules.prefill_split(4096, 4096, 4096, 64) > 0


def test_k_slices_fit_the_k_tile():
    """A K step of 16 (groups of 16) holds one 16-deep slice, never a 32-deep one."""
    for m, (n, k) in itertools.product(range(17, 65), [(4096, 4096), (4096, 6144)]):
        for bk in (16, 32, 64, 128):
            s = schedules.choose_schedule(m, n, k, bk)
            assert s.k_slice <= bk and bk % s.k_slice == 0, (m, n, k, bk, s)


# ---------------------------------------------------------------------------------------
# the schedules chosen for small groups compute the right thing (interpreter)


def _interpret(wtype: str, group: int, sched: Any, m: int, n: int, k: int, zero_point: bool,
               bf16: bool, seed: int) -> float:
    """Run ``quant_gemm`` with ``sched`` in the interpreter on a random weight in groups
    of ``group`` (the format of K tile ``sched.bk``); its error against float64."""
    import ml_dtypes

    from lowvm.kernels.quant_gemm import finish_split, quant_gemm
    from lowvm.kernels.weight_format import weight_format
    from tests.helpers.gemm import float64_reference, random_weights, relative_error

    rng = np.random.default_rng(seed)
    wt = lowvm.dtype(wtype)
    adt = ml_dtypes.bfloat16 if bf16 else np.float16
    codes, scales, zeros = random_weights(rng, wt, n, k, group, zero_point)
    packed = weight_format(wt, sched.bk).repack(codes)
    x = rng.standard_normal((m, k)).astype(np.float16)
    y = np.full((m, n), np.nan, adt)
    ws = np.zeros((m, n), np.float32)
    counters = np.zeros(-(-m // sched.rows) * (n // 16), np.int32)
    adtype = lowvm.bfloat16 if bf16 else lowvm.float16
    zs = zeros if zero_point else scales
    lowvm.interpret(quant_gemm.build(adtype=adtype, wtype=wt, group=group,
                                     zero_point=zero_point, schedule=sched),
                    m, n, k, x.astype(adt), packed, scales.astype(adt), zs.astype(adt), y, ws,
                    counters)
    if sched.split > 1 and not sched.fused_split:
        lowvm.interpret(finish_split.build(adtype=adtype), m * n, ws, y)
    assert not ws.any() and not counters.any()
    ref = float64_reference(x, codes, scales, wt, group, zeros if zero_point else None)
    return relative_error(y.astype(np.float32), ref)


def _fitted(s: Any, k: int) -> Any:
    """The chosen schedule ``s`` with its split reduced until it fits K = ``k``."""
    split = s.split
    while split > 1 and (k // s.bk) % (split * s.steps_per_copy):
        split //= 2
    return s.resplit(k, split=split)


#: (M, group, type, zero point, bfloat16): one quant_gemm body per bucket, as chosen for
#: the reported 4096 x 4096 layer (decode held whole, decode streamed, one M-warp with
#: 16-deep slices, 128-row tiles where the prefill kernel gave way)
INTERPRETED = [(1, 16, "int4", False, False), (12, 32, "uint4", True, True),
               (40, 16, "int3", False, False), (40, 32, "float4_e2m1", False, True),
               (100, 16, "int8", False, False), (200, 32, "int4", False, True)]


@pytest.mark.parametrize("case", INTERPRETED)
def test_chosen_small_group_schedules_match_float64(case):
    m, group, wtype, zp, bf16 = case
    s = schedules.choose_schedule(m, 4096, 4096, group)
    assert schedules.prefill_split(m, 4096, 4096, group) == 0
    k = 512
    err = _interpret(wtype, group, _fitted(s, k), m, 64, k, zp, bf16, seed=m + group)
    assert err < (2e-2 if bf16 else 2e-3), (case, s, err)


# ---------------------------------------------------------------------------------------
# the whole matrix, compiled (slow)


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("group", GROUPS)
def test_every_planned_program_compiles(recorder, arch, group):
    """Each group size x batch size x weight type x activation type: every program the
    dispatcher compiles for it on ``arch`` compiles to a cubin."""
    programs = _collect(recorder, SHAPES, [group], M_ALL, WTYPES, [arch])
    kinds = {p.name for _, p, _ in programs.values()}
    expected = {"quant_gemm"} | ({"quant_gemm_wgmma"} if arch == "sm_90" and
                                 weight_bk(group if group > 0 else 4096, 4096) >= 64
                                 else set())
    assert expected <= kinds, kinds
    assert _compile_all(programs) == []


# ---------------------------------------------------------------------------------------
# GPU


#: (N, K) and the batch sizes run on it: every bucket on a small layer, the reported
#: shape, and one large enough for sm_90's wgmma decode tiles (M = 9..16)
GPU_CASES = [((512, 1024), M_ALL), ((4096, 4096), [1, 16, 64, 128, 256, 4096]),
             ((8192, 8192), [9, 16])]


def _dense_float64(layer: Any) -> torch.Tensor:
    """The layer's weight ``[N, K]`` in float64 on its device: codes decoded by numpy
    (independent of lowvm's dequantisation), zeros and scales applied per group."""
    from lowvm.dtypes import decode

    g = layer.group_size
    w = torch.from_numpy(decode(layer.codes().cpu().numpy(), layer.wtype).astype(np.float64))
    w = w.to(layer.scales.device)
    if layer.zeros is not None:
        w -= layer.zeros.double().t().repeat_interleave(g, 1)
    return w * layer.scales.double().t().repeat_interleave(g, 1)


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(len(GPU_CASES)))
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("wtype", ["int4", "int3", "uint4", "float4_e2m1", "int8"])
def test_quant_linear_matches_float64_at_every_m(case, group, wtype):
    from lowvm.nn import QuantLinear

    (n, k), ms = GPU_CASES[case]
    torch.manual_seed(0)
    dense = torch.nn.Linear(k, n, bias=False, dtype=torch.float16, device="cuda")
    layer = QuantLinear.from_linear(dense, dtype=wtype, group_size=group).cuda()
    weight = _dense_float64(layer)
    for m, dtype in itertools.product(ms, (torch.float16, torch.bfloat16)):
        x = torch.randn(m, k, device="cuda").to(dtype)
        y = layer(x)
        torch.cuda.synchronize()
        assert y.dtype == dtype and y.shape == (m, n)
        ref = x.double() @ weight.t()
        err = (torch.linalg.norm(y.double() - ref) / torch.linalg.norm(ref)).item()
        tol = 2e-2 if dtype == torch.bfloat16 else 3e-3
        assert np.isfinite(err) and err < tol, (n, k, group, wtype, m, dtype, err)
