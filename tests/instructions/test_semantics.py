"""Each VM instruction's meaning, checked through small programs run in the interpreter.

Every test builds a ``@vm.program``, runs it on numpy arrays (or CPU torch tensors) with
``lowvm.interpret`` and compares the result with numpy. Tiles are spread over one warp
unless a test says otherwise.
"""

import shutil

import ml_dtypes
import numpy as np
import pytest
import torch

import lowvm
import lowvm.lang as vm
from lowvm.dtypes import all_dtypes, decode, pack, round_to, unpack
from lowvm.layouts import compose, concat, permute, reduce

RNG = np.random.default_rng(2026)

#: a [16, 8] tile over one warp: thread (r, c) of an 8x4 grid holds a 2x2 block
L16x8 = vm.spatial(8, 4).local(2, 2)
#: its [16, 1] column (replicated over the 4 threads of a row) and [1, 8] row
L16x1 = reduce(L16x8, [1], keepdims=True)
L1x8 = reduce(L16x8, [0], keepdims=True)


def f32(*shape, scale=4.0):
    """Random float32 values."""
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------------------------------
# load_global / store_global


@vm.program(warps=4)
def copy_1d(n: vm.int32, x: vm.ptr[vm.float32], y: vm.ptr[vm.float32],
            z: vm.ptr[vm.float32], block: int = 256):
    """y = 2 x over [n]; z receives the raw loaded tile over the whole grid (zeros past n)."""
    vm.set_grid(vm.cdiv(n, block))
    gx = vm.global_view(x, [n])
    gy = vm.global_view(y, [n])
    gz = vm.global_view(z, [vm.cdiv(n, block) * block])
    off = [vm.block_index() * block]
    t = vm.load_global(gx, off, [block], vm.spatial(128).local(block // 128))
    vm.store_global(gy, t * 2.0, off)
    vm.store_global(gz, t, off)


@pytest.mark.parametrize("n", [1, 255, 257, 1000])
def test_load_store_global_1d_masks_out_of_bounds(n):
    x = f32(n)
    sentinel = np.float32(-7.0)
    y = np.full(n + 37, sentinel, np.float32)  # the view covers only the first n
    grid = -(-n // 256)
    z = np.full(grid * 256, sentinel, np.float32)
    lowvm.interpret(copy_1d, n, x, y, z)
    np.testing.assert_array_equal(y[:n], 2 * x)
    np.testing.assert_array_equal(y[n:], sentinel)  # stores outside the view are skipped
    np.testing.assert_array_equal(z[:n], x)
    np.testing.assert_array_equal(z[n:], 0)  # loads outside the view give 0


@vm.program(warps=1)
def copy_2d(m: vm.int32, n: vm.int32, ld: vm.int32, x: vm.ptr[vm.float32],
            y: vm.ptr[vm.float32]):
    """y (column-major [m, n]) = x (row-major [m, n] with row pitch ld) + 1, by 16x8 tiles."""
    vm.set_grid(vm.cdiv(n, 8), vm.cdiv(m, 16))
    gx = vm.global_view(x, [m, n], strides=[ld, 1])
    gy = vm.global_view(y, [m, n], strides=[1, m])
    off = [vm.block_index(1) * 16, vm.block_index(0) * 8]
    t = vm.load_global(gx, off, [16, 8], L16x8)
    vm.store_global(gy, t + 1.0, off)


@pytest.mark.parametrize("m, n", [(16, 8), (37, 19), (5, 3)])
def test_load_store_global_2d_strides_and_masks(m, n):
    ld = n + 5
    x = f32(m, ld)
    x[:, n:] = np.nan  # padding: must never be read
    y = np.full(m * n + 3, -1.0, np.float32)
    lowvm.interpret(copy_2d, m, n, ld, x.reshape(-1), y)
    got = y[: m * n].reshape(n, m).T  # column-major
    np.testing.assert_array_equal(got, x[:, :n] + 1)
    np.testing.assert_array_equal(y[m * n:], -1.0)


@vm.program(warps=1)
def shifted(x: vm.ptr[vm.int32], y: vm.ptr[vm.int32], shift: vm.int32):
    """y[i] = x[i - shift] (0 where i - shift is outside x)."""
    vm.set_grid(1)
    gx = vm.global_view(x, [20])
    gy = vm.global_view(y, [32])
    t = vm.load_global(gx, [0 - shift], [32], vm.spatial(32))
    vm.store_global(gy, t)


@pytest.mark.parametrize("shift", [3, -5, 40])
def test_load_global_negative_and_far_offsets_read_zero(shift):
    x = np.arange(1, 21, dtype=np.int32)
    y = np.full(32, 99, np.int32)
    lowvm.interpret(shifted, x, y, shift)
    src = np.arange(32) - shift
    expected = np.where((src >= 0) & (src < 20), np.take(x, np.clip(src, 0, 19)), 0)
    np.testing.assert_array_equal(y, expected)


@vm.program(warps=1)
def asserted_inside(x: vm.ptr[vm.int32], y: vm.ptr[vm.int32], start: vm.int32,
                    per_thread: int = 1):
    """y = x[start : start + 32 * per_thread], the load asserted in bounds."""
    vm.set_grid(1)
    size = 32 * per_thread
    t = vm.load_global(vm.global_view(x, [2 * size]), [start], [size],
                       vm.spatial(32).local(per_thread), inbounds=True)
    vm.store_global(vm.global_view(y, [size]), t)


@pytest.mark.parametrize("per_thread", [1, 4])  # scalar and 16-byte vector loads
def test_inbounds_loads_skip_the_test_in_cuda_and_are_checked_by_the_interpreter(per_thread):
    from lowvm.driver import generate_cuda
    from lowvm.errors import LowvmError

    size = 32 * per_thread
    program = asserted_inside.build(per_thread=per_thread)
    x = np.arange(2 * size, dtype=np.int32)
    y = np.zeros(size, np.int32)
    lowvm.interpret(program, x, y, size)
    np.testing.assert_array_equal(y, x[size:])
    with pytest.raises(LowvmError, match=rf"inbounds=True.*offsets \[{size + 8}\].*"
                                         rf"shape \[{2 * size}\]"):
        lowvm.interpret(program, x, y, size + 8)
    load = [line for line in generate_cuda(program).source.splitlines()
            if "x[" in line and "=" in line]
    assert load and not any("?" in line for line in load), load  # no bounds test
    plain = generate_cuda(shifted.build()).source  # the default keeps it
    assert any("?" in line for line in plain.splitlines() if "x[" in line)


@vm.program(warps=2)
def prefetched(n: vm.int32, rows: vm.int32, x: vm.ptr[vm.uint8], y: vm.ptr[vm.uint8]):
    """y = x, with the next rows of x asked into the L2 first (past the end: skipped)."""
    vm.set_grid(1)
    gx = vm.global_view(x, [rows, 16])
    vm.prefetch_l2(gx, [n, 0], [256, 16])  # whole rows: one run of 4 KB
    vm.prefetch_l2(vm.global_view(x, [rows * 16]), [n * 16 + 8], [100])  # unaligned part
    t = vm.load_global(gx, [0, 0], [64, 16], vm.spatial(64, 1).local(1, 16))
    vm.store_global(vm.global_view(y, [64, 16]), t)


def test_prefetch_l2_changes_nothing_and_asks_each_sector_once():
    from lowvm.driver import generate_cuda

    x = np.arange(64 * 16, dtype=np.uint8)
    y = np.zeros_like(x)
    lowvm.interpret(prefetched, 32, 64, x, y)  # the prefetched rows run past the end
    np.testing.assert_array_equal(y, x)
    src = generate_cuda(prefetched.build()).source
    assert src.count('asm volatile("prefetch.global.L2 [%0];"') == 2
    # 4 KB of whole 16-byte rows: 128 sectors of 32 bytes, not one per row (256)
    assert "for (int e = tid; e < 128; e += 64)" in src
    assert "for (int e = tid; e < 4; e += 64)" in src  # 100 bytes: 4 sectors
    # sm_90: the 4 KB run is one bulk prefetch; the 100-byte run is not whole 16-byte
    # chunks, so it keeps the sector loop only
    assert src.count("cp.async.bulk.prefetch.L2.global [%0], 4096;") == 1
    assert src.count("#if __CUDA_ARCH__ >= 900") == 1
    with pytest.raises(lowvm.ProgramError, match="prefetch_l2: shape \\[4\\] has rank 1"):
        @vm.program(warps=1)
        def wrong_rank(x: vm.ptr[vm.uint8]):
            vm.prefetch_l2(vm.global_view(x, [4, 4]), [0, 0], [4])
        wrong_rank.build()


def test_prefetch_l2_of_strided_rows_is_never_one_bulk_run():
    """A row whose elements are not adjacent (a transposed view) is not a contiguous run:
    it keeps the per-sector prefetches on every GPU."""
    from lowvm.driver import generate_cuda

    @vm.program(warps=1)
    def strided(x: vm.ptr[vm.float16]):
        vm.set_grid(1)
        vm.prefetch_l2(vm.global_view(x, [64, 64], [1, 64]), [0, 0], [4, 64])
    src = generate_cuda(strided.build()).source
    assert "cp.async.bulk.prefetch" not in src and "prefetch.global.L2" in src


# ---------------------------------------------------------------------------------------
# register_tensor, thread_index, let


@vm.program(warps=1)
def fills(v: vm.int32, a: vm.ptr[vm.float32], b: vm.ptr[vm.int8], c: vm.ptr[vm.float16],
          d: vm.ptr[vm.int32]):
    """Register tiles initialised from constants and a runtime scalar."""
    vm.set_grid(1)
    lay = vm.spatial(32).local(2)
    vm.store_global(vm.global_view(a, [64]), vm.register_tensor(vm.float32, [64], lay, 1.5))
    vm.store_global(vm.global_view(b, [64]), vm.register_tensor(vm.int8, [64], lay, -3))
    vm.store_global(vm.global_view(c, [64]), vm.register_tensor(vm.float16, [64], lay, 0.1))
    vm.store_global(vm.global_view(d, [64]), vm.register_tensor(vm.int32, [64], lay, v * 2))


def test_register_tensor_init():
    a, b = np.zeros(64, np.float32), np.zeros(64, np.int8)
    c, d = np.zeros(64, np.float16), np.zeros(64, np.int32)
    lowvm.interpret(fills, 21, a, b, c, d)
    assert np.all(a == 1.5) and np.all(b == -3) and np.all(d == 42)
    assert np.all(c == np.float16(0.1))  # rounded to float16


@vm.program(warps=2)
def thread_ids(y: vm.ptr[vm.int32]):
    """y[t] = 3 t + block offset, through thread_index and a let-bound scalar."""
    vm.set_grid(2)
    base = vm.let(vm.block_index() * 64, "base")
    t = vm.thread_index()
    vm.store_global(vm.global_view(y, [128]), t * 3 + base, [base])


def test_thread_index_and_let():
    y = np.zeros(128, np.int32)
    lowvm.interpret(thread_ids, y)
    expected = np.concatenate([np.arange(64) * 3, np.arange(64) * 3 + 64])
    np.testing.assert_array_equal(y, expected)
    text = str(thread_ids.build())
    assert "thread_index" in text and "base" in text


# ---------------------------------------------------------------------------------------
# view


def _view_program(src_dt, src_n, src_local, dst_dt, dst_local, store_dt):
    """Load src_n src_dt values (spatial(32).local(src_local)), view as dst_dt and store."""
    dst_n = 32 * dst_local

    @vm.program(warps=1)
    def prog(x: vm.ptr[src_dt], y: vm.ptr[store_dt]):
        vm.set_grid(1)
        t = vm.load_global(vm.global_view(x, [src_n]), [0], [src_n],
                           vm.spatial(32).local(src_local))
        v = vm.view(t, dst_dt, vm.spatial(32).local(dst_local))
        if dst_dt != store_dt:
            v = vm.cast(v, store_dt)
        vm.store_global(vm.global_view(y, [dst_n]), v)

    return prog


def test_view_uint8_as_int4_low_nibble_first():
    raw = RNG.integers(0, 256, 128, dtype=np.uint8)
    out = np.zeros(256, np.int8)
    lowvm.interpret(_view_program(vm.uint8, 128, 4, vm.int4, 8, vm.int8), raw, out)
    np.testing.assert_array_equal(out, decode(unpack(raw, vm.int4, 256), vm.int4))
    # the explicit nibble rule: local 2i = low nibble of byte i, 2i+1 = high nibble
    low = (raw & 0xF).astype(np.int8)
    high = (raw >> 4).astype(np.int8)
    np.testing.assert_array_equal(out[0::2], np.where(low > 7, low - 16, low))
    np.testing.assert_array_equal(out[1::2], np.where(high > 7, high - 16, high))


def test_view_int3_three_bytes_per_thread_is_eight_values():
    raw = RNG.integers(0, 256, 96, dtype=np.uint8)
    out = np.zeros(256, np.int8)
    lowvm.interpret(_view_program(vm.uint8, 96, 3, vm.int3, 8, vm.int8), raw, out)
    np.testing.assert_array_equal(out, decode(unpack(raw, vm.int3, 256), vm.int3))
    # round trip: packing the codes of the values gives the bytes back
    np.testing.assert_array_equal(pack(lowvm.dtypes.encode(out, vm.int3), vm.int3), raw)


def test_view_uint8_as_e2m1_then_cast():
    raw = RNG.integers(0, 256, 64, dtype=np.uint8)
    out = np.zeros(128, np.float32)
    lowvm.interpret(_view_program(vm.uint8, 64, 2, vm.float4_e2m1, 4, vm.float32), raw, out)
    np.testing.assert_array_equal(out, decode(unpack(raw, vm.float4_e2m1, 128),
                                              vm.float4_e2m1))


def test_view_float16_to_uint8_and_back():
    x = f32(64).astype(np.float16)
    as_bytes = np.zeros(128, np.uint8)
    lowvm.interpret(_view_program(vm.float16, 64, 2, vm.uint8, 4, vm.uint8), x, as_bytes)
    np.testing.assert_array_equal(as_bytes, x.view(np.uint8))
    back = np.zeros(64, np.float16)
    lowvm.interpret(_view_program(vm.uint8, 128, 4, vm.float16, 2, vm.float16), as_bytes, back)
    np.testing.assert_array_equal(back.view(np.uint16), x.view(np.uint16))


# ---------------------------------------------------------------------------------------
# cast


def _cast_program(dt):
    @vm.program(warps=1)
    def prog(x: vm.ptr[vm.float32], y: vm.ptr[vm.float32]):
        vm.set_grid(1)
        lay = vm.spatial(32).local(8)
        t = vm.load_global(vm.global_view(x, [256]), [0], [256], lay)
        vm.store_global(vm.global_view(y, [256]), vm.cast(vm.cast(t, dt), vm.float32))

    return prog


SMALL_AND_HALF = [d for d in all_dtypes() if d.nbits <= 8] + [vm.float16, vm.bfloat16]


@pytest.mark.parametrize("dt", SMALL_AND_HALF, ids=lambda d: d.name)
def test_cast_f32_to_type_and_back_is_round_to(dt):
    hi = min(dt.max_value * 1.5, 1e5)
    x = np.concatenate([
        RNG.uniform(-hi, hi, 200),
        [0.0, -0.0, 0.5, 1.5, 2.5, -2.5, dt.max_value, -dt.max_value, hi, -hi],
        RNG.standard_normal(46) * 0.1,
    ]).astype(np.float32)
    y = np.zeros(256, np.float32)
    lowvm.interpret(_cast_program(dt), x, y)
    np.testing.assert_array_equal(y, round_to(x, dt).astype(np.float32))


@pytest.mark.parametrize("dt, values, expected", [
    (vm.int4, [2.5, 3.5, -2.5, 100.0, -100.0, 0.49], [2, 4, -2, 7, -8, 0]),
    (vm.uint2, [-1.0, 0.5, 1.5, 9.0, 2.4, 2.6], [0, 0, 2, 3, 2, 3]),
    (vm.float4_e2m1, [0.25, 0.75, 5.0, 7.0, -100.0, 2.5], [0.0, 1.0, 4.0, 6.0, -6.0, 2.0]),
])
def test_cast_rounds_half_to_even_and_saturates(dt, values, expected):
    x = np.zeros(256, np.float32)
    x[: len(values)] = values
    y = np.zeros(256, np.float32)
    lowvm.interpret(_cast_program(dt), x, y)
    np.testing.assert_array_equal(y[: len(values)], expected)


@pytest.mark.parametrize("dt, reference", [
    (vm.float16, np.float16),
    (vm.bfloat16, ml_dtypes.bfloat16),
    (vm.float8_e4m3, ml_dtypes.float8_e4m3fn),
    (vm.float8_e5m2, ml_dtypes.float8_e5m2),
])
def test_cast_matches_ml_dtypes_in_range(dt, reference):
    x = (RNG.standard_normal(256) * 20).astype(np.float32)
    y = np.zeros(256, np.float32)
    lowvm.interpret(_cast_program(dt), x, y)
    np.testing.assert_array_equal(y, x.astype(reference).astype(np.float32))


# ---------------------------------------------------------------------------------------
# elementwise


def _ew_program(dt, fn, out_dt=None, warps=1, layout=L16x8):
    """out = fn(a, b, c, s, k) over [16, 8] tiles; s is a float32 and k an int32 scalar."""
    out_dt = out_dt or dt

    @vm.program(warps=warps)
    def prog(a: vm.ptr[dt], b: vm.ptr[dt], c: vm.ptr[dt], out: vm.ptr[out_dt],
             s: vm.float32, k: vm.int32):
        vm.set_grid(1)
        tiles = [vm.load_global(vm.global_view(p, [16, 8]), [0, 0], [16, 8], layout)
                 for p in (a, b, c)]
        r = fn(*tiles, s, k)
        vm.store_global(vm.global_view(out, [16, 8]), r, [0, 0])

    return prog


def _run_ew(fn, a, b, c, s=0.0, k=0, dt=vm.float32, out_dt=None):
    out_dt = out_dt or dt
    np_out = {vm.float32: np.float32, vm.float16: np.float16, vm.int32: np.int32,
              vm.int8: np.int8}[out_dt]
    out = np.zeros((16, 8), np_out)
    lowvm.interpret(_ew_program(dt, fn, out_dt), a, b, c, out, s, k)
    return out


FLOAT_OPS = [
    ("add", lambda a, b, c, s, k: a + b, lambda a, b, c: a + b),
    ("sub", lambda a, b, c, s, k: vm.sub(a, b), lambda a, b, c: a - b),
    ("mul", lambda a, b, c, s, k: a * b, lambda a, b, c: a * b),
    ("div", lambda a, b, c, s, k: a / b, lambda a, b, c: a / b),
    ("max", lambda a, b, c, s, k: vm.maximum(a, b), lambda a, b, c: np.maximum(a, b)),
    ("min", lambda a, b, c, s, k: vm.minimum(a, b), lambda a, b, c: np.minimum(a, b)),
    ("neg", lambda a, b, c, s, k: -a, lambda a, b, c: -a),
    ("abs", lambda a, b, c, s, k: abs(a), lambda a, b, c: np.abs(a)),
    ("exp", lambda a, b, c, s, k: vm.exp(a), lambda a, b, c: np.exp(a)),
    ("sqrt", lambda a, b, c, s, k: vm.sqrt(abs(a)), lambda a, b, c: np.sqrt(np.abs(a))),
    ("where", lambda a, b, c, s, k: vm.where(a > b, a, c), lambda a, b, c: np.where(a > b, a, c)),
    ("fma", lambda a, b, c, s, k: vm.fma(a, b, c), lambda a, b, c: a * b + c),
]


@pytest.mark.parametrize("name, fn, ref", FLOAT_OPS, ids=[o[0] for o in FLOAT_OPS])
def test_float32_elementwise_ops(name, fn, ref):
    a, b, c = f32(16, 8, scale=2), f32(16, 8, scale=2), f32(16, 8, scale=2)
    out = _run_ew(fn, a, b, c)
    expected = ref(*(v.astype(np.float64) for v in (a, b, c))).astype(np.float32)
    np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize("name, fn, ref", FLOAT_OPS, ids=[o[0] for o in FLOAT_OPS])
def test_float16_elementwise_rounds_like_numpy(name, fn, ref):
    a, b, c = (f32(16, 8, scale=3).astype(np.float16) for _ in range(3))
    out = _run_ew(fn, a, b, c, dt=vm.float16)
    # one rounding of the exact (float64) result, as the GPU's instruction does
    expected = ref(*(v.astype(np.float64) for v in (a, b, c))).astype(np.float16)
    np.testing.assert_array_equal(out.view(np.uint16), expected.view(np.uint16))
    if name in ("add", "sub", "mul", "div"):  # numpy's float16 arithmetic agrees
        np.testing.assert_array_equal(out, ref(a, b, c))


def test_float16_rounds_after_each_op():
    a, b, c = (f32(16, 8, scale=8).astype(np.float16) for _ in range(3))
    out = _run_ew(lambda a, b, c, s, k: (a * b + c) * a - b, a, b, c, dt=vm.float16)
    np.testing.assert_array_equal(out, (a * b + c) * a - b)  # numpy float16, op by op
    once = ((a.astype(np.float64) * b + c) * a - b).astype(np.float16)
    assert not np.array_equal(out, once)  # rounding only at the end would differ


def test_fma_rounds_once():
    a = np.full((16, 8), 1 + 3 * 2.0**-10, np.float16)
    c = np.full((16, 8), -1.0, np.float16)
    fused = _run_ew(lambda a, b, c, s, k: vm.fma(a, b, c), a, a, c, dt=vm.float16)
    split = _run_ew(lambda a, b, c, s, k: a * b + c, a, a, c, dt=vm.float16)
    exact = (1 + 3 * 2.0**-10) ** 2 - 1  # 6 * 2^-10 + 9 * 2^-20
    np.testing.assert_array_equal(fused, np.float16(exact))
    assert fused[0, 0] == 6 * 2.0**-10 + 2.0**-17
    np.testing.assert_array_equal(split, np.float16(6 * 2.0**-10))  # a*a rounded first
    assert fused[0, 0] != split[0, 0]


CMP = [("lt", vm.lt, np.less), ("le", vm.le, np.less_equal), ("gt", vm.gt, np.greater),
       ("ge", vm.ge, np.greater_equal), ("eq", vm.eq, np.equal), ("ne", vm.ne, np.not_equal)]


@pytest.mark.parametrize("name, op, ref", CMP, ids=[c[0] for c in CMP])
def test_comparisons_give_bool_tiles(name, op, ref):
    a = RNG.integers(-3, 4, (16, 8)).astype(np.float32)
    b = RNG.integers(-3, 4, (16, 8)).astype(np.float32)
    out = _run_ew(lambda a, b, c, s, k: vm.cast(op(a, b), vm.float32), a, b, a)
    np.testing.assert_array_equal(out, ref(a, b).astype(np.float32))
    out2 = _run_ew(lambda a, b, c, s, k: vm.where(op(a, 0.0), a, b), a, b, a)
    np.testing.assert_array_equal(out2, np.where(ref(a, 0.0), a, b))


def test_scalar_operands_python_and_runtime():
    a, b = f32(16, 8), f32(16, 8)
    out = _run_ew(lambda a, b, c, s, k: (a * 2.5 - 1) / s + k + (3 - b), a, b, a, s=0.75, k=-4)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    r = ((a64 * 2.5).astype(np.float32).astype(np.float64) - 1).astype(np.float32)
    r = (r.astype(np.float64) / 0.75).astype(np.float32)
    r = (r.astype(np.float64) - 4).astype(np.float32)
    r = (r.astype(np.float64) + (3 - b64).astype(np.float32)).astype(np.float32)
    np.testing.assert_array_equal(out, r)
    mx = _run_ew(lambda a, b, c, s, k: vm.maximum(a, s), a, b, a, s=0.5)
    np.testing.assert_array_equal(mx, np.maximum(a, np.float32(0.5)))


def test_broadcast_column_and_row_tiles():
    @vm.program(warps=1)
    def prog(x: vm.ptr[vm.float32], col: vm.ptr[vm.float32], row: vm.ptr[vm.float32],
             y: vm.ptr[vm.float32], z: vm.ptr[vm.float32]):
        vm.set_grid(1)
        t = vm.load_global(vm.global_view(x, [16, 8]), [0, 0], [16, 8], L16x8)
        cl = vm.load_global(vm.global_view(col, [16, 1]), [0, 0], [16, 1], L16x1)
        rw = vm.load_global(vm.global_view(row, [1, 8]), [0, 0], [1, 8], L1x8)
        vm.store_global(vm.global_view(y, [16, 8]), cl * t + rw)
        vm.store_global(vm.global_view(z, [16, 8]), vm.fma(t, cl, rw) - cl)

    x, col, row = f32(16, 8), f32(16, 1), f32(1, 8)
    y, z = np.zeros((16, 8), np.float32), np.zeros((16, 8), np.float32)
    lowvm.interpret(prog, x, col, row, y, z)
    np.testing.assert_array_equal(y, col * x + row)
    fused = (x.astype(np.float64) * col + row).astype(np.float32)
    np.testing.assert_array_equal(z, fused - col)


def test_broadcast_needs_the_operand_in_the_same_thread():
    with pytest.raises(lowvm.ProgramError, match="layout mismatch"):
        @vm.program(warps=1)
        def prog(x: vm.ptr[vm.float32]):
            vm.set_grid(1)
            t = vm.register_tensor(vm.float32, [16, 8], L16x8)
            # thread t holds row t // 2 here, rows 2 (t // 4) and 2 (t // 4) + 1 in t
            col = vm.register_tensor(vm.float32, [16, 1],
                                     reduce(vm.spatial(16, 2), [1], keepdims=True))
            vm.store_global(vm.global_view(x, [16, 8]), t + col)

        prog.build()


def test_int32_division_truncates_toward_zero():
    a = RNG.integers(-50, 50, (16, 8)).astype(np.int32)
    b = RNG.integers(1, 7, (16, 8)).astype(np.int32) * RNG.choice([-1, 1], (16, 8))
    b = b.astype(np.int32)
    q = _run_ew(lambda a, b, c, s, k: a / b, a, b, a, dt=vm.int32)
    r = _run_ew(lambda a, b, c, s, k: vm.mod(a, b), a, b, a, dt=vm.int32)
    np.testing.assert_array_equal(q, np.trunc(a / b).astype(np.int32))
    np.testing.assert_array_equal(r, np.fmod(a, b))
    np.testing.assert_array_equal(q * b + r, a)


def test_integer_ops_with_scalars():
    a = RNG.integers(-100, 100, (16, 8)).astype(np.int32)
    out = _run_ew(lambda a, b, c, s, k: vm.maximum(a * 3 - k, 0) + abs(b), a, a, a, k=7,
                  dt=vm.int32)
    np.testing.assert_array_equal(out, np.maximum(a * 3 - 7, 0) + np.abs(a))


@pytest.mark.parametrize("dt, np_dt, x", [(vm.int8, np.int8, 100), (vm.int32, np.int32, 2**30)])
def test_integer_overflow_is_an_error(dt, np_dt, x):
    a = np.full((16, 8), x, np_dt)
    with pytest.raises(lowvm.InterpretError, match=r"overflow.*" + dt.name):
        _run_ew(lambda a, b, c, s, k: a + b, a, a, a, dt=dt)
    # just inside the range is fine
    ok = _run_ew(lambda a, b, c, s, k: a - b, a, a, a, dt=dt)
    assert np.all(ok == 0)


def test_integer_division_by_zero_is_an_error():
    a = np.ones((16, 8), np.int32)
    b = np.ones((16, 8), np.int32)
    b[3, 5] = 0
    with pytest.raises(lowvm.InterpretError, match="division by zero"):
        _run_ew(lambda a, b, c, s, k: a / b, a, b, a, dt=vm.int32)


# ---------------------------------------------------------------------------------------
# reduce and permute


def _reduce_program(dt, op, dim, keepdims):
    shape = [16, 8]
    out_shape = list(shape)
    out_shape[dim] = 1
    if not keepdims:
        out_shape.pop(dim)

    @vm.program(warps=1)
    def prog(x: vm.ptr[dt], y: vm.ptr[dt]):
        vm.set_grid(1)
        t = vm.load_global(vm.global_view(x, shape), [0, 0], shape, L16x8)
        r = vm.reduce(t, dim, op, keepdims=keepdims)
        assert r.shape == tuple(out_shape)
        assert r.layout == reduce(L16x8, [dim], keepdims=keepdims)
        vm.store_global(vm.global_view(y, out_shape), r)

    return prog


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_reduce(op, dim, keepdims):
    x = (RNG.integers(-64, 64, (16, 8)) / 8).astype(np.float32)  # sums are exact
    expected = getattr(np, op)(x, axis=dim, keepdims=keepdims)
    y = np.zeros(expected.shape, np.float32)
    lowvm.interpret(_reduce_program(vm.float32, op, dim, keepdims), x, y)
    np.testing.assert_array_equal(y, expected)


def test_reduce_sum_rounds_once_to_float16():
    x = np.full((16, 8), 1.0, np.float16)
    x[0, 0] = 2048.0  # float16 steps are 2 above 2048: 2048 + 1 rounds back to 2048
    y = np.zeros(8, np.float16)
    lowvm.interpret(_reduce_program(vm.float16, "sum", 0, False), x, y)
    np.testing.assert_array_equal(y, np.sum(x.astype(np.float64), axis=0).astype(np.float16))
    assert y[0] == 2064 and y[1] == 16  # exact 2063, rounded once (to even)
    sequential = np.float16(0)
    for v in x[:, 0]:
        sequential = np.float16(sequential + v)
    assert sequential == 2048  # what rounding after every addition would give


def test_reduce_int8_sum_overflow_is_an_error():
    x = np.full((16, 8), 100, np.int8)
    with pytest.raises(lowvm.InterpretError, match="overflow"):
        lowvm.interpret(_reduce_program(vm.int8, "sum", 0, False), x, np.zeros(8, np.int8))


def test_reduce_then_broadcast_back_softmax_rows():
    @vm.program(warps=1)
    def softmax(x: vm.ptr[vm.float32], y: vm.ptr[vm.float32]):
        vm.set_grid(1)
        t = vm.load_global(vm.global_view(x, [16, 8]), [0, 0], [16, 8], L16x8)
        e = vm.exp(t - vm.max(t, 1, keepdims=True))
        vm.store_global(vm.global_view(y, [16, 8]), e / vm.sum(e, 1, keepdims=True))

    x, y = f32(16, 8), np.zeros((16, 8), np.float32)
    lowvm.interpret(softmax, x, y)
    ref = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(y, ref / ref.sum(1, keepdims=True), rtol=1e-6)


def test_transpose_and_permute():
    lay3 = vm.spatial(2, 4, 4).local(1, 1, 2)  # [2, 4, 8]

    @vm.program(warps=1)
    def prog(x: vm.ptr[vm.float32], y: vm.ptr[vm.float32], z: vm.ptr[vm.float32]):
        vm.set_grid(1)
        t = vm.load_global(vm.global_view(x, [16, 8]), [0, 0], [16, 8], L16x8)
        tt = vm.transpose(t)
        assert tt.shape == (8, 16) and tt.layout == permute(L16x8, [1, 0])
        vm.store_global(vm.global_view(y, [8, 16]), tt)
        u = vm.load_global(vm.global_view(x, [2, 4, 8]), [0, 0, 0], [2, 4, 8], lay3)
        vm.store_global(vm.global_view(z, [8, 2, 4]), vm.permute(u, [2, 0, 1]))

    x = f32(16, 8)
    y, z = np.zeros((8, 16), np.float32), np.zeros((8, 2, 4), np.float32)
    lowvm.interpret(prog, x, y, z)
    np.testing.assert_array_equal(y, x.T)
    np.testing.assert_array_equal(z, x.reshape(-1)[:64].reshape(2, 4, 8).transpose(2, 0, 1))


# ---------------------------------------------------------------------------------------
# dot


def _dot_program(dt, acc_dt, la, lb, lc, warps):
    (m, k), (_, n) = la.shape, lb.shape

    @vm.program(warps=warps)
    def prog(a: vm.ptr[dt], b: vm.ptr[dt], c: vm.ptr[acc_dt], d: vm.ptr[acc_dt]):
        vm.set_grid(1)
        ta = vm.load_global(vm.global_view(a, [m, k]), [0, 0], [m, k], la)
        tb = vm.load_global(vm.global_view(b, [k, n]), [0, 0], [k, n], lb)
        tc = vm.load_global(vm.global_view(c, [m, n]), [0, 0], [m, n], lc)
        vm.store_global(vm.global_view(d, [m, n]), vm.dot(ta, tb, tc))

    return prog


def _multi_warp(mma, wm, wn):
    """Operand layouts of a wm x wn grid of warps, each computing one MMA tile.

    A is replicated over the warps of a row, B over the warps of a column.
    """
    a3 = permute(concat(mma.a, vm.local(1)), [0, 2, 1])  # [16, 1, 16]
    a = reduce(compose(vm.spatial(wm, wn, 1), a3), [1])
    b = reduce(compose(vm.spatial(wm, 1, wn), concat(vm.local(1), mma.b)), [0])
    c = vm.spatial(wm, wn) * mma.c
    return a, b, c


def test_dot_float16_mma_layouts_exact():
    mma = vm.mma_layouts("m16n8k16", vm.float16)
    a = (RNG.integers(-16, 16, (16, 16)) / 4).astype(np.float16)  # exact products and sums
    b = (RNG.integers(-16, 16, (16, 8)) / 4).astype(np.float16)
    c = (RNG.integers(-64, 64, (16, 8)) / 8).astype(np.float32)
    d = np.zeros((16, 8), np.float32)
    lowvm.interpret(_dot_program(vm.float16, vm.float32, mma.a, mma.b, mma.c, 1), a, b, c, d)
    np.testing.assert_array_equal(d, a.astype(np.float64) @ b.astype(np.float64) + c)


def test_dot_float16_random_values_round_once_to_float32():
    mma = vm.mma_layouts("m16n8k16", vm.float16)
    a, b = f32(16, 16).astype(np.float16), f32(16, 8).astype(np.float16)
    c = f32(16, 8)
    d = np.zeros((16, 8), np.float32)
    lowvm.interpret(_dot_program(vm.float16, vm.float32, mma.a, mma.b, mma.c, 1), a, b, c, d)
    ref = a.astype(np.float64) @ b.astype(np.float64) + c.astype(np.float64)
    np.testing.assert_allclose(d, ref, rtol=2**-23, atol=0)


@pytest.mark.parametrize("shape", ["m16n8k16", "m16n8k32"])
def test_dot_int8_mma_layouts(shape):
    mma = vm.mma_layouts(shape, vm.int8)
    a = RNG.integers(-128, 128, (16, mma.k)).astype(np.int8)
    b = RNG.integers(-128, 128, (mma.k, 8)).astype(np.int8)
    c = RNG.integers(-(2**20), 2**20, (16, 8)).astype(np.int32)
    d = np.zeros((16, 8), np.int32)
    lowvm.interpret(_dot_program(vm.int8, vm.int32, mma.a, mma.b, mma.c, 1), a, b, c, d)
    np.testing.assert_array_equal(d, a.astype(np.int64) @ b.astype(np.int64) + c)


def test_dot_int32_accumulator_overflow_is_an_error():
    mma = vm.mma_layouts("m16n8k32", vm.int8)
    a = np.full((16, 32), -128, np.int8)
    b = np.full((32, 8), -128, np.int8)
    c = np.full((16, 8), 2**31 - 2**19, np.int32)  # + 32 * 2^14 = 2^19 overflows
    prog = _dot_program(vm.int8, vm.int32, mma.a, mma.b, mma.c, 1)
    with pytest.raises(lowvm.InterpretError, match="overflow"):
        lowvm.interpret(prog, a, b, c, np.zeros((16, 8), np.int32))


@pytest.mark.parametrize("wm, wn", [(2, 2), (4, 1), (1, 2)])
def test_dot_multi_warp_composed_layouts(wm, wn):
    mma = vm.mma_layouts("m16n8k16", vm.float16)
    la, lb, lc = _multi_warp(mma, wm, wn)
    assert la.num_threads == lb.num_threads == lc.num_threads == wm * wn * 32
    m, n = 16 * wm, 8 * wn
    a = f32(m, 16).astype(np.float16)
    b = f32(16, n).astype(np.float16)
    c = f32(m, n)
    d = np.zeros((m, n), np.float32)
    lowvm.interpret(_dot_program(vm.float16, vm.float32, la, lb, lc, wm * wn), a, b, c, d)
    ref = a.astype(np.float64) @ b.astype(np.float64) + c.astype(np.float64)
    np.testing.assert_allclose(d, ref, rtol=2**-23, atol=0)
    # each warp's accumulator holds exactly one 16x8 MMA tile
    for w in range(wm * wn):
        rows = {lc.logical_index(t, j)[0] // 16 for t in range(32 * w, 32 * w + 32)
                for j in range(lc.local_size)}
        cols = {lc.logical_index(t, j)[1] // 8 for t in range(32 * w, 32 * w + 32)
                for j in range(lc.local_size)}
        assert rows == {w // wn} and cols == {w % wn}


# ---------------------------------------------------------------------------------------
# shared memory and async copies


@vm.program(warps=4)
def transpose_via_shared(x: vm.ptr[vm.float32], y: vm.ptr[vm.float32]):
    """y [64, 32] = x [32, 64].T, loading rows of x and storing rows of y."""
    vm.set_grid(1)
    row_lay = vm.spatial(8, 16).local(4, 4)  # [32, 64]: thread holds a 4x4 block
    t = vm.load_global(vm.global_view(x, [32, 64]), [0, 0], [32, 64], row_lay)
    s = vm.shared_tensor(vm.float32, [64, 32], vm.shared_strided([64, 32], [33, 1]))
    vm.store_shared(s, vm.transpose(t))
    vm.sync()
    out_lay = vm.spatial(64, 2).local(1, 16)  # [64, 32]: thread holds half a row
    u = vm.load_shared(s, out_lay)
    vm.store_global(vm.global_view(y, [64, 32]), u)
    vm.free_shared(s)


def test_transpose_through_shared_memory():
    x = f32(32, 64)
    y = np.zeros((64, 32), np.float32)
    lowvm.interpret(transpose_via_shared, x, y)
    np.testing.assert_array_equal(y, x.T)
    prog = transpose_via_shared.build()
    assert prog.shared_bytes == (63 * 33 + 32) * 4


@vm.program(warps=1)
def shared_subtiles(x: vm.ptr[vm.float16], y: vm.ptr[vm.float16]):
    """Store two [16, 8] halves at offsets of a swizzled [16, 64] tile, read back other parts."""
    vm.set_grid(1)
    gx = vm.global_view(x, [16, 64])
    s = vm.shared_tensor(vm.float16, [16, 64], vm.swizzle_128b(16, 64, vm.float16))
    for j in range(8):  # unrolled while tracing
        vm.store_shared(s, vm.load_global(gx, [0, 8 * j], [16, 8], L16x8), [0, 8 * j])
    vm.sync()
    lay = vm.spatial(4, 8).local(4, 8)  # [16, 64]
    vm.store_global(vm.global_view(y, [16, 64]), vm.load_shared(s, lay))


def test_shared_offsets_and_swizzle():
    x = f32(16, 64).astype(np.float16)
    y = np.zeros((16, 64), np.float16)
    lowvm.interpret(shared_subtiles, x, y)
    np.testing.assert_array_equal(y, x)


@vm.program(warps=2)
def async_copy(m: vm.int32, x: vm.ptr[vm.int32], y: vm.ptr[vm.int32]):
    """Copy a [16, 16] tile of x (rows past m zero-filled) through shared memory, times 2."""
    vm.set_grid(1)
    gx = vm.global_view(x, [m, 16])
    s = vm.shared_tensor(vm.int32, [16, 16])
    vm.copy_async(s, gx, [0, 0])
    vm.commit_group()
    vm.wait_group(0)
    vm.sync()
    t = vm.load_shared(s, vm.spatial(16, 4).local(1, 4))
    vm.store_global(vm.global_view(y, [16, 16]), t * 2)


@pytest.mark.parametrize("m", [16, 11])
def test_copy_async_commit_wait_sync(m):
    x = RNG.integers(-1000, 1000, (m, 16)).astype(np.int32)
    y = np.full((16, 16), 5, np.int32)
    lowvm.interpret(async_copy, m, x, y)
    np.testing.assert_array_equal(y[:m], 2 * x)
    np.testing.assert_array_equal(y[m:], 0)  # copy_async zero-fills outside the tensor


# ---------------------------------------------------------------------------------------
# control flow: vm.range, vm.if_ / vm.else_


@vm.program(warps=1)
def row_sums(n: vm.int32, x: vm.ptr[vm.float32], y: vm.ptr[vm.float32]):
    """y = sum over the n rows of x [n, 64], accumulated in float32."""
    vm.set_grid(1)
    lay = vm.spatial(32).local(2)
    gx = vm.global_view(x, [n, 64])
    acc = vm.register_tensor(vm.float32, [64], lay, 0.0)
    for k in vm.range(n):
        row = vm.load_global(gx, [k, 0], [1, 64], vm.spatial(1, 32).local(1, 2))
        vm.add(acc, vm.sum(row, 0), out=acc)
    vm.store_global(vm.global_view(y, [64]), acc)


@pytest.mark.parametrize("n", [0, 1, 7])
def test_vm_range_with_runtime_bound_and_out_accumulator(n):
    x = f32(max(n, 1), 64, scale=1e3)[:n].copy()
    y = np.full(64, -1.0, np.float32)
    lowvm.interpret(row_sums, n, x, y)
    expected = np.zeros(64, np.float32)
    for k in range(n):  # float32 rounding after each addition, like the VM
        expected = expected + x[k]
    np.testing.assert_array_equal(y, expected)
    text = str(row_sums.build())
    assert "for " in text


@vm.program(warps=1)
def gemm_loop(kt: vm.int32, a: vm.ptr[vm.float16], b: vm.ptr[vm.float16],
              c: vm.ptr[vm.float32]):
    """c [16, 8] = a [16, 16 kt] @ b [16 kt, 8], one k-tile per iteration (range start 1)."""
    vm.set_grid(1)
    mma = vm.mma_layouts("m16n8k16", vm.float16)
    ga, gb = vm.global_view(a, [16, kt * 16]), vm.global_view(b, [kt * 16, 8])
    acc = vm.dot(vm.load_global(ga, [0, 0], [16, 16], mma.a),
                 vm.load_global(gb, [0, 0], [16, 8], mma.b),
                 vm.register_tensor(vm.float32, [16, 8], mma.c))
    for k in vm.range(1, kt):
        k0 = vm.let(k * 16, "k0")
        vm.dot(vm.load_global(ga, [0, k0], [16, 16], mma.a),
               vm.load_global(gb, [k0, 0], [16, 8], mma.b), acc, out=acc)
    vm.store_global(vm.global_view(c, [16, 8]), acc)


def test_vm_range_dot_accumulates_with_out():
    kt = 3
    a = (RNG.integers(-8, 8, (16, 16 * kt)) / 2).astype(np.float16)
    b = (RNG.integers(-8, 8, (16 * kt, 8)) / 2).astype(np.float16)
    c = np.zeros((16, 8), np.float32)
    lowvm.interpret(gemm_loop, kt, a, b, c)
    np.testing.assert_array_equal(c, a.astype(np.float64) @ b.astype(np.float64))


@vm.program(warps=1)
def strided_loop(n: vm.int32, y: vm.ptr[vm.int32]):
    """y[t] = sum of i over range(2, n, 3), for every thread t."""
    vm.set_grid(1)
    acc = vm.register_tensor(vm.int32, [32], vm.spatial(32), 0)
    for i in vm.range(2, n, 3):
        vm.add(acc, i, out=acc)
    vm.store_global(vm.global_view(y, [32]), acc)


@pytest.mark.parametrize("n", [0, 2, 3, 20])
def test_vm_range_start_stop_step(n):
    y = np.zeros(32, np.int32)
    lowvm.interpret(strided_loop, n, y)
    assert np.all(y == sum(range(2, n, 3)))


@vm.program(warps=1)
def branches(flag: vm.int32, y: vm.ptr[vm.float32]):
    """Blocks 0, 1 write +1 (or +2 when flag > 0), the others -1."""
    vm.set_grid(4)
    gy = vm.global_view(y, [4 * 32])
    off = [vm.block_index() * 32]
    with vm.if_(vm.block_index() < 2):
        with vm.if_(flag > 0):
            vm.store_global(gy, vm.register_tensor(vm.float32, [32], vm.spatial(32), 2.0), off)
        with vm.else_():
            vm.store_global(gy, vm.register_tensor(vm.float32, [32], vm.spatial(32), 1.0), off)
    with vm.else_():
        vm.store_global(gy, vm.register_tensor(vm.float32, [32], vm.spatial(32), -1.0), off)


@pytest.mark.parametrize("flag, first", [(0, 1.0), (5, 2.0)])
def test_if_else(flag, first):
    y = np.zeros(128, np.float32)
    lowvm.interpret(branches, flag, y)
    np.testing.assert_array_equal(y.reshape(4, 32)[:2], first)
    np.testing.assert_array_equal(y.reshape(4, 32)[2:], -1.0)


def test_else_without_if_is_an_error():
    @vm.program(warps=1)
    def prog(y: vm.ptr[vm.float32]):
        vm.set_grid(1)
        vm.sync()
        with vm.else_():
            vm.sync()

    with pytest.raises(lowvm.ProgramError, match="must directly follow"):
        prog.build()


# ---------------------------------------------------------------------------------------
# arguments: torch tensors, bfloat16


@vm.program(warps=1)
def scale_bf16(n: vm.int32, x: vm.ptr[vm.bfloat16], w: vm.ptr[vm.float32],
               y: vm.ptr[vm.bfloat16]):
    """y = bfloat16(float32(x) * w + 1) over [n]."""
    vm.set_grid(vm.cdiv(n, 64))
    off = [vm.block_index() * 64]
    lay = vm.spatial(32).local(2)
    t = vm.load_global(vm.global_view(x, [n]), off, [64], lay)
    s = vm.load_global(vm.global_view(w, [n]), off, [64], lay)
    vm.store_global(vm.global_view(y, [n]), vm.cast(vm.fma(vm.cast(t, vm.float32), s, 1.0),
                                                     vm.bfloat16), off)


def test_bfloat16_torch_tensors():
    n = 100
    x = torch.randn(n).to(torch.bfloat16)
    w = torch.randn(n)
    y = torch.zeros(n, dtype=torch.bfloat16)
    lowvm.interpret(scale_bf16, n, x, w, y)
    ref = (x.double() * w.double() + 1).to(torch.bfloat16)
    assert torch.equal(y, ref)


def test_template_interpret_with_constants_and_numpy_bfloat16():
    n = 300
    x = (RNG.standard_normal(n) * 3).astype(np.float32)
    y = np.zeros(n, np.float32)
    z = np.zeros(-(-n // 128) * 128, np.float32)
    copy_1d.interpret(n, x, y, z, block=128)
    np.testing.assert_array_equal(y, 2 * x)
    assert copy_1d.build(block=128) is copy_1d.build(block=128)  # cached
    assert copy_1d.build(block=128) is not copy_1d.build()
    # numpy bfloat16 arrays (ml_dtypes) work like torch bfloat16 tensors
    xb = (RNG.standard_normal(n)).astype(ml_dtypes.bfloat16)
    yb = np.zeros(n, ml_dtypes.bfloat16)
    scale_bf16.interpret(n, xb, np.full(n, 2.0, np.float32), yb)
    np.testing.assert_array_equal(yb.astype(np.float64),
                                  (xb.astype(np.float64) * 2 + 1).astype(ml_dtypes.bfloat16))


# ---------------------------------------------------------------------------------------
# cast with layout=: a per-thread renaming of registers


@vm.program(warps=1)
def cast_reordered(x: vm.ptr[vm.float32], y: vm.ptr[vm.float16], span: int = 4):
    """y = float16(x) over [16, 8], the cast result in L16x8 from a reordered source."""
    src = lowvm.layouts.split_pairs(L16x8, span)
    vm.set_grid(1)
    gx, gy = vm.global_view(x, [16, 8]), vm.global_view(y, [16, 8])
    t = vm.load_global(gx, [0, 0], [16, 8], src)
    vm.store_global(gy, vm.cast(t, vm.float16, layout=L16x8), [0, 0])


def test_cast_with_layout_reorders_registers_not_values():
    """The result holds the same values: only each thread's register order changed."""
    x = f32(16, 8)
    y = np.zeros((16, 8), np.float16)
    lowvm.interpret(cast_reordered, x.reshape(-1), y.reshape(-1))
    assert np.array_equal(y, x.astype(np.float16))
    src = lowvm.layouts.split_pairs(L16x8, 4)
    perm = lowvm.layouts.local_permutation(src, L16x8)
    assert perm.tolist() == [0, 2, 1, 3]  # L16x8's locals (0, 1) sat at 0 and 2


@vm.program(warps=1)
def cast_moving_data(x: vm.ptr[vm.float32], y: vm.ptr[vm.float16]):
    """Asks the cast to move elements between threads, which a renaming cannot."""
    vm.set_grid(1)
    gx, gy = vm.global_view(x, [16, 8]), vm.global_view(y, [16, 8])
    t = vm.load_global(gx, [0, 0], [16, 8], L16x8)
    vm.store_global(gy, vm.cast(t, vm.float16, layout=vm.spatial(4, 8).local(4, 1)), [0, 0])


def test_cast_with_layout_refuses_moving_elements_between_threads():
    with pytest.raises(lowvm.ProgramError, match="must give every thread the elements"):
        cast_moving_data.build()


# ---------------------------------------------------------------------------------------
# extract: a register sub-tile by renaming

#: [16, 8] with rows 8 apart in one thread's registers: its row halves are slices of it
L16x8_HALVES = vm.local(2, 1).spatial(8, 4).local(1, 2)
L8x8 = vm.spatial(8, 4).local(1, 2)


@vm.program(warps=1)
def extract_half(x: vm.ptr[vm.float32], y: vm.ptr[vm.float32], c: vm.ptr[vm.float32],
                 row: int = 8, src_layout: vm.constexpr = None, out_layout: vm.constexpr = None,
                 shape: vm.constexpr = (8, 8)):
    """y = x[row:row+8, :], c = x[row:row+8, :1] (a column replicated over 4 threads)."""
    vm.set_grid(1)
    gx = vm.global_view(x, [16, 8])
    t = vm.load_global(gx, [0, 0], [16, 8], src_layout or L16x8_HALVES)
    vm.store_global(vm.global_view(y, [8, 8]),
                    vm.extract(t, [row, 0], list(shape), out_layout or L8x8))
    col = vm.load_global(gx, [0, 0], [16, 1], reduce(L16x8_HALVES, [1], keepdims=True))
    vm.store_global(vm.global_view(c, [8, 1]),
                    vm.extract(col, [row, 0], [8, 1], reduce(L8x8, [1], keepdims=True)))


@pytest.mark.parametrize("row", [0, 8])
def test_extract_takes_a_sub_tile_from_each_threads_own_registers(row):
    from lowvm.driver import generate_cuda

    x = f32(16, 8)
    y, c = np.zeros((8, 8), np.float32), np.zeros((8, 1), np.float32)
    program = extract_half.build(row=row)
    lowvm.interpret(program, x.reshape(-1), y.reshape(-1), c.reshape(-1))
    np.testing.assert_array_equal(y, x[row:row + 8])
    np.testing.assert_array_equal(c, x[row:row + 8, :1])
    # one register copy per element a thread extracts: rows `row` are locals 2 * row / 8
    # and 2 * row / 8 + 1 of the tile, local row / 8 of the column
    lines = [line.strip() for line in generate_cuda(program).source.splitlines()]
    first = 2 * row // 8
    assert [f"r4[0] = r2[{first}];", f"r4[1] = r2[{first + 1}];"] == [
        line for line in lines if line.startswith("r4[") and "= r2[" in line]
    assert [f"r7[0] = r5[{row // 8}];"] == [line for line in lines
                                             if line.startswith("r7[") and "= r5[" in line]


@pytest.mark.parametrize("fields,message", [
    (dict(row=12), r"the \[8, 8\] tile at \[12, 0\] is not inside %\w+ of shape \[16, 8\]"),
    (dict(out_layout=vm.spatial(8, 4).local(1, 1), shape=(8, 4)),
     r"thread 1 does not hold element \[0, 1\] \+ \[8, 0\] of the source"),
    (dict(src_layout=L16x8),  # rows 2r, 2r + 1 in thread r: row 8 is thread 4's
     r"thread 0 does not hold element \[0, 0\] \+ \[8, 0\] of the source"),
    (dict(shape=(8, 4), out_layout=vm.spatial(8, 4)),  # a float32 tile of another type
     r"thread 1 does not hold element \[0, 1\] \+ \[8, 0\]")])
def test_extract_names_what_does_not_fit(fields, message):
    with pytest.raises(lowvm.ProgramError, match=message):
        extract_half.build(**fields)


def test_extract_and_prefetch_l2_refuse_wrong_operands():
    @vm.program(warps=1)
    def runtime_offset(x: vm.ptr[vm.float32], n: vm.int32):
        t = vm.load_global(vm.global_view(x, [16, 8]), [0, 0], [16, 8], L16x8_HALVES)
        vm.extract(t, [n, 0], [8, 8], L8x8)

    with pytest.raises(lowvm.ProgramError, match=r"extract: offsets must be compile-time "
                                                 r"integers, got \[n, 0\]"):
        runtime_offset.build()

    @vm.program(warps=1)
    def prefetch_registers(x: vm.ptr[vm.float32]):
        t = vm.load_global(vm.global_view(x, [16, 8]), [0, 0], [16, 8], L16x8_HALVES)
        vm.prefetch_l2(t, [0, 0], [16, 8])

    with pytest.raises(lowvm.ProgramError, match="prefetch_l2: src must be a global tensor, "
                                                 "got RegisterTensor"):
        prefetch_registers.build()


def test_split_pairs_lists_even_then_odd_locals_of_each_run():
    lay = vm.spatial(8, 4).local(2, 4)  # 8 locals per thread
    for span in (2, 4, 8):
        s = lowvm.layouts.split_pairs(lay, span)
        h = span // 2
        for run in range(8 // span):
            for a in range(2):
                for i in range(h):
                    assert np.array_equal(s.table[:, run * span + a * h + i],
                                          lay.table[:, run * span + 2 * i + a])
    with pytest.raises(lowvm.LayoutError, match="span"):
        lowvm.layouts.split_pairs(lay, 16)
    with pytest.raises(lowvm.LayoutError, match="span"):
        lowvm.layouts.split_pairs(lay, 3)


# ---------------------------------------------------------------------------------------
# arrive: the last of a group of blocks finishes their shared work


@vm.program(warps=1)
def last_block_sums(parts: vm.ptr[vm.float32], ws: vm.ptr[vm.float32],
                    counters: vm.ptr[vm.int32], out: vm.ptr[vm.float32],
                    seen: vm.ptr[vm.int32], groups: int = 2, size: int = 4):
    """Block (g, b) adds its 32 parts into ws[g]; the last of group g's blocks to arrive
    copies ws[g] to out[g] and clears it; every block records how many came before it."""
    vm.set_grid(groups, size)
    g, b = vm.block_index(0), vm.block_index(1)
    lay = vm.spatial(32)
    part = vm.load_global(vm.global_view(parts, [groups * size * 32]), [(g * size + b) * 32],
                          [32], lay)
    gws = vm.global_view(ws, [groups * 32])
    vm.atomic_add(gws, part, [g * 32])
    arrived = vm.arrive(vm.global_view(counters, [groups]), [g], size)
    vm.store_global(vm.global_view(seen, [groups * size * 32]),
                    vm.register_tensor(vm.int32, [32], lay, init=arrived), [(g * size + b) * 32])
    with vm.if_(arrived.equals(size - 1)):
        total = vm.load_global(gws, [g * 32], [32], lay, coherent=True)
        vm.store_global(vm.global_view(out, [groups * 32]), total, [g * 32])
        vm.store_global(gws, vm.register_tensor(vm.float32, [32], lay, init=0.0), [g * 32])


def _arrive_buffers(groups=2, size=4):
    parts = f32(groups * size * 32)
    return (parts, np.zeros(groups * 32, np.float32), np.zeros(groups, np.int32),
            np.full(groups * 32, np.nan, np.float32), np.full(groups * size * 32, -1, np.int32))


def test_arrive_lets_the_last_block_finish_and_resets_itself():
    parts, ws, counters, out, seen = _arrive_buffers()
    for _ in range(2):  # the counters and the workspace are ready again after a launch
        lowvm.interpret(last_block_sums, parts, ws, counters, out, seen)
        # blocks run in order: each group's float32 sum, added block by block (a float64
        # reference with a relative bound fails where the parts nearly cancel)
        want = np.zeros((2, 32), np.float32)
        for b in range(4):
            want = want + parts.reshape(2, 4, 32)[:, b]
        assert np.array_equal(out, want.reshape(-1))
        assert not ws.any() and not counters.any()
        # blocks run in order in the interpreter: block b of each group saw b arrivals
        assert np.array_equal(seen.reshape(2, 4, 32)[:, :, 0], np.tile(np.arange(4), (2, 1)))


def test_arrive_generated_code_fences_and_reads_through_l2():
    from lowvm.driver import generate_cuda

    src = generate_cuda(last_block_sums.build()).source
    # a barrier, thread 0's release fence, the ticket, its acquire fence, a barrier: in
    # that order, and no fence outside thread 0
    start = src.index("__shared__ unsigned lowvm_ticket")
    tail = src[start:src.index("= (int)lowvm_ticket", start)]
    steps = ["__syncthreads()", "if (tid == 0)", "fence.acq_rel.gpu", "atomicInc(",
             "fence.acq_rel.gpu", "}", "__syncthreads()"]
    at = 0
    for step in steps:
        at = tail.index(step, at) + len(step)
    assert src.count("fence.acq_rel.gpu") == 2 and "__threadfence()" not in src
    assert "__ldcg(" in src  # the coherent load bypasses the read-only and L1 caches


def test_arrive_refuses_a_non_int32_counter():
    @vm.program(warps=1)
    def bad(c: vm.ptr[vm.float32]):
        vm.set_grid(1)
        vm.arrive(vm.global_view(c, [1]), [0], 2)

    with pytest.raises(lowvm.ProgramError, match="arrival counters are int32"):
        bad.build()


@pytest.mark.gpu
def test_arrive_on_the_gpu():
    import torch

    program = lowvm.compile(last_block_sums, groups=8, size=16)
    bufs = [torch.from_numpy(a).cuda() for a in _arrive_buffers(groups=8, size=16)]
    parts = bufs[0].cpu().numpy()
    for _ in range(3):
        program(*bufs)
        torch.cuda.synchronize()
        want = parts.reshape(8, 16, 32).astype(np.float64).sum(axis=1).reshape(-1)
        assert np.allclose(bufs[3].cpu().numpy(), want, rtol=1e-5, atol=1e-5)
        assert not bufs[1].any() and not bufs[2].any()
        seen = bufs[4].cpu().numpy().reshape(8, 16, 32)[:, :, 0]
        assert all(sorted(row) == list(range(16)) for row in seen.tolist())


@vm.program(warps=1)
def tile_sums(parts: vm.ptr[vm.float32], ws: vm.ptr[vm.float32], rows: vm.int32,
              cols: vm.int32, col0: vm.int32, blocks: int = 4):
    """Each block adds its [8, 32] tile of ``parts`` into ``ws [rows, cols]`` at
    ``(0, col0)``: runs of 4 floats per thread (one vector reduction each on sm_90 where
    ``cols`` and ``col0`` are multiples of 4), elements past ``rows``/``cols`` skipped."""
    vm.set_grid(blocks)
    lay = vm.spatial(8, 4).local(1, 8)
    part = vm.load_global(vm.global_view(parts, [blocks * 8, 32]),
                          [vm.block_index() * 8, 0], [8, 32], lay)
    vm.atomic_add(vm.global_view(ws, [rows, cols]), part, [0, col0])


def _tile_sums_want(parts, rows, cols, col0):
    want = np.zeros((rows, cols), np.float64)
    total = parts.reshape(-1, 8, 32).astype(np.float64).sum(axis=0)
    r, c = min(rows, 8), max(0, min(32, cols - col0))
    want[:r, col0:col0 + c] = total[:r, :c]
    return want


#: (rows, cols, col0): the vector path; a column offset and a width that are not
#: multiples of 4 (the per-element path); rows and columns cut by the bounds
_TILE_SUM_CASES = [(8, 64, 16), (8, 64, 18), (8, 37, 4), (5, 40, 12)]


@pytest.mark.parametrize("rows,cols,col0", _TILE_SUM_CASES)
def test_atomic_add_runs_sum_like_elements(rows, cols, col0):
    parts = np.round(f32(4 * 8 * 32) * 8)  # integers: every addition order is exact
    ws = np.zeros(rows * cols, np.float32)
    lowvm.interpret(tile_sums, parts, ws, rows, cols, col0)
    assert np.array_equal(ws.reshape(rows, cols), _tile_sums_want(parts, rows, cols, col0))


@pytest.mark.gpu
@pytest.mark.parametrize("rows,cols,col0", _TILE_SUM_CASES)
def test_atomic_add_runs_on_the_gpu(rows, cols, col0):
    program = lowvm.compile(tile_sums)
    parts = np.round(f32(4 * 8 * 32) * 8)
    ws = torch.zeros(rows * cols, dtype=torch.float32, device="cuda")
    for launch in range(2):  # the second launch adds onto the first
        program(torch.from_numpy(parts).cuda(), ws, rows, cols, col0)
        torch.cuda.synchronize()
        want = (launch + 1) * _tile_sums_want(parts, rows, cols, col0)
        assert np.array_equal(ws.cpu().numpy().reshape(rows, cols), want)


@vm.program(warps=1)
def two_arrivals(c: vm.ptr[vm.int32], out: vm.ptr[vm.int32]):
    """Two arrivals in one scope (e.g. two split-K outputs of one kernel)."""
    vm.set_grid(3)
    gc = vm.global_view(c, [2])
    first = vm.arrive(gc, [0], 3)
    second = vm.arrive(gc, [1], 3)
    lay = vm.spatial(32)
    vm.store_global(vm.global_view(out, [3 * 32]),
                    vm.register_tensor(vm.int32, [32], lay, init=first * 10 + second),
                    [vm.block_index() * 32])


def test_two_arrivals_in_one_scope_compile_and_count():
    out = np.zeros(96, np.int32)
    counters = np.zeros(2, np.int32)
    lowvm.interpret(two_arrivals, counters, out)
    assert out.reshape(3, 32)[:, 0].tolist() == [0, 11, 22] and not counters.any()
    if shutil.which("nvcc"):
        from lowvm.driver import generate_cuda
        from lowvm.runtime import resource_usage

        cuda = generate_cuda(two_arrivals.build())
        assert resource_usage(cuda.source, "sm_90")[cuda.kernel_name]["registers"] > 0


def test_load_uniform_reads_one_int32_and_refuses_outside():
    """vm.load_uniform: a device-memory int32 as a runtime scalar (here an offset); an
    element outside its tensor is an interpreter error naming the offsets; int32 only."""
    @vm.program(warps=4)
    def shift(pos: vm.ptr[vm.int32], x: vm.ptr[vm.float32], y: vm.ptr[vm.float32],
              n: vm.int32, at: int = 1):
        vm.set_grid(1)
        p = vm.load_uniform(vm.global_view(pos, [2]), [at])
        t = vm.load_global(vm.global_view(x, [n]), [p], [128], vm.spatial(128))
        vm.store_global(vm.global_view(y, [n]), t, [0])

    x, y = np.arange(300, dtype=np.float32), np.zeros(300, np.float32)
    lowvm.interpret(shift, np.array([0, 5], np.int32), x, y, 300)
    np.testing.assert_array_equal(y[:128], x[5:133])
    with pytest.raises(lowvm.InterpretError, match=r"load_uniform at \[2\] is outside"):
        lowvm.interpret(shift, np.array([0, 5], np.int32), x, y, 300, at=2)

    @vm.program(warps=4)
    def wrong(pos: vm.ptr[vm.float32]):
        vm.set_grid(1)
        vm.load_uniform(vm.global_view(pos, [2]), [0])

    with pytest.raises(lowvm.LowvmError, match="load_uniform reads int32"):
        wrong.build()


def test_mod_refuses_a_float_scalar():
    """``%`` in the generated C takes integers only: a float scalar is refused when the
    program is built (the CUDA would not compile), naming the value."""

    @vm.program(warps=1)
    def rem(x: vm.ptr[vm.int32], y: vm.ptr[vm.int32]):
        vm.set_grid(1)
        v = vm.load_global(vm.global_view(x, [32]), [0], [32], vm.spatial(32))
        vm.store_global(vm.global_view(y, [32]), vm.mod(v, 2.5), [0])

    with pytest.raises(lowvm.ProgramError, match="float scalar 2.5"):
        rem.build()
