"""A spec made into a ``@vm.program``: the VM program the fuzzer runs and compiles.

The program's parameters are ``m, n, k`` (int32 extents), then ``u, v, t`` (``wrap``)
and ``s`` (``runtime_step``), one pointer per input (``a``/``b`` first for the ``dot``
family) and ``out``. Inputs whose type has no buffer type of its own (every type of at
most 8 bits other than int8/uint8) travel as uint8 bytes of packed codes and are
``vm.view``-ed after the load, as the kernel library does with packed weights. See
:mod:`lowvm.fuzz.spec` for the three families.
"""

from __future__ import annotations

import hashlib
import inspect
from typing import Any

import lowvm.fuzz.numerics as nm
import lowvm.lang as vm
from lowvm.dtypes import DType, float32, int8, int32, uint8
from lowvm.expr import select
from lowvm.fuzz.analysis import analyze
from lowvm.fuzz.spec import Input, Layout, Op, Spec, dumps
from lowvm.ir import Program
from lowvm.layouts import RegisterLayout, permute, reduce
from lowvm.layouts.mma_tiling import block_mma_layouts

__all__ = ["build_program", "storage_type", "is_packed", "program_name", "mma_shape",
           "parameter_names"]

_NATIVE = ("float16", "bfloat16", "float32", "int32", "int8", "uint8")


def is_packed(dt: DType) -> bool:
    """Held in global and shared memory as uint8 bytes of codes (then viewed)."""
    return dt.name not in _NATIVE


def storage_type(dt: DType) -> DType:
    """The element type of the buffer that holds values of ``dt``."""
    return uint8 if is_packed(dt) else dt


def mma_shape(dt: DType) -> str:
    """The ``mma.sync`` atom of a dot of ``dt`` operands."""
    return "m16n8k32" if dt in (int8, uint8) else "m16n8k16"


def program_name(spec: Spec) -> str:
    """``fuzz_<hash of the structure>``: equal structures give one kernel."""
    digest = hashlib.sha256(dumps(spec.structure()).encode()).hexdigest()[:12]
    return f"fuzz_{spec.family}_{digest}"


def parameter_names(spec: Spec) -> list[str]:
    """Pointer parameter names in order (after ``m, n, k``)."""
    names = ["a", "b"] if spec.family == "dot" else []
    return names + [f"x{i}" for i in range(len(spec.inputs))] + ["out"]


def build_program(spec: Spec) -> Program:
    """The elaborated program of ``spec`` (layouts inferred, loops pipelined)."""
    types: list[DType] = []
    if spec.family == "dot":
        types += [storage_type(nm.type_by_name(spec.a.dtype)),
                  storage_type(nm.type_by_name(spec.b.dtype))]
    types += [storage_type(nm.type_by_name(i.dtype)) for i in spec.inputs]
    types.append(storage_type(nm.type_by_name(spec.out_dtype)))
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(name, kind, annotation=int32) for name in spec.scalar_names]
    params += [inspect.Parameter(name, kind, annotation=vm.ptr[t])
               for name, t in zip(parameter_names(spec), types)]

    def body(**kw: Any) -> None:
        _Tracer(spec, kw).run()

    body.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    body.__name__ = program_name(spec)
    return vm.program(name=program_name(spec))(body).build()


def _layout(lay: Layout | None) -> RegisterLayout | None:
    if lay is None:
        return None
    threads = (vm.column_spatial if lay.column else vm.spatial)(*lay.threads)
    return vm.local(*lay.outer) * threads * vm.local(*lay.inner)


