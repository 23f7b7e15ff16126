"""Bit-manipulation casts from 1..8-bit types to float16/bfloat16 (lowvm.codegen.fast_cast).

Exactness is proved on the CPU by running the very operation list the CUDA is printed
from (``simulate``) on every code of every type, with junk in the unused bits; the CUDA
compiles for sm_80/sm_90 without per-element decoding or int->float conversions; the
``gpu`` tests compare the kernels bit for bit with the interpreter.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import lowvm
import lowvm.lang as vm
from lowvm.codegen.fast_cast import (
    OPERATIONS,
    Op,
    plan_cast,
    plan_hardware_cast,
    plan_work,
    simulate,
)
from lowvm.codegen.prelude import PRELUDE
from lowvm.driver import generate_cuda
from lowvm.dtypes import all_dtypes, bfloat16, decode, float16, pack
from lowvm.instructions.values import from_codes, to_codes
from lowvm.layouts.cast_recipe import pair_span

LOW_BIT = [d for d in all_dtypes() if d.nbits <= 8]
DSTS = [float16, bfloat16]
# e5m1/e6m1 overflow float16 (and e6m1 underflows it): the generic loop handles them
NOT_COVERED = {(lowvm.float7_e5m1, float16), (lowvm.float8_e6m1, float16)}
COVERED = [(s, d) for s in LOW_BIT for d in DSTS if (s, d) not in NOT_COVERED]
_THREADS = 32
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


def _ids(case) -> str:
    return f"{case[0].short_name}-{case[1].short_name}"


# ---------------------------------------------------------------------------------------
# test programs: bytes -> view -> cast, and float32 values -> cast -> cast (any size)


@vm.program(warps=_THREADS // 32)
def view_cast_f16(n: vm.int32, src: vm.ptr[vm.uint8], out: vm.ptr[vm.float16],
                  wtype: vm.constexpr = vm.int4, size: vm.constexpr = 8):
    """``out = float16(view(src bytes as wtype))``; ``size * wtype.nbits`` a multiple of 8."""
    nbytes = size * wtype.nbits // 8
    vm.set_grid(vm.cdiv(n, _THREADS * size))
    b = vm.block_index()
    g_src, g_out = vm.global_view(src, [n * wtype.nbits // 8]), vm.global_view(out, [n])
    raw = vm.load_global(g_src, [b * _THREADS * nbytes], [_THREADS * nbytes],
                         vm.spatial(_THREADS).local(nbytes))
    low = vm.view(raw, wtype, vm.spatial(_THREADS).local(size))
    vm.store_global(g_out, vm.cast(low, vm.float16), [b * _THREADS * size])


@vm.program(warps=_THREADS // 32)
def view_cast_bf16(n: vm.int32, src: vm.ptr[vm.uint8], out: vm.ptr[vm.bfloat16],
                   wtype: vm.constexpr = vm.int4, size: vm.constexpr = 8):
    """``out = bfloat16(view(src bytes as wtype))``; ``size * wtype.nbits`` a multiple of 8."""
    nbytes = size * wtype.nbits // 8
    vm.set_grid(vm.cdiv(n, _THREADS * size))
    b = vm.block_index()
    g_src, g_out = vm.global_view(src, [n * wtype.nbits // 8]), vm.global_view(out, [n])
    raw = vm.load_global(g_src, [b * _THREADS * nbytes], [_THREADS * nbytes],
                         vm.spatial(_THREADS).local(nbytes))
    low = vm.view(raw, wtype, vm.spatial(_THREADS).local(size))
    vm.store_global(g_out, vm.cast(low, vm.bfloat16), [b * _THREADS * size])


@vm.program(warps=_THREADS // 32)
def value_cast_f16(n: vm.int32, x: vm.ptr[vm.float32], out: vm.ptr[vm.float16],
                   wtype: vm.constexpr = vm.int4, size: vm.constexpr = 8):
    """``out = float16(wtype(x))`` for any local ``size`` (x holds wtype values)."""
    vm.set_grid(vm.cdiv(n, _THREADS * size))
    start = [vm.block_index() * _THREADS * size]
    gx, g_out = vm.global_view(x, [n]), vm.global_view(out, [n])
    values = vm.load_global(gx, start, [_THREADS * size], vm.spatial(_THREADS).local(size))
    vm.store_global(g_out, vm.cast(vm.cast(values, wtype), vm.float16), start)


@vm.program(warps=_THREADS // 32)
def value_cast_bf16(n: vm.int32, x: vm.ptr[vm.float32], out: vm.ptr[vm.bfloat16],
                    wtype: vm.constexpr = vm.int4, size: vm.constexpr = 8):
    """``out = bfloat16(wtype(x))`` for any local ``size`` (x holds wtype values)."""
    vm.set_grid(vm.cdiv(n, _THREADS * size))
    start = [vm.block_index() * _THREADS * size]
    gx, g_out = vm.global_view(x, [n]), vm.global_view(out, [n])
    values = vm.load_global(gx, start, [_THREADS * size], vm.spatial(_THREADS).local(size))
    vm.store_global(g_out, vm.cast(vm.cast(values, wtype), vm.bfloat16), start)


VIEW = {float16: view_cast_f16, bfloat16: view_cast_bf16}
VALUE = {float16: value_cast_f16, bfloat16: value_cast_bf16}


def _view_ok(src, size: int) -> bool:
    return size * src.nbits % 8 == 0


def _program(src, dst, size: int):
    """The byte-view program where the bits make whole bytes, else the value program."""
    template = VIEW[dst] if _view_ok(src, size) else VALUE[dst]
    return template.build(wtype=src, size=size)


def _kernel_body(source: str) -> str:
    return source[source.index('extern "C"'):]


# ---------------------------------------------------------------------------------------
# exactness of the recipes, on the CPU


def _stream_words(codes: np.ndarray, src, rng: np.random.Generator) -> np.ndarray:
    """[threads, W] uint32 words of each row's bit stream; bits past the codes are junk."""
    threads, size = codes.shape
    nbits = size * src.nbits
    nwords = -(-nbits // 32)
    junk = rng.integers(0, 256, (threads, nwords * 4), dtype=np.uint8)
    bits = np.unpackbits(junk, axis=1, bitorder="little")
    stream = np.unpackbits(pack(codes.reshape(-1), src), bitorder="little")
    bits[:, :nbits] = stream[: threads * nbits].reshape(threads, nbits)
    return np.packbits(bits, axis=1, bitorder="little").view("<u4").astype(np.uint32)


def _codes(src, size: int, threads: int, rng: np.random.Generator) -> np.ndarray:
    """Random codes whose first entries run through every code of ``src``, in every local."""
    codes = rng.integers(0, 1 << src.nbits, (threads, size))
    every = np.arange(1 << src.nbits)
    if threads < every.size:
        raise ValueError(f"{threads} threads cannot hold every code of {src.name}")
    for local in range(size):  # every code at every local position
        codes[: every.size, local] = np.roll(every, local)
    return codes


def _expected_bits(codes: np.ndarray, src, dst) -> tuple[np.ndarray, np.ndarray]:
    """The interpreter's destination patterns (uint16) and where the value is NaN."""
    from lowvm.dtypes import round_to

    values = decode(codes, src).astype(np.float64)
    return to_codes(round_to(values, dst), dst).astype(np.uint16), np.isnan(values)


def _assert_same_bits(got: np.ndarray, want: np.ndarray, nan: np.ndarray, dst, what: str):
    """Bit-exact, except that a NaN only has to be a NaN of the same sign."""
    with np.errstate(invalid="ignore"):  # signalling NaN patterns widen with a warning
        got_values = from_codes(got.astype(np.uint64), dst)
    sign = (got >> 15) == (want >> 15)
    ok = np.where(nan, np.isnan(got_values) & sign, got == want)
    if not ok.all():
        idx = tuple(np.argwhere(~ok)[0])
        raise AssertionError(f"{what}: {int((~ok).sum())} wrong, first at {idx}: "
                             f"0x{int(got[idx]):04x} instead of 0x{int(want[idx]):04x}")


@pytest.mark.parametrize("case", COVERED, ids=_ids)
def test_recipe_is_exact_on_every_code(case):
    src, dst = case
    rng = np.random.default_rng(src.nbits * 31 + dst.nbits)
    for size in (1, 2, 3, 5, 7, 8, 9, 16, 24, 33, 64):
        ops = plan_cast(src, dst, size)
        assert ops is not None
        threads = max(1 << src.nbits, 64)
        codes = _codes(src, size, threads, rng)
        got = simulate(ops, _stream_words(codes, src, rng), dst, size)
        want, nan = _expected_bits(codes, src, dst)
        _assert_same_bits(got, want, nan, dst, f"{src.name} -> {dst.name}, {size} locals")


def test_output_order_pairs_consecutive_locals():
    """Locals 2j, 2j+1 land in the low/high halves of the word stored at 2j, in order."""
    for src in (lowvm.uint4, lowvm.uint2, lowvm.uint1, lowvm.uint3, lowvm.uint8):
        size = 32
        ops = plan_cast(src, float16, size)
        stores = [op for op in ops if op.kind.startswith("store")]
        assert sorted(op.imm[0] for op in stores) == list(range(0, size, 2))
        assert all(op.kind == "store2" for op in stores)
        # distinct codes per local: local l holds l mod 2^N
        codes = (np.arange(size) % (1 << src.nbits))[None, :]
        got = simulate(ops, _stream_words(codes, src, np.random.default_rng(0)), float16, size)
        values = got.view(np.float16).astype(np.float64)[0]
        assert np.array_equal(values, codes[0].astype(np.float64))


def test_four_bit_words_convert_two_lanes_per_lop3():
    """uint4: one word of 8 locals takes 4 lop3 (locals i and i+4 together) and 4 prmt."""
    ops = plan_cast(lowvm.uint4, float16, 8)
    kinds = [op.kind for op in ops]
    assert kinds.count("lop3") == 4 and kinds.count("prmt") == 4
    assert kinds.count("hsub2") + kinds.count("hfma2") == 4
    assert "shf" not in kinds and kinds.count("word") == 1


@pytest.mark.parametrize("case", COVERED, ids=_ids)
def test_reordering_cast_is_exact_and_split_pairs_saves_operations(case):
    """A relayout cast (destination local l = source local perm[l]) is exact for every
    type, the identity given as an array (as kernels give it) too; in the split_pairs
    order of ``pair_span`` the whole-word integer casts need no prmt and the other
    1..7-bit casts take far fewer operations than in the plain order."""
    src, dst = case
    rng = np.random.default_rng(src.nbits * 7 + dst.nbits)
    size = 64
    span = pair_span(src, dst, size)
    perms = [rng.permutation(size), np.arange(size)]
    if span:
        perms.append(_split_perm(size, span))
    for perm in perms:
        ops = plan_cast(src, dst, size, perm)
        threads = max(1 << src.nbits, 64)
        codes = _codes(src, size, threads, rng)
        got = simulate(ops, _stream_words(codes, src, rng), dst, size)
        want, nan = _expected_bits(codes[:, perm], src, dst)
        _assert_same_bits(got, want, nan, dst, f"{src.name} -> {dst.name}, permuted")
    if span:
        assert src.nbits < 8
        plain = plan_cast(src, dst, size)
        if src.is_integer and src.nbits in (1, 2, 4):
            assert "prmt" not in [op.kind for op in ops]
            # what the split order saves
            assert [op.kind for op in plain].count("prmt") == size // 2
        else:  # spliced words and gathered bytes: far fewer operations
            assert plan_work(ops) <= 0.85 * plan_work(plain)
    else:  # one stored order serves both activation types: e5m1 keeps the plain one
        assert src.nbits == 8 or (src, float16) in NOT_COVERED


def _split_perm(size: int, span: int) -> np.ndarray:
    """The split_pairs order as a cast's perm: source local ``a*span/2 + i`` of each run
    is destination local ``2i + a``."""
    return np.arange(size).reshape(-1, 2, span // 2).transpose(0, 2, 1).reshape(-1)


def test_hardware_e4m3_plan_is_exact_keeps_nan_signs_and_costs_three_per_pair():
    """float8_e4m3 -> float16 through ``cvt.rn.f16x2.e4m3x2`` (modelled as the PTX ISA
    defines it: exact, NaN as the unsigned canonical 0x7FFF): every code, in every local,
    plain and permuted, with each NaN's sign restored; 3 operations per pair of locals
    against the bit manipulation's 7. No other pair has a hardware plan."""
    src = lowvm.float8_e4m3
    rng = np.random.default_rng(89)
    threads = 256
    for size in (1, 2, 3, 5, 8, 24, 64):
        for perm in (None, rng.permutation(size)):
            ops = plan_hardware_cast(src, float16, size, perm)
            assert ops is not None and [op.kind for op in ops].count("cvt_e4m3x2") == -(-size // 2)
            codes = _codes(src, size, threads, rng)
            got = simulate(ops, _stream_words(codes, src, rng), float16, size)
            used = codes if perm is None else codes[:, perm]
            want, nan = _expected_bits(used, src, float16)
            assert nan.any()  # S.1111.111 in both signs
            _assert_same_bits(got, want, nan, float16, f"hardware e4m3, {size} locals")
    assert plan_work(plan_hardware_cast(src, float16, 64)) == 3 * 32
    assert plan_work(plan_cast(src, float16, 64)) == 7 * 32
    assert plan_hardware_cast(src, bfloat16, 8) is None
    assert all(plan_hardware_cast(s, d, 8) is None for s, d in COVERED
               if (s, d) != (src, float16))


def test_hardware_e4m3_source_keeps_the_bit_manipulation_for_older_gpus():
    body = _kernel_body(generate_cuda(_program(lowvm.float8_e4m3, float16, 8)).source)
    guard = "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890"
    assert body.count(guard) == 1 and "#else" in body and "#endif" in body
    newer = body[body.index(guard):body.index("#else")]
    older = body[body.index("#else"):body.index("#endif")]
    assert newer.count("cvt.rn.f16x2.e4m3x2") == 4 and "__hmul2" not in newer
    assert "cvt.rn" not in older and "__hmul2" in older
    other = _kernel_body(generate_cuda(_program(lowvm.float8_e5m2, float16, 8)).source)
    assert "__CUDA_ARCH__" not in other


def test_three_bit_codes_in_split_order_cost_little_more_than_four_bit():
    """int3 in the pair_span order (codes i and i + 16 share a lane position in two
    words): 40 operations for 32 locals where the plain order took 76 and int4 takes 36.
    Each of the 14 lane-matched pairs is one lop3 and one half2 operation, with 3 splices
    and 3 shifts; each of the 2 pairs that straddle a boundary is one prmt gathering
    its bytes from the splices (at lane bits 7 and 6), one lop3, one half2 operation."""
    size = 32
    span = pair_span(lowvm.int3, float16, size)
    assert span == 32
    ops = plan_cast(lowvm.int3, float16, size, _split_perm(size, span))
    kinds = [op.kind for op in ops]
    assert plan_work(ops) == 40
    assert kinds.count("shr") == 3 and kinds.count("prmt") == 3  # one prmt is a splice
    assert kinds.count("shl") == kinds.count("shf") == 0  # no windows
    assert plan_work(plan_cast(lowvm.int3, float16, size)) == 76
    assert plan_work(plan_cast(lowvm.int4, float16, size, _split_perm(size, 8))) == 36


def test_a_wrong_constant_is_caught_by_the_model():
    """The model check has teeth: changing one magic constant breaks exactness."""
    src, dst, size = lowvm.int3, float16, 8
    ops = plan_cast(src, dst, size)
    broken = [Op(op.kind, op.out, op.args, (op.imm[0] ^ 0x00010001, *op.imm[1:]))
              if op.kind == "hsub2" else op for op in ops]
    assert broken != ops
    rng = np.random.default_rng(1)
    codes = _codes(src, size, 64, rng)
    words = _stream_words(codes, src, rng)
    want, _ = _expected_bits(codes, src, dst)
    assert np.array_equal(simulate(ops, words, dst, size), want)
    assert not np.array_equal(simulate(broken, words, dst, size), want)


def test_uncovered_pairs_have_no_plan():
    for src, dst in NOT_COVERED:
        assert plan_cast(src, dst, 8) is None and plan_hardware_cast(src, dst, 8) is None


def test_every_operation_kind_has_a_meaning_and_a_template_of_known_fields():
    """The table is the one place a kind is defined: its templates name only fields the
    printer fills in, the plans use only its kinds and every kind is used by one."""
    from string import Formatter

    from lowvm.codegen.fast_cast.emit import _FIELD_VALUES

    for name, kind in OPERATIONS.items():
        for template in (kind.cuda, kind.cuda_half):
            fields = {f for _, f, _, _ in Formatter().parse(template) if f is not None}
            assert fields <= set(_FIELD_VALUES), (name, fields - set(_FIELD_VALUES))
    used = set()
    for src, dst in COVERED:
        for size in (3, 8, 32):
            span = pair_span(src, dst, size)
            perm = None if span is None else _split_perm(size, span)
            for ops in (plan_cast(src, dst, size, perm), plan_cast(src, dst, size),
                        plan_hardware_cast(src, dst, size)):
                used |= {op.kind for op in ops or ()}
    assert used == set(OPERATIONS)
    with pytest.raises(ValueError, match="unknown operation 'nop'"):
        simulate([Op("nop", "v1")], np.zeros((1, 1), np.uint32), float16, 1)


# ---------------------------------------------------------------------------------------
# the generated CUDA


@pytest.mark.parametrize("case", COVERED, ids=_ids)
def test_source_has_no_per_element_decoding(case):
    src, dst = case
    for size in (1, 3, 8, 24):
        body = _kernel_body(generate_cuda(_program(src, dst, size)).source)
        cast = body[body.index("bit-manipulation cast"):]
        assert "lowvm_get_bits" not in cast and "lowvm_decode_float" not in cast
        assert "for (int l" not in cast[: cast.index("store_global")]
        assert "lop3.b32" in cast or "__byte_perm" in cast
        if _view_ok(src, size):  # the whole kernel: bytes, view, fast cast, store
            assert "lowvm_get_bits" not in body and "lowvm_decode_float" not in body
    body = _kernel_body(generate_cuda(_program(src, dst, 24)).source)
    if src.nbits in (3, 5, 6, 7):  # codes straddle 32-bit words
        assert "__funnelshift_r" in body
    # 32-bit loads and stores on the register arrays rely on their declared alignment
    assert re.search(r"__align__\(16\) (__half|__nv_bfloat16) r\d+\[", body)
    if src.nbits == 8 and src.is_integer:
        assert re.search(r"__align__\(16\) lowvm_[iu]8 r\d+\[24\]", body)


@pytest.mark.parametrize("case", sorted(NOT_COVERED, key=str), ids=_ids)
def test_uncovered_casts_fall_back_to_the_generic_loop(case):
    src, dst = case
    body = _kernel_body(generate_cuda(_program(src, dst, 8)).source)
    assert "bit-manipulation cast" not in body and "lowvm_decode_float" in body


def _combined_source(programs) -> tuple[str, list[str]]:
    """One translation unit with many kernels (the prelude once)."""
    prelude = PRELUDE.strip()
    parts, names = [prelude], []
    for program in programs:
        cuda = generate_cuda(program)
        parts.append(cuda.source.replace(prelude, ""))
        names.append(cuda.kernel_name)
    return "\n".join(parts), names


def _sections(text: str, marker: str, names: list[str], keep: list[str]) -> dict[str, str]:
    """The part of a PTX/SASS listing of each kernel in ``keep`` (``names``: every kernel)."""
    starts = sorted((text.index(f"{marker}{name}"), name) for name in names)
    ends = [s for s, _ in starts[1:]] + [len(text)]
    return {name: text[s:e] for (s, name), e in zip(starts, ends) if name in keep}


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_compiles_without_spills_or_conversions(arch, tmp_path):
    from lowvm.runtime import parse_ptxas_report

    cases = [(s, d, size) for s, d in COVERED for size in (3, 24)]  # odd tail; whole words
    source, names = _combined_source(_program(s, d, size) for s, d, size in cases)
    (tmp_path / "k.cu").write_text(source)
    proc = subprocess.run(["nvcc", "-cubin", f"-arch={arch}", "-O3", "-std=c++17", "--keep",
                           "-Xptxas", "-v", "-o", "k.cubin", "k.cu"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    usage = parse_ptxas_report(proc.stdout + proc.stderr)
    for name in names:
        assert usage[name]["spill_store_bytes"] == 0 and usage[name]["stack_bytes"] == 0, name

    # integer sources read as bytes (no float32 detour in the program): no conversions
    int_kernels = [name for name, (s, _, size) in zip(names, cases)
                   if s.is_integer and _view_ok(s, size)]
    assert len(int_kernels) >= 32
    ptx = _sections(next(tmp_path.glob("*.ptx")).read_text(), ".entry ", names, int_kernels)
    for name, text in ptx.items():
        conversions = re.findall(r"cvt[.\w]*\.(?:f16|bf16|f32|f64)\b[.\w]*", text)
        assert not conversions, (name, conversions[:5])
    cuobjdump = shutil.which("cuobjdump") or _wheel_tool("cuobjdump")
    nvdisasm = shutil.which("nvdisasm") or _wheel_tool("nvdisasm")
    if cuobjdump is None or nvdisasm is None:
        return  # the PTX check above stands; no SASS disassembler here
    env = {**os.environ, "PATH": f"{Path(nvdisasm).parent}{os.pathsep}{os.environ['PATH']}"}
    sass = subprocess.run([cuobjdump, "-sass", "k.cubin"], cwd=tmp_path, check=True,
                          capture_output=True, text=True, env=env).stdout
    for name, text in _sections(sass, "Function : ", names, int_kernels).items():
        assert not re.search(r"\b(I2F|F2F|I2FP)\b", text), name
        assert re.search(r"\bLOP3\b", text) and re.search(r"\bPRMT\b", text), name


def _wheel_tool(name: str) -> str | None:
    """A CUDA tool from an NVIDIA pip wheel (nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm)."""
    try:
        import nvidia
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for found in Path(root).glob(f"**/bin/{name}"):
            if found.is_file():
                return str(found)
    return None


# ---------------------------------------------------------------------------------------
# on the GPU: bit-exact with the interpreter


def _torch_out(n: int, dst):
    import torch

    dtype = torch.float16 if dst == float16 else torch.bfloat16
    return torch.full((n,), float("nan"), dtype=dtype)


def _bits(tensor) -> np.ndarray:
    import torch

    return tensor.cpu().view(torch.int16).numpy().view(np.uint16)


@pytest.mark.gpu
@pytest.mark.parametrize("size", [1, 3, 8, 16, 24])
@pytest.mark.parametrize("case", COVERED, ids=_ids)
def test_gpu_matches_interpreter_bit_exactly(case, size):
    import torch

    src, dst = case
    rng = np.random.default_rng(src.nbits * 100 + size)
    blocks = max(3, (1 << src.nbits) // _THREADS)  # every code in every local
    n = blocks * _THREADS * size
    codes = _codes(src, size, blocks * _THREADS, rng).reshape(-1)
    finite = np.isfinite(decode(codes, src))
    fed = np.where(finite, codes, 0)  # a cast from float32 never makes NaN/inf codes
    runs = [("value", VALUE[dst], torch.from_numpy(decode(fed, src).astype(np.float32)), fed)]
    if _view_ok(src, size):  # every bit pattern, NaN and inf codes included
        runs.append(("view", VIEW[dst], torch.from_numpy(pack(codes, src)), codes))
    for label, template, data, used in runs:
        want, nan = _expected_bits(used, src, dst)
        ref = _torch_out(n, dst)
        lowvm.interpret(template, n, data.clone(), ref, wtype=src, size=size)
        _assert_same_bits(_bits(ref), want, nan, dst, f"interpreter, {label} {src.name}")
        out = _torch_out(n, dst).cuda()
        kernel = lowvm.compile(template, wtype=src, size=size)
        assert "bit-manipulation cast" in kernel.source
        kernel(n, data.cuda(), out)
        torch.cuda.synchronize()
        _assert_same_bits(_bits(out), _bits(ref), nan, dst, f"GPU, {label} {src.name}")
