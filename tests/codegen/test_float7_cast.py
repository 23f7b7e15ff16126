"""Small-float weights on the quantized GEMM's fast path (lowvm.codegen.fast_cast).

The 3..7-bit float types are stored in the split-pairs order and decoded from spliced
words; these tests check that conversion, as the GEMM emits it, against lowvm.dtypes'
decode on every code, the GEMM against a float64 reference (interpreter and GPU), and
the cost of the sm_90 main loop against int8's (ptxas and nvdisasm, no GPU needed).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter

import numpy as np
import pytest

import lowvm
from lowvm.codegen.fast_cast import plan_cast, plan_work, simulate
from lowvm.driver import generate_cuda
from lowvm.dtypes import all_dtypes, bfloat16, float16
from lowvm.kernels.library import fits_float16, quantize_to_codes
from lowvm.kernels.quant_gemm import quant_gemm, repack_weights, weight_layouts
from lowvm.kernels.schedules import choose_schedule
from lowvm.layouts.cast_recipe import pair_span
from lowvm.layouts.register import local_permutation
from tests.codegen.test_fast_cast import (
    NOT_COVERED,
    _assert_same_bits,
    _codes,
    _expected_bits,
    _stream_words,
    _wheel_tool,
)
from tests.helpers.gemm import float64_reference, relative_error, split_k_counters

FLOATS = [d for d in all_dtypes() if d.is_float and d.nbits <= 8]
FLOAT7 = [d for d in FLOATS if d.nbits == 7]
CASES = [(s, d) for s in FLOATS for d in (float16, bfloat16) if (s, d) not in NOT_COVERED]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def _ids(case) -> str:
    return f"{case[0].short_name}-{case[1].short_name}"


def _kernel_perm(wtype, adtype) -> np.ndarray:
    """The GEMM cast's permutation: stored order -> MMA B order (16 x 64 x 128 tile)."""
    lw = weight_layouts(wtype, 16, 64, 128, 1, 4, adtype)
    perm = local_permutation(lw.values, lw.mma.b)
    assert perm is not None
    return perm


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_gemm_conversion_equals_decode_on_every_code(case):
    """The operations the GEMM's cast is printed from, run in numpy on every code in
    every local (junk in unused bits), give lowvm.dtypes' decode bit for bit."""
    src, dst = case
    rng = np.random.default_rng(src.nbits * 13 + dst.nbits)
    perm = _kernel_perm(src, dst)
    ops = plan_cast(src, dst, perm.size, perm)
    assert ops is not None
    codes = _codes(src, perm.size, max(1 << src.nbits, 64), rng)
    got = simulate(ops, _stream_words(codes, src, rng), dst, perm.size)
    want, nan = _expected_bits(codes[:, perm], src, dst)
    _assert_same_bits(got, want, nan, dst, f"{src.name} -> {dst.name} in the GEMM's order")


@pytest.mark.parametrize("case", [c for c in CASES if c[0].nbits < 8], ids=_ids)
def test_split_order_cuts_the_small_float_conversion(case):
    """3..7-bit floats use the split-pairs order (one span for both activation types,
    except float7_e5m1, which float16 does not hold) and at most 6 operations per pair
    of codes in it, where the plain order takes 7."""
    src, dst = case
    perm = _kernel_perm(src, dst)
    if (src, float16) in NOT_COVERED:
        assert pair_span(src, dst, perm.size) is None
        return
    assert pair_span(src, dst, perm.size) == pair_span(src, float16, perm.size) is not None
    fast = plan_work(plan_cast(src, dst, perm.size, perm))
    plain = plan_work(plan_cast(src, dst, perm.size))
    pairs = perm.size // 2
    assert fast <= 6 * pairs < 7 * pairs <= plain, (fast, plain)