def _byte_layout(lay: Layout | None, dt: DType) -> RegisterLayout | None:
    """The layout of the bytes that ``vm.view`` turns into ``lay`` of ``dt``."""
    if lay is None:
        return None
    inner = (lay.inner[0], lay.inner[1] * dt.nbits // 8)
    threads = (vm.column_spatial if lay.column else vm.spatial)(*lay.threads)
    return vm.local(*lay.outer) * threads * vm.local(*inner)


def _shaped(full: RegisterLayout | None, shape: str) -> RegisterLayout | None:
    if full is None or shape == "full":
        return full
    return reduce(full, [1 if shape == "row" else 0], keepdims=True)


def _smem_layout(kind: str, rows: int, cols: int, dt: DType):
    if kind == "swizzle":
        return vm.swizzle_128b(rows, cols, dt)
    if kind in ("pad", "pad1"):
        pad = 1 if kind == "pad1" else max(1, 16 // (dt.nbits // 8))
        return vm.shared_strided([rows, cols], [cols + pad, 1])
    return None


class _Tracer:
    """Emits the VM instructions of one spec (called while ``@vm.program`` traces)."""

    def __init__(self, spec: Spec, kw: dict[str, Any]) -> None:
        self.spec, self.kw = spec, kw
        self.full = _layout(spec.layout)
        self.shared: list[Any] = []
        self.views: dict[str, Any] = {}
        # rows every input starts past the block's: int32 arithmetic that may wrap
        self.shift = kw["u"] * kw["v"] + kw["t"] if spec.wrap else 0

    def run(self) -> None:
        spec = self.spec
        vm.set_warps(spec.warps)
        if spec.family == "tile":
            self.tile()
        elif spec.family == "loop":
            self.loop()
        else:
            self.dot()
        for s in self.shared:
            vm.free_shared(s)

    # -- inputs ---------------------------------------------------------------------
    def _global(self, name: str, inp: Input, rows, cols):
        """The global view of an input (one per input, made before any loop)."""
        if name in self.views:
            return self.views[name]
        dt = nm.type_by_name(inp.dtype)
        r = rows if inp.shape != "col" else 1
        c = cols if inp.shape != "row" else 1
        if is_packed(dt):
            c = c * dt.nbits // 8
        self.views[name] = vm.global_view(self.kw[name], [r, c])
        return self.views[name]

    def _tile_shape(self, inp: Input) -> tuple[int, int]:
        dt = nm.type_by_name(inp.dtype)
        bm, bn = self.spec.tile
        r = bm if inp.shape != "col" else 1
        c = bn if inp.shape != "row" else 1
        return r, (c * dt.nbits // 8 if is_packed(dt) else c)

    def _offsets(self, inp: Input, r0, c0):
        dt = nm.type_by_name(inp.dtype)
        r = (r0 if inp.shape != "col" else 0) + self.shift
        c = c0 if inp.shape != "row" else 0
        return [r, c * dt.nbits // 8 if is_packed(dt) else c]

    def _value_layout(self, inp: Input) -> RegisterLayout | None:
        return _shaped(self.full, inp.shape)

    def _load_layout(self, inp: Input) -> RegisterLayout | None:
        dt = nm.type_by_name(inp.dtype)
        if is_packed(dt) and inp.shape == "full":
            return _byte_layout(self.spec.layout, dt)
        return self._value_layout(inp)

    def _finish(self, inp: Input, raw):
        dt = nm.type_by_name(inp.dtype)
        if not is_packed(dt):
            return raw
        return vm.view(raw, dt, self._value_layout(inp))

    def prepare(self, rows, cols) -> None:
        """The inputs' global views and the shared tiles of those that pass through
        shared memory, before any loop (a pipelined loop's copied tiles live outside it,
        and its body starts with the copies)."""
        for i, inp in enumerate(self.spec.inputs):
            self._global(f"x{i}", inp, rows, cols)
        self.smem = {i: self._smem(inp) for i, inp in enumerate(self.spec.inputs)
                     if inp.path != "global"}

    def inputs_begin(self, r0, c0, rows, cols) -> dict[int, Any]:
        """Start every input: copies (then one commit), direct loads, shared stores."""
        spec, ready = self.spec, {}
        self.pending = []
        for i, inp in enumerate(spec.inputs):
            if inp.path == "async":
                vm.copy_async(self.smem[i], self._global(f"x{i}", inp, rows, cols),
                              self._offsets(inp, r0, c0))
                self.pending.append((i, inp, self.smem[i]))
        if self.pending:
            vm.commit_group()
        for i, inp in enumerate(spec.inputs):
            if inp.path == "async":
                continue
            raw = vm.load_global(self._global(f"x{i}", inp, rows, cols),
                                 self._offsets(inp, r0, c0), self._tile_shape(inp),
                                 self._load_layout(inp))
            if inp.path == "global":
                ready[i] = self._finish(inp, raw)
            else:
                vm.store_shared(self.smem[i], raw)
                self.pending.append((i, inp, self.smem[i]))
        return ready

    def inputs_end(self, ready: dict[int, Any]) -> list[Any]:
        """Wait for the copies, sync, read the shared tiles: the input values in order."""
        if any(inp.path == "async" for _, inp, _ in self.pending):
            vm.wait_group(0)
        if self.pending:
            vm.sync()
        for i, inp, s in sorted(self.pending, key=lambda t: t[0]):
            ready[i] = self._finish(inp, vm.load_shared(s, self._load_layout(inp)))
        return [ready[i] for i in range(len(self.spec.inputs))]

    def _smem(self, inp: Input):
        dt = nm.type_by_name(inp.dtype)
        rows, cols = self._tile_shape(inp)
        st = storage_type(dt)
        s = vm.shared_tensor(st, [rows, cols], _smem_layout(inp.smem, rows, cols, st))
        self.shared.append(s)
        return s

    # -- the chain ------------------------------------------------------------------
    def ops(self, values: list[Any]) -> Any:
        for op in self.spec.ops:
            values.append(_apply(op, values))
        return values[-1]

    def store(self, value, g_out, offsets, shape: str) -> None:
        spec = self.spec
        dt = nm.type_by_name(spec.out_dtype)
        if value.dtype != dt:
            value = vm.cast(value, dt)
        if is_packed(dt):
            lay = value.layout  # 8-bit types: the same bits per thread
            if dt.nbits < 8:
                lay = _byte_layout(spec.layout, dt) if spec.family != "dot" else None
            value = vm.view(value, uint8, lay)
        if spec.out_path == "shared":
            s = vm.shared_tensor(value.dtype, list(value.shape))
            self.shared.append(s)
            vm.store_shared(s, value)
            vm.sync()
            value = vm.load_shared(s, value.layout)
        vm.store_global(g_out, value, offsets)

    def out_view(self, rows, cols):
        dt = nm.type_by_name(self.spec.out_dtype)
        if is_packed(dt):
            cols = cols * dt.nbits // 8
        return vm.global_view(self.kw["out"], [rows, cols],
                              strides=[cols + self.spec.out_pad, 1])

    # -- families -------------------------------------------------------------------
    def tile(self) -> None:
        spec = self.spec
        bm, bn = spec.tile
        m, n = self.kw["m"], self.kw["n"]
        vm.set_grid(vm.cdiv(n, bn), vm.cdiv(m, bm))
        bi, bj = vm.block_index(1), vm.block_index(0)
        r0, c0 = bi * bm, bj * bn
        self.prepare(m, n)
        values = self.inputs_end(self.inputs_begin(r0, c0, m, n))
        last = self.ops(values)
        shape = _final_shape(spec)
        dt = nm.type_by_name(spec.out_dtype)
        if shape == "full":
            self.store(last, self.out_view(m, n), [r0, c0 * dt.nbits // 8 if is_packed(dt)
                                                   else c0], shape)
        elif shape == "row":
            self.store(last, self.out_view(m, vm.cdiv(n, bn)), [r0, bj], shape)
        else:
            self.store(last, self.out_view(vm.cdiv(m, bm), n), [bi, c0], shape)

    def loop(self) -> None:
        spec = self.spec
        bm, bn = spec.tile
        m, k = self.kw["m"], self.kw["k"]
        vm.set_grid(vm.cdiv(m, bm))
        bi = vm.block_index(0)
        r0 = bi * bm
        shape = _final_shape(spec)
        acc_type = analyze(spec)[-2].dtype
        acc_shape = {"full": [bm, bn], "row": [bm, 1], "col": [1, bn]}[shape]
        acc = vm.register_tensor(acc_type, acc_shape, _shaped(self.full, shape), init=0)
        self.prepare(m, k)
        chunks = vm.cdiv(k, bn)
        bounds: tuple[Any, ...] = (chunks,)
        if spec.runtime_step:  # up from the first chunk, or down from the last
            s = self.kw["s"]
            bounds = (select(s > 0, 0, chunks - 1), select(s > 0, chunks, -1), s)
        for kk in vm.range(*bounds, stages=spec.stages):
            values = self.inputs_end(self.inputs_begin(r0, kk * bn, m, k))
            last = self.ops(values)
            fn = {"add": vm.add, "max": vm.maximum, "min": vm.minimum}[spec.accumulate]
            fn(acc, last, out=acc)
            if self.pending:
                vm.sync()
        if shape == "col":
            self.store(acc, self.out_view(vm.cdiv(m, bm), bn), [bi, 0], shape)
        else:
            cols = bn if shape == "full" else 1
            self.store(acc, self.out_view(m, cols), [r0, 0], shape)

    def dot(self) -> None:
        spec = self.spec
        a_in, b_in = spec.a, spec.b
        bm, bn = spec.tile
        bk = spec.bk
        m, n, k = self.kw["m"], self.kw["n"], self.kw["k"]
        adt = nm.type_by_name(a_in.dtype)
        bdt = nm.type_by_name(b_in.dtype)
        vm.set_grid(vm.cdiv(n, bn), vm.cdiv(m, bm))
        bi, bj = vm.block_index(1), vm.block_index(0)
        r0, c0 = bi * bm, bj * bn
        lay = None
        if spec.mma is not None:
            lay = block_mma_layouts(bm, bn, bk, spec.mma[0], spec.mma[1], adt, mma_shape(adt))
        acc_type = float32 if adt.is_float else int32
        acc = vm.register_tensor(acc_type, [bm, bn], lay.c if lay else None, init=0)
        ga = vm.global_view(self.kw["a"], [m, k])
        if spec.b_packed:
            gb = vm.global_view(self.kw["b"], [n, k * bdt.nbits // 8])
        else:
            gb = vm.global_view(self.kw["b"], [k, n])
        sa = sb = sw = None
        if a_in.path == "async":
            sa = vm.shared_tensor(adt, [bm, bk], _smem_layout(a_in.smem, bm, bk, adt))
        if spec.b_packed:
            sw = vm.shared_tensor(adt, [bn, bk], _smem_layout(b_in.smem, bn, bk, adt))
        elif b_in.path == "async":
            sb = vm.shared_tensor(adt, [bk, bn], _smem_layout(b_in.smem, bk, bn, adt))
        self.shared += [s for s in (sa, sb, sw) if s is not None]
        threads = 32 * spec.warps
        for kk in vm.range(vm.cdiv(k, bk), stages=spec.stages):
            if sa is not None:
                vm.copy_async(sa, ga, [r0, kk * bk])
            if sb is not None:
                vm.copy_async(sb, gb, [kk * bk, c0])
            if sa is not None or sb is not None:
                vm.commit_group()
            ta = tb = None
            if sa is None:
                ta = vm.load_global(ga, [r0, kk * bk], [bm, bk], lay.a if lay else None)
            if spec.b_packed:
                nbytes = bk * bdt.nbits // 8
                byte_lay = value_lay = None
                if lay is not None:
                    tpr = threads // bn
                    byte_lay = vm.spatial(bn, tpr).local(1, nbytes // tpr)
                    value_lay = vm.spatial(bn, tpr).local(1, bk // tpr)
                raw = vm.load_global(gb, [c0, kk * nbytes], [bn, nbytes], byte_lay)
                vm.store_shared(sw, vm.cast(vm.view(raw, bdt, value_lay), adt))
            elif sb is None:
                tb = vm.load_global(gb, [kk * bk, c0], [bk, bn], lay.b if lay else None)
            if sa is not None or sb is not None:
                vm.wait_group(0)
            if sa is not None or sb is not None or sw is not None:
                vm.sync()
            if sa is not None:
                ta = vm.load_shared(sa, lay.a if lay else None)
            if sb is not None:
                tb = vm.load_shared(sb, lay.b if lay else None)
            if sw is not None:
                tb = vm.transpose(vm.load_shared(sw, permute(lay.b, [1, 0]) if lay else None))
            vm.dot(ta, tb, acc, out=acc)
            if sa is not None or sb is not None or sw is not None:
                vm.sync()
        self.full = lay.c if lay else None
        values = [acc]
        for i, inp in enumerate(spec.inputs):
            g = self._global(f"x{i}", inp, m, n)
            raw = vm.load_global(g, self._offsets(inp, r0, c0), self._tile_shape(inp),
                                 self._value_layout(inp))
            values.append(self._finish(inp, raw))
        last = self.ops(values)
        shape = _final_shape(spec)
        odt = nm.type_by_name(spec.out_dtype)
        if shape == "full":
            self.store(last, self.out_view(m, n),
                       [r0, c0 * odt.nbits // 8 if is_packed(odt) else c0], shape)
        elif shape == "row":
            self.store(last, self.out_view(m, vm.cdiv(n, bn)), [r0, bj], shape)
        else:
            self.store(last, self.out_view(vm.cdiv(m, bm), n), [bi, c0], shape)


def _final_shape(spec: Spec) -> str:
    return analyze(spec)[-1].shape


def _apply(op: Op, values: list[Any]) -> Any:
    """One op of the chain on the traced tiles."""
    args = [values[i] for i in op.args]
    if op.op == "cast":
        return vm.cast(args[0], nm.type_by_name(op.dtype))
    if op.op == "bitcast":
        return vm.view(args[0], nm.type_by_name(op.dtype))
    if op.op in ("neg", "abs", "exp", "sqrt"):
        return getattr(vm, op.op)(args[0])
    if op.op in ("add", "sub", "mul", "div", "mod", "max", "min"):
        fn = {"max": vm.maximum, "min": vm.minimum}.get(op.op) or getattr(vm, op.op)
        other = op.scalar if op.scalar is not None else args[1]
        return fn(args[0], other)
    if op.op == "select":
        cmp = getattr(vm, op.cmp)
        if op.scalar is not None:
            return vm.where(cmp(args[0], op.scalar), args[1], args[2])
        return vm.where(cmp(args[0], args[1]), args[2], args[3])
    if op.op == "fma":
        return vm.fma(args[0], args[1], args[2])
    if op.op == "reduce":
        return vm.reduce(args[0], op.dim, op.reduce, keepdims=True)
    raise ValueError(f"unknown op {op.op}")

