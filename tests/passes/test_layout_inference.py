"""Layout inference: programs written without layouts match the annotated kernels."""

from __future__ import annotations

import inspect
import shutil

import numpy as np
import pytest

import lowvm
import lowvm.lang as vm
from lowvm.driver import generate_cuda
from lowvm.ir import ProgramError, RegisterTensor
from lowvm.kernels.matmul_f16 import matmul_f16
from lowvm.kernels.quant_matmul import quant_matmul, quantize_weights
from lowvm.layouts import local, permute, reduce, spatial
from lowvm.layouts.mma_tiling import block_mma_layouts
from lowvm.passes.layout_inference import (
    default_layout,
    infer_layouts,
    mma_candidates,
    view_layout,
)
from tests.helpers.programs import EXAMPLES

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")


# ---------------------------------------------------------------------------------------
# the two kernels of lowvm/kernels, with every layout left out


@vm.program(warps=4)
def matmul_no_layouts(m: vm.int32, n: vm.int32, k: vm.int32, a: vm.ptr[vm.float16],
                      b: vm.ptr[vm.float16], c: vm.ptr[vm.float16], bm: int = 64,
                      bn: int = 64, bk: int = 32, stages: int | None = None):
    vm.set_grid(vm.cdiv(n, bn), vm.cdiv(m, bm))
    ga, gb, gc = vm.global_view(a, [m, k]), vm.global_view(b, [k, n]), vm.global_view(c, [m, n])
    row0, col0 = vm.block_index(1) * bm, vm.block_index(0) * bn
    sa = vm.shared_tensor(vm.float16, [bm, bk])
    sb = vm.shared_tensor(vm.float16, [bk, bn])
    acc = vm.register_tensor(vm.float32, [bm, bn], init=0.0)
    for kk in vm.range(vm.cdiv(k, bk), stages=stages):
        vm.copy_async(sa, ga, [row0, kk * bk])
        vm.copy_async(sb, gb, [kk * bk, col0])
        vm.commit_group()
        vm.wait_group(0)
        vm.sync()
        vm.dot(vm.load_shared(sa), vm.load_shared(sb), acc, out=acc)
        vm.sync()
    vm.store_global(gc, vm.cast(acc, vm.float16), [row0, col0])
    vm.free_shared(sa)
    vm.free_shared(sb)