def _gemm_inputs(wtype, m: int, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    codes, scales = quantize_to_codes(rng.standard_normal((n, k)), wtype, 128)
    x = rng.standard_normal((m, k))
    return codes, scales, x, float64_reference(x.astype(np.float16), codes, scales,
                                                 wtype, 128)


@pytest.mark.parametrize("wtype", FLOAT7, ids=lambda t: t.name)
def test_interpreter_decode_schedule_matches_float64(wtype):
    """The M = 1 schedule (weights as A, x held whole, split-K) and the M = 16 one, in
    the interpreter, against float64."""
    import ml_dtypes

    n, k = 64, 512
    for m in (1, 16):
        s = choose_schedule(m, n, k, 128)
        codes, scales, x, ref = _gemm_inputs(wtype, m, n, k, wtype.nbits + m)
        packed = repack_weights(codes, wtype, s)
        kernels = [(bfloat16, ml_dtypes.bfloat16, 2e-2)]
        if fits_float16(wtype):
            kernels.append((float16, np.float16, 2e-3))
        for adtype, adt, tol in kernels:
            y = np.full((m, n), np.nan, adt)
            lowvm.interpret(quant_gemm.build(adtype=adtype, wtype=wtype, group=128,
                                             schedule=s), m, n, k,
                            x.astype(np.float16).astype(adt), packed, scales.astype(adt),
                            scales.astype(adt), y, np.zeros((m, n), np.float32),
                            split_k_counters(m, n))
            assert relative_error(y.astype(np.float64), ref) < tol, (m, adt)


@pytest.mark.gpu
@pytest.mark.parametrize("wtype", FLOATS, ids=lambda t: t.name)
@pytest.mark.parametrize("m", [1, 16])
def test_gpu_gemm_matches_float64(wtype, m):
    """Every 1..8-bit float type through the library's GEMM at M = 1 and 16, against
    float64 (the output poisoned first)."""
    import torch

    from lowvm.kernels.library import prepare_weight, quant_linear

    n, k = 256, 1024
    codes, scales, x, ref = _gemm_inputs(wtype, m, n, k, 5 + m)
    weight = prepare_weight(codes, scales, wtype, 128)
    dtypes = [(torch.bfloat16, 2e-2)] + ([(torch.float16, 2e-3)] if fits_float16(wtype)
                                         else [])
    for dtype, tol in dtypes:
        xt = torch.from_numpy(x.astype(np.float16)).cuda().to(dtype)
        y = quant_linear(xt, weight)
        assert y.dtype == dtype and torch.isfinite(y).all()
        assert relative_error(y.double().cpu().numpy(), ref) < tol, dtype


# ---------------------------------------------------------------------------------------
# the sm_90 main loop, without a GPU


def _main_loop(sass: str) -> list[str]:
    """The instructions of the longest backward branch's body (the K loop)."""
    labels: dict[str, int] = {}
    ins: list[str] = []
    for line in sass.splitlines():
        label = re.match(r"^\s*\.(L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(ins)
            continue
        found = re.match(r"^\s*/\*[0-9a-f]+\*/\s+(.*?);", line)
        if found:
            ins.append(found.group(1))
    best: list[str] = []
    for i, text in enumerate(ins):
        target = re.search(r"\bBRA\s+`?\(?\.?(L_x_\d+)", text)
        if target and labels.get(target.group(1), i + 1) <= i:
            body = ins[labels[target.group(1)]: i + 1]
            best = max(best, body, key=len)
    return best


def _opcode(text: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", text).split()[0].split(".")[0]


@pytest.mark.slow
@needs_nvcc
def test_m1_main_loop_has_no_spills_and_a_bounded_conversion(tmp_path):
    """quant_gemm at M = 1 (4096 x 4096, the library's schedule), compiled for sm_90:
    no spills, no per-element conversion, and each float7 type's K step within 1.9x
    int8's instructions (int8 converts a pair with one prmt and one hadd2; a float pair
    needs a sign and a magnitude moved and one hmul2 for the exponent bias)."""
    from lowvm.runtime import parse_ptxas_report

    nvdisasm = shutil.which("nvdisasm") or _wheel_tool("nvdisasm")
    if nvdisasm is None:
        pytest.skip("no nvdisasm (nvidia-cuda-nvdisasm wheel or toolkit)")
    s = choose_schedule(1, 4096, 4096, 128)
    assert s.swap_ab and s.prefetch == 1  # one K step per loop iteration
    loops = {}
    for wtype in [lowvm.int8, *FLOAT7[:-1]]:  # e5m1 does not run with float16
        d = tmp_path / wtype.name
        d.mkdir()
        source = generate_cuda(quant_gemm.build(wtype=wtype, group=128, schedule=s))
        (d / "k.cu").write_text(source.source)
        proc = subprocess.run(["nvcc", "-cubin", "-arch=sm_90", "-O3", "-std=c++17",
                               "-Xptxas", "-v", "-o", "k.cubin", "k.cu"], cwd=d,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        usage = parse_ptxas_report(proc.stdout + proc.stderr)[source.kernel_name]
        assert usage["spill_store_bytes"] == usage["spill_load_bytes"] == 0, wtype.name
        assert usage["stack_bytes"] == 0, wtype.name
        sass = subprocess.run([nvdisasm, "-c", "k.cubin"], cwd=d, check=True,
                              capture_output=True, text=True).stdout
        loop = _main_loop(sass)
        ops = Counter(_opcode(x) for x in loop)
        assert ops["HMMA"] == 8, (wtype.name, ops)  # 16 x 64 x 128 weights as A: 8 MMAs
        assert not {"I2F", "F2F", "I2FP", "F2FP"} & set(ops), (wtype.name, ops)
        loops[wtype.name] = len(loop)
    assert all(count <= 1.9 * loops["int8"] for count in loops.values()), loops