@vm.program(warps=4)
def quant_matmul_no_layouts(m: vm.int32, n: vm.int32, k: vm.int32, x: vm.ptr[vm.float16],
                            w: vm.ptr[vm.uint8], scales: vm.ptr[vm.float16],
                            y: vm.ptr[vm.float16], wtype: vm.constexpr = vm.int4,
                            group: int = 64, bm: int = 32, bn: int = 64, bk: int = 64):
    bits = wtype.nbits
    vm.set_grid(vm.cdiv(n, bn), vm.cdiv(m, bm))
    gx = vm.global_view(x, [m, k])
    gw = vm.global_view(w, [n, k * bits // 8])
    gs = vm.global_view(scales, [n, k // group], strides=[1, n])
    gy = vm.global_view(y, [m, n])
    row0, col0 = vm.block_index(1) * bm, vm.block_index(0) * bn
    sx = vm.shared_tensor(vm.float16, [bm, bk])
    sw = vm.shared_tensor(vm.float16, [bn, bk])
    acc = vm.register_tensor(vm.float32, [bm, bn], init=0.0)
    for kk in vm.range(k // bk):
        vm.copy_async(sx, gx, [row0, kk * bk])
        vm.commit_group()
        packed = vm.load_global(gw, [col0, kk * bk * bits // 8], [bn, bk * bits // 8])
        q = vm.view(packed, wtype)
        scale = vm.load_global(gs, [col0, kk * bk // group], [bn, 1])
        vm.store_shared(sw, vm.cast(q, vm.float16) * scale)
        vm.wait_group(0)
        vm.sync()
        vm.dot(vm.load_shared(sx), vm.transpose(vm.load_shared(sw)), acc, out=acc)
        vm.sync()
    vm.store_global(gy, vm.cast(acc, vm.float16), [row0, col0])
    vm.free_shared(sx)
    vm.free_shared(sw)


def _register_tiles(program) -> list[RegisterTensor]:
    tiles = []
    for inst in program.instructions():
        for t in (inst.output(), *inst.operands()):
            if isinstance(t, RegisterTensor) and t not in tiles:
                tiles.append(t)
    return tiles


def _by_mnemonic(program, mnemonic):
    return [i for i in program.instructions() if i.mnemonic == mnemonic]


# ---------------------------------------------------------------------------------------
# end to end


@pytest.mark.parametrize("stages", [None, 2])
def test_matmul_without_layouts_matches_the_annotated_kernel(stages):
    m, n, k = 70, 90, 96  # ragged: masked copies and stores
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    got, want = np.zeros((m, n), np.float16), np.zeros((m, n), np.float16)
    lowvm.interpret(matmul_no_layouts, m, n, k, a, b, got, stages=stages)
    lowvm.interpret(matmul_f16, m, n, k, a, b, want, bm=64, bn=64, bk=32, stages=stages)
    assert np.array_equal(got, want)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(got - ref).max() < 0.05 * np.abs(ref).max()


def test_matmul_without_layouts_gets_mma_layouts_spread_over_m():
    program = matmul_no_layouts.build()
    assert all(t.layout is not None for t in _register_tiles(program))
    (dot,) = _by_mnemonic(program, "dot")
    want = block_mma_layouts(64, 64, 32, 4, 1, vm.float16)  # 4 warps fit along M = 64
    assert (dot.a.layout, dot.b.layout, dot.c.layout) == (want.a, want.b, want.c)
    (init,) = _by_mnemonic(program, "register_tensor")
    assert init.out is dot.out is dot.c  # the accumulator is one tile, substituted everywhere
    (cast,) = _by_mnemonic(program, "cast")
    assert cast.src is dot.out and cast.out.layout == want.c


@pytest.mark.parametrize("wtype,group", [(lowvm.int4, 64), (lowvm.int3, 128),
                                         (lowvm.float6_e3m2, 64), (lowvm.uint2, 64)])
def test_quant_matmul_without_layouts_matches_the_annotated_kernel(wtype, group):
    m, n, k = 20, 128, 256
    rng = np.random.default_rng(2)
    x = rng.standard_normal((m, k)).astype(np.float16)
    packed, scales = quantize_weights(rng.standard_normal((n, k)), wtype, group)
    got, want = np.zeros((m, n), np.float16), np.zeros((m, n), np.float16)
    lowvm.interpret(quant_matmul_no_layouts, m, n, k, x, packed, scales, got, wtype=wtype,
                    group=group)
    lowvm.interpret(quant_matmul, m, n, k, x, packed, scales, want, wtype=wtype, group=group)
    assert np.array_equal(got, want)
    assert np.abs(got).max() > 0


def test_quant_matmul_weight_chain_gets_the_hand_written_layouts():
    """The default byte layout, its view, the cast and the broadcast scale are exactly
    the layouts the annotated kernel spells out (2 threads per row of 64)."""
    program = quant_matmul_no_layouts.build(wtype=lowvm.int4)
    packed, scale = (i.out for i in _by_mnemonic(program, "load_global"))
    (view,) = _by_mnemonic(program, "view")
    assert packed.layout == spatial(64, 2).local(1, 16)
    assert view.out.layout == spatial(64, 2).local(1, 32)
    assert scale.layout == reduce(spatial(64, 2).local(1, 32), [1], keepdims=True)
    lay = block_mma_layouts(32, 64, 64, 2, 2, vm.float16)  # M = 32 takes 2 warps
    (dot,) = _by_mnemonic(program, "dot")
    assert (dot.a.layout, dot.b.layout) == (lay.a, lay.b)
    (perm,) = _by_mnemonic(program, "permute")
    assert perm.src.layout == permute(lay.b, [1, 0])  # propagated backwards to the load


@needs_nvcc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("template,constants", [
    (matmul_no_layouts, {}),
    (matmul_no_layouts, {"stages": 3}),
    (quant_matmul_no_layouts, {"wtype": lowvm.int4}),
    (quant_matmul_no_layouts, {"wtype": lowvm.int3, "group": 128}),
])
def test_programs_without_layouts_compile(template, constants, arch, request):
    from lowvm.runtime import resource_usage

    if template is quant_matmul_no_layouts and arch == "sm_90" and "group" not in constants:
        # measured exception, kept visible (strict: fails once fixed); as test_codegen's
        # KNOWN_SPILLS entry for the laid-out example
        request.applymarker(pytest.mark.xfail(strict=True, reason=(
            "ptxas for sm_90 fits the example GEMM in 40 registers by spilling its K-loop "
            "bound (4 bytes) since the related shared addresses; __launch_bounds__(128, 1) "
            "gives 80 registers and no spill, sm_80 64 and none")))
    cuda = generate_cuda(template.build(**constants))
    usage = resource_usage(cuda.source, arch)[cuda.kernel_name]
    assert usage["registers"] > 0
    assert usage["spill_store_bytes"] == 0 and usage["stack_bytes"] == 0, usage


@pytest.mark.gpu
def test_quant_matmul_without_layouts_on_the_gpu():
    import torch

    m, n, k = 16, 256, 512
    rng = np.random.default_rng(3)
    x = rng.standard_normal((m, k)).astype(np.float16)
    packed, scales = quantize_weights(rng.standard_normal((n, k)), lowvm.int4, 64)
    want = np.zeros((m, n), np.float16)
    lowvm.interpret(quant_matmul_no_layouts, m, n, k, x, packed, scales, want)
    kernel = lowvm.compile(quant_matmul_no_layouts)
    args = [torch.from_numpy(v).cuda() for v in (x, packed, scales)]
    y = torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda")
    kernel(m, n, k, *args, y)
    torch.cuda.synchronize()
    out = y.cpu().numpy().astype(np.float64)
    ref = want.astype(np.float64)
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 1e-3


# ---------------------------------------------------------------------------------------
# annotated programs are left alone


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_annotated_programs_are_unchanged(name):
    template, constants = EXAMPLES[name]
    program = template.build(**constants)
    assert infer_layouts(program) is program


def test_annotated_tiles_keep_their_objects_and_layouts():
    lay = spatial(32).local(4)

    @vm.program(warps=1)
    def partly(x: vm.ptr[vm.float32], y: vm.ptr[vm.float32]):
        vm.set_grid(1)
        gx, gy = vm.global_view(x, [128]), vm.global_view(y, [128])
        a = vm.load_global(gx, [0], [128], lay)
        b = vm.load_global(gx, [0], [128])            # inferred: a's layout
        vm.store_global(gy, a * b)

    program = partly.build()
    loads = _by_mnemonic(program, "load_global")
    assert loads[0].out.layout is lay  # the very object the author wrote
    assert loads[1].out.layout == lay
    (mul,) = _by_mnemonic(program, "elementwise")
    assert mul.args[0] is loads[0].out and mul.args[1] is loads[1].out


# ---------------------------------------------------------------------------------------
# the default load layout


@pytest.mark.parametrize("shape,dtype,threads", [
    ((64, 32), lowvm.uint8, 128), ((64, 64), lowvm.float16, 128), ((512,), lowvm.float32, 128),
    ((1, 4096), lowvm.float16, 256), ((8, 64), lowvm.float16, 128), ((16, 128), lowvm.int8, 64),
])
def test_default_layout_gives_each_thread_contiguous_runs(shape, dtype, threads):
    lay = default_layout(shape, dtype, threads)
    assert lay.shape == shape and lay.num_threads == threads
    run = min(16 // (dtype.nbits // 8), shape[-1])
    while lay.size // run < threads:  # small tiles: shorter runs, every thread busy
        run //= 2
    assert lay.replication == 1
    table = lay.table
    step = np.zeros(len(shape), dtype=np.int64)
    step[-1] = 1
    for t in range(threads):
        for start in range(0, lay.local_size, run):
            chunk = table[t, start:start + run]
            assert chunk[0][-1] % run == 0  # aligned to the run
            assert (np.diff(chunk, axis=0) == step).all(), (t, start, chunk)
    # neighbouring threads of a warp hold neighbouring runs of a row: coalesced access
    same_row = 0
    for t in range(min(32, threads) - 1):
        if (table[t, 0, :-1] == table[t + 1, 0, :-1]).all():
            same_row += 1
            assert table[t + 1, 0, -1] - table[t, 0, -1] == run
    assert same_row >= min(32, threads) // 2 - 1


def test_default_layout_replicates_tiles_smaller_than_the_block():
    lay = default_layout((64, 1), lowvm.float16, 128)
    assert lay.num_threads == 128 and lay.replication == 2
    assert sorted(lay.owners((5, 0))) == [(5, 0), (69, 0)]


def test_default_layout_respects_the_granule_of_a_view():
    # 24 bytes a row: 16-byte runs do not divide it; 3-bit values need runs of 3 bytes
    lay = default_layout((64, 24), lowvm.uint8, 128, granule=3)
    assert lay == spatial(64, 2).local(1, 12)
    assert view_layout(lay, 8, 3, (64, 64)) == spatial(64, 2).local(1, 32)


def test_a_load_nothing_constrains_gets_the_default_layout():
    @vm.program(warps=4)
    def add(n: vm.int32, a: vm.ptr[vm.float32], b: vm.ptr[vm.float32], c: vm.ptr[vm.float32]):
        vm.set_grid(vm.cdiv(n, 1024))
        ga, gb, gc = (vm.global_view(p, [n]) for p in (a, b, c))
        start = [vm.block_index() * 1024]
        vm.store_global(gc, vm.load_global(ga, start, [1024]) + vm.load_global(gb, start, [1024]),
                        start)

    program = add.build()
    for load in _by_mnemonic(program, "load_global"):
        assert load.out.layout == local(2).spatial(128).local(4)  # 16-byte runs, 2 per thread
    a, b = np.random.default_rng(4).random((2, 3000)).astype(np.float32)
    c = np.zeros(3000, np.float32)
    lowvm.interpret(add, 3000, a, b, c)
    assert np.array_equal(c, a + b)


# ---------------------------------------------------------------------------------------
# rules


def test_view_layout_rescales_the_innermost_run_both_ways():
    src = local(2, 1).spatial(16, 8).local(1, 4)  # 4 bytes a run
    assert view_layout(src, 8, 4, (32, 64)) == local(2, 1).spatial(16, 8).local(1, 8)
    assert view_layout(view_layout(src, 8, 4, (32, 64)), 4, 8, (32, 32)) == src
    assert view_layout(src, 8, 3, (32, 85)) is None  # 32 bits are not whole 3-bit values
    # the innermost local digit runs down the rows: a thread's bytes are not a row run,
    # so each byte becomes a new innermost run of two nibbles (none to widen back)
    split = view_layout(spatial(16, 4).column_local(2, 2), 8, 4, (32, 16))
    assert split == spatial(16, 4).column_local(2, 2).local(1, 2)
    assert view_layout(spatial(16, 4).column_local(2, 2), 4, 8, (32, 4)) is None
    # one byte per thread (no local digit): two nibbles each
    assert view_layout(spatial(4, 16), 8, 4, (4, 32)) == spatial(4, 16).local(1, 2)


def test_mma_candidates_prefer_warps_along_m_and_the_int8_k32_atom():
    first = next(mma_candidates(64, 64, 32, lowvm.float16, 4))
    assert (first.atom, first.warps_m, first.warps_n) == ("m16n8k16", 4, 1)
    first = next(mma_candidates(32, 64, 32, lowvm.float16, 4))
    assert (first.warps_m, first.warps_n) == (2, 2)
    first = next(mma_candidates(64, 64, 64, lowvm.int8, 4))
    assert first.atom == "m16n8k32"
    first = next(mma_candidates(64, 64, 16, lowvm.int8, 4))  # K too short for k32
    assert first.atom == "m16n8k16"
    assert list(mma_candidates(16, 8, 16, lowvm.float16, 4)) == []


def test_int8_dot_without_layouts():
    @vm.program(warps=2)
    def idot(a: vm.ptr[vm.int8], b: vm.ptr[vm.int8], c: vm.ptr[vm.int32]):
        vm.set_grid(1)
        ga, gb, gc = vm.global_view(a, [32, 64]), vm.global_view(b, [64, 16]), \
            vm.global_view(c, [32, 16])
        acc = vm.register_tensor(vm.int32, [32, 16])
        out = vm.dot(vm.load_global(ga, [0, 0], [32, 64]), vm.load_global(gb, [0, 0], [64, 16]),
                     acc)
        vm.store_global(gc, out, [0, 0])

    program = idot.build()
    (dot,) = _by_mnemonic(program, "dot")
    assert dot.c.layout == block_mma_layouts(32, 16, 64, 2, 1, vm.int8, "m16n8k32").c
    rng = np.random.default_rng(5)
    a = rng.integers(-128, 128, (32, 64)).astype(np.int8)
    b = rng.integers(-128, 128, (64, 16)).astype(np.int8)
    c = np.zeros((32, 16), np.int32)
    lowvm.interpret(idot, a, b, c)
    assert np.array_equal(c, a.astype(np.int64) @ b.astype(np.int64))


def test_reduce_and_permute_propagate():
    @vm.program(warps=1)
    def rows(x: vm.ptr[vm.float32], y: vm.ptr[vm.float32]):
        vm.set_grid(1)
        gx, gy = vm.global_view(x, [16, 32]), vm.global_view(y, [16])
        t = vm.transpose(vm.load_global(gx, [0, 0], [16, 32]))   # [32, 16]
        vm.store_global(gy, vm.sum(t, 0))

    program = rows.build()
    (load,) = _by_mnemonic(program, "load_global")
    (perm,) = _by_mnemonic(program, "permute")
    (red,) = _by_mnemonic(program, "reduce")
    assert perm.out.layout == permute(load.out.layout, [1, 0])
    assert red.out.layout == reduce(perm.out.layout, [0])
    x = np.random.default_rng(6).random((16, 32)).astype(np.float32)
    y = np.zeros(16, np.float32)
    lowvm.interpret(rows, x, y)
    assert np.allclose(y, x.sum(axis=1), rtol=1e-6)


def test_tiles_print_as_unknown_before_inference_and_checks_wait():
    seen = {}

    @vm.program(warps=1)
    def probe(x: vm.ptr[vm.float32]):
        vm.set_grid(1)
        t = vm.load_global(vm.global_view(x, [64]), [0], [64])
        seen["text"] = t.type_str()
        vm.store_global(vm.global_view(x, [64]), vm.cast(t, vm.float32))

    probe.build()
    assert seen["text"] == "float32[64] <layout to infer>"


# ---------------------------------------------------------------------------------------
# errors


def _line_of(fn, needle: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if needle in line)


def _conflict_program():
    @vm.program(warps=1)
    def conflict(x: vm.ptr[vm.float32], y: vm.ptr[vm.float32]):
        vm.set_grid(1)
        gx, gy = vm.global_view(x, [128]), vm.global_view(y, [128])
        t = vm.load_global(gx, [0], [128])
        p = vm.register_tensor(vm.float32, [128], vm.spatial(32).local(4))
        q = vm.register_tensor(vm.float32, [128], vm.local(4).spatial(32))
        first = t + p  # wants spatial(32).local(4) for t
        second = q * t  # wants local(4).spatial(32) for t
        vm.store_global(gy, first)
        vm.store_global(gy, second)

    return conflict


def test_conflict_names_both_instructions_lines_and_layouts():
    template = _conflict_program()
    with pytest.raises(ProgramError) as info:
        template.build()
    text = str(info.value)
    line_a = _line_of(template.fn, "first = t + p")
    line_b = _line_of(template.fn, "second = q * t")
    assert f":{line_a}: first = t + p" in text and f":{line_b}: second = q * t" in text
    assert "spatial(32).local(4)" in text and "local(4).spatial(32)" in text
    assert "conflict" in text and info.value.loc.lineno == line_b


def test_dot_operand_fixed_elsewhere_conflicts_with_the_mma_layout():
    @vm.program(warps=4)
    def bad(a: vm.ptr[vm.float16], c: vm.ptr[vm.float32]):
        vm.set_grid(1)
        ga, gc = vm.global_view(a, [64, 64]), vm.global_view(c, [64, 64])
        x = vm.load_global(ga, [0, 0], [64, 64])
        fixed = vm.register_tensor(vm.float16, [64, 64], vm.spatial(64, 2).local(1, 32))
        vm.assign(fixed, x)  # x must have fixed's layout
        acc = vm.register_tensor(vm.float32, [64, 64])
        out = vm.dot(x, vm.load_global(ga, [0, 0], [64, 64]), acc)  # x: an MMA A layout
        vm.store_global(gc, out, [0, 0])

    with pytest.raises(ProgramError) as info:
        bad.build()
    text = str(info.value)
    assert "no block-MMA layout" in text and "spatial(64, 2).local(1, 32)" in text
    assert f":{_line_of(bad.fn, 'vm.assign(fixed, x)')}:" in text
    assert f":{_line_of(bad.fn, 'out = vm.dot(x')}:" in text


def test_dot_that_no_mma_tiling_fits_is_refused():
    @vm.program(warps=4)
    def tiny(a: vm.ptr[vm.float16], c: vm.ptr[vm.float32]):
        vm.set_grid(1)
        ga, gc = vm.global_view(a, [16, 16]), vm.global_view(c, [16, 8])
        x = vm.load_global(ga, [0, 0], [16, 16])
        w = vm.load_global(ga, [0, 0], [16, 8])
        vm.store_global(gc, vm.dot(x, w, vm.register_tensor(vm.float32, [16, 8])))

    with pytest.raises(ProgramError, match=r"cannot choose MMA layouts for \[16, 16\] @ "
                                           r"\[16, 8\].*4 warps"):
        tiny.build()


def test_view_of_a_strided_run_is_refused_with_the_line():
    @vm.program(warps=1)
    def v(x: vm.ptr[vm.uint8], y: vm.ptr[vm.float32]):
        vm.set_grid(1)
        raw = vm.load_global(vm.global_view(x, [4, 32]), [0, 0], [4, 32],
                             vm.column_local(4, 1).spatial(1, 32))  # each thread: a column
        bits = vm.view(raw, vm.int4, shape=[8, 32])
        vm.store_global(vm.global_view(y, [8, 32]), vm.cast(bits, vm.float32))

    with pytest.raises(ProgramError, match="cannot infer the layout") as info:
        v.build()
    assert info.value.loc.lineno == _line_of(v.fn, "bits = vm.view(raw")


def test_documented_program_without_layouts_runs():
    from pathlib import Path

    readme = Path(__file__).resolve().parents[2] / "docs" / "language.md"
    section = readme.read_text().split("### Leaving layouts out", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    assert not any(word in code for word in ("layout=", "vm.spatial", "vm.local", "mma_layouts"))
    namespace: dict = {"__name__": "readme_layouts"}
    exec(compile(code, str(readme), "exec"), namespace)  # asserts inside the example
    program = namespace["matmul"].build()
    assert all(t.layout is not None for t in _register_tiles(program))


@pytest.mark.parametrize("wtype", ["int3", "uint6", "int4"])
def test_viewed_load_keeps_its_natural_meaning_beside_an_accumulator(wtype):
    """The packed bytes a view reads get their layout before an accumulator's default
    (which would force a view that keeps only the bit count: int3 values in another
    order, or no whole values per thread for uint6)."""
    dt = lowvm.dtype(wtype)
    rows, cols = (16, 64) if wtype == "int3" else (4, 32)
    nbytes = cols * dt.nbits // 8

    @vm.program(warps=4 if wtype == "int3" else 2)
    def running_max(x: vm.ptr[vm.uint8], y: vm.ptr[vm.float32]):
        vm.set_grid(1)
        gx, gy = vm.global_view(x, [rows, nbytes]), vm.global_view(y, [rows, cols])
        acc = vm.register_tensor(vm.float32, [rows, cols], init=-100.0)
        values = vm.view(vm.load_global(gx, [0, 0], [rows, nbytes]), dt)
        vm.maximum(acc, vm.cast(values, vm.float32), out=acc)
        vm.store_global(gy, acc, [0, 0])

    codes = np.random.default_rng(1).integers(0, 2**dt.nbits, (rows, cols)).astype(np.uint8)
    x = np.stack([lowvm.dtypes.pack(r, dt) for r in codes])
    y = np.zeros((rows, cols), np.float32)
    lowvm.interpret(running_max, x, y)
    assert np.array_equal(y, lowvm.dtypes.decode(codes, dt))


def test_default_runs_hold_whole_values_for_a_view_after_a_cast():
    """An int32 tile of one value per thread by default, cast to uint4 and stored as
    bytes: its default runs must hold whole bytes of the view two instructions later."""

    @vm.program(warps=1)
    def narrow(x: vm.ptr[vm.int32], y: vm.ptr[vm.uint8]):
        vm.set_grid(1)
        values = vm.load_global(vm.global_view(x, [1, 32]), [0, 0], [1, 32])
        packed = vm.view(vm.cast(values, vm.uint4), vm.uint8)
        vm.store_global(vm.global_view(y, [1, 16]), packed, [0, 0])

    x = np.random.default_rng(2).integers(-3, 20, (1, 32)).astype(np.int32)
    y = np.zeros((1, 16), np.uint8)
    lowvm.interpret(narrow, x, y)
    codes = lowvm.dtypes.encode(x, lowvm.uint4)
    assert np.array_equal(y[0], lowvm.dtypes.pack(codes, lowvm.uint4))
