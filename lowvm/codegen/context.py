"""What instructions use to emit CUDA: names, C types, layout index math, element access.

A register tile becomes a per-thread array: native types (``__half``, ``float``,
``lowvm_i8``...) as arrays of that type, narrower types (and the 8-bit small floats) as
``lowvm_u32`` words holding the packed bit stream. Element ``l`` of a tile is read as a
*compute value* (``float`` for floats, ``int`` for integers) and written back rounded
to the tile's type, which is how every instruction stays type-generic.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from lowvm.codegen.tensor_maps import TensorMaps
from lowvm.dtypes import DType, bfloat16, float16, float32, int8, int32, uint8
from lowvm.expr import INT32_MAX, INT32_MIN, BinOp, Const, ExprLike, Select, UnaryOp, Var, as_expr
from lowvm.ir import BOOL, Program, ProgramError, RegisterTensor, SharedTensor
from lowvm.layouts import RegisterLayout

__all__ = ["CudaContext", "c_type", "c_size", "is_packed"]

_NATIVE = {float16: "__half", bfloat16: "__nv_bfloat16", float32: "float", int32: "int",
           int8: "lowvm_i8", uint8: "lowvm_u8", BOOL: "bool"}


def is_packed(dt: DType) -> bool:
    """True when register tiles of ``dt`` are stored as packed bits in 32-bit words."""
    return dt not in _NATIVE


def c_type(dt: DType) -> str:
    """The C type of one element in memory (native types only)."""
    try:
        return _NATIVE[dt]
    except KeyError:
        raise ProgramError(
            f"{dt.name} has no native C type; it lives packed in registers") from None


_NATIVE_BYTES = {"__half": 2, "__nv_bfloat16": 2, "float": 4, "int": 4, "lowvm_i8": 1,
                 "lowvm_u8": 1, "bool": 1}


def c_size(dt: DType) -> int:
    """Bytes of one element of a native type's C array."""
    return _NATIVE_BYTES[c_type(dt)]


def _float_kind(dt: DType) -> int:
    if dt.nbits == 8 and dt.exponent_bits == 4:
        return 1
    if dt.nbits == 8 and dt.exponent_bits == 5:
        return 2
    return 0


class CudaContext:
    """Accumulates the kernel body while instructions emit themselves."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.lines: list[str] = []
        self.depth = 1
        self.names: dict[RegisterTensor, str] = {}
        self.declared: list[str] = []
        self.shared_offsets: dict[SharedTensor, int] = {}
        self.scratch_offset = 0
        self.scratch_bytes = 0
        self.waits_prior_grid = False  # a wait_prior_grid was emitted
        #: bytes of ``__shared__`` variables the body declares (beside the dynamic buffer)
        self.static_shared_bytes = 0
        #: the signs of loop counters and lets (see :meth:`sign`) where they are known
        self.signs: dict[str, frozenset[str]] = {}
        #: the tensor cores read shared memory (wgmma): barriers first order the threads'
        #: shared writes before the async proxy's reads (set before the body is emitted)
        self.uses_async_proxy = False
        #: shared tiles placed where a freed one was: their allocation is a barrier
        self.reused_tiles: set[SharedTensor] = set()
        self.counter = 0
        #: the C expression of the executing thread's index
        self.thread = "tid"
        #: mbarriers or the copy engine are used (sm_90; the kernel declares their helpers)
        self.uses_tensor_copies = False
        #: the tensor maps the kernel's tensor copies read (extra kernel parameters)
        self.tensor_maps = TensorMaps(frozenset(p.name for p in program.params
                                                if not p.is_pointer))

    # text ---------------------------------------------------------------------------
    def line(self, text: str) -> None:
        """Append one line at the current indentation."""
        self.lines.append("  " * self.depth + text)

    @contextmanager
    def block(self, head: str) -> Iterator[None]:
        """``head {`` ... ``}`` with the body indented."""
        self.line(head + " {")
        self.depth += 1
        yield
        self.depth -= 1
        self.line("}")

    def fresh(self, hint: str) -> str:
        """A unique C identifier."""
        self.counter += 1
        return f"{hint}_{self.counter}"

    def barrier(self) -> None:
        """A barrier of the executing threads (the block)."""
        self.line("__syncthreads();")

    # scalars ------------------------------------------------------------------------
    def expr(self, e: ExprLike) -> str:
        """A uniform scalar expression as C."""
        e = as_expr(e)
        if isinstance(e, Const):
            v = e.value
            if isinstance(v, bool):
                return "true" if v else "false"
            if isinstance(v, float):
                if math.isinf(v):
                    return "(1.0f/0.0f)" if v > 0 else "(-1.0f/0.0f)"
                return f"{v!r}f"
            if not INT32_MIN <= v <= INT32_MAX:  # C would make its subexpression 64-bit
                raise ProgramError(f"the integer constant {v} in a runtime expression does "
                                   f"not fit int32 [{INT32_MIN}, {INT32_MAX}], the type of "
                                   "the kernel's index and loop arithmetic")
            return str(v)
        if isinstance(e, Var):
            return e.name
        if isinstance(e, BinOp):
            a, b = self.expr(e.lhs), self.expr(e.rhs)
            if e.op in ("min", "max"):
                return f"{e.op}({a}, {b})"
            return f"({a} {e.op} {b})"
        if isinstance(e, UnaryOp):
            return f"({e.op}{self.expr(e.operand)})"
        if isinstance(e, Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.then)} : {self.expr(e.other)})"
        raise ProgramError(f"cannot emit the expression {e!r}")

    def sign(self, e: ExprLike, positive: frozenset[frozenset[str]] = frozenset()
             ) -> frozenset[str] | None:
        """The sign of the uniform int32 scalar ``e`` as a set of variables: ``e`` is a
        value >= 0 times the product of their signs (the empty set: ``e >= 0``), or None
        where that is not known. Exact short of int32 overflow, which the checked
        interpreter reports. Block indices, constants >= 0 and the counters and lets in
        :attr:`signs` have known signs; any other variable is its own sign. Products of
        signs in ``positive`` are known to be positive (they count as the empty set)."""
        e = as_expr(e)
        if isinstance(e, Const):
            return frozenset() if not isinstance(e.value, bool) and e.value >= 0 else None
        sign: frozenset[str] | None = None
        if isinstance(e, Var):
            sign = (frozenset() if e.name.startswith(("blockIdx.", "gridDim."))
                    else self.signs.get(e.name, frozenset({e.name})))
        elif isinstance(e, BinOp):
            a, b = self.sign(e.lhs, positive), self.sign(e.rhs, positive)
            if a is None or b is None:
                return None
            if e.op in ("*", "/"):  # C's quotient has the sign of the product, or is 0
                sign = a ^ b
            elif e.op in ("%", ">>"):  # the sign of the left operand, or 0
                sign = a
            elif e.op in ("+", "min", "max") and a == b:
                sign = a
        elif isinstance(e, Select):
            a, b = self.sign(e.then, positive), self.sign(e.other, positive)
            sign = a if a == b else None
        return frozenset() if sign in positive else sign

    def is_nonnegative(self, e: ExprLike, sizes=()) -> bool:
        """Whether ``e`` is >= 0 by :meth:`sign`, where each of ``sizes`` may be taken
        to be >= 1 (a tensor with a size below 1 has nothing inside it): the product of
        the signs of each size is then positive."""
        positive = frozenset(sign for sign in map(self.sign, sizes) if sign)
        return self.sign(e, positive) == frozenset()

    # register tiles -----------------------------------------------------------------
    def name(self, tile: RegisterTensor) -> str:
        """The C array of a register tile (declared at the top of the kernel)."""
        if tile not in self.names:
            name = f"{tile.name}"
            self.names[tile] = name
            size = tile.layout.local_size
            if is_packed(tile.dtype):
                words = max(1, math.ceil(size * tile.dtype.nbits / 32))
                self.declared.append(
                    f"__align__(16) lowvm_u32 {name}[{words}];  // {tile.type_str()}")
            else:
                self.declared.append(f"__align__(16) {c_type(tile.dtype)} {name}[{size}];  // "
                                     f"{tile.type_str()}")
        return self.names[tile]

    @staticmethod
    def compute_type(dt: DType) -> str:
        """``float`` for float types, ``int`` for integers and bool."""
        return "float" if dt.is_float else "int"

    def get(self, tile: RegisterTensor, local: str) -> str:
        """Element ``local`` of ``tile`` as a compute value (C expression)."""
        name, dt = self.name(tile), tile.dtype
        if not is_packed(dt):
            if dt == float16:
                return f"__half2float({name}[{local}])"
            if dt == bfloat16:
                return f"__bfloat162float({name}[{local}])"
            if dt == BOOL or dt in (int8, uint8):
                return f"(int){name}[{local}]"
            return f"{name}[{local}]"
        code = f"lowvm_get_bits({name}, ({local}) * {dt.nbits}, {dt.nbits})"
        if dt.is_float:
            return (f"lowvm_decode_float<{dt.exponent_bits}, {dt.mantissa_bits}, "
                    f"{_float_kind(dt)}>({code})")
        if dt.kind == "int":
            return f"lowvm_sign_extend({code}, {dt.nbits})"
        return f"(int){code}"

    def set(self, tile: RegisterTensor, local: str, value: str, value_is_float: bool) -> str:
        """A statement storing compute value ``value`` into element ``local`` (rounded)."""
        name, dt = self.name(tile), tile.dtype
        if dt == BOOL:
            return f"{name}[{local}] = ({value}) != 0;"
        if dt.is_float:
            v = value if value_is_float else f"(float)({value})"
            if dt == float16:
                convert = "__float2half_rn" if value_is_float else "__int2half_rn"
                return f"{name}[{local}] = {convert}({value});"
            if dt == bfloat16:  # an int goes straight (float32 first rounds twice)
                convert = "__float2bfloat16_rn" if value_is_float else "__int2bfloat16_rn"
                return f"{name}[{local}] = {convert}({value});"
            if dt == float32:
                return f"{name}[{local}] = {v};"
            if not value_is_float:
                # an int beyond 2^24 rounded to float32 and then to a small float rounds
                # twice; rounding to odd first (truncate, then set the last bit when
                # inexact) makes the second rounding the only one
                rz = f"__int2float_rz({value})"
                v = (f"__int_as_float(__float_as_int({rz}) | "
                     f"(int)((long long){rz} != (long long)({value})))")
            code = (f"lowvm_encode_float<{dt.exponent_bits}, {dt.mantissa_bits}, "
                    f"{_float_kind(dt)}>({v})")
            return f"lowvm_set_bits({name}, ({local}) * {dt.nbits}, {dt.nbits}, {code});"
        lo, hi = int(dt.min_value), int(dt.max_value)
        v = f"lowvm_float2int_sat({value}, {lo}, {hi})" if value_is_float else value
        if dt == int32:
            return f"{name}[{local}] = {v};"
        if not value_is_float:
            v = f"min(max((int)({v}), {lo}), {hi})"
        if not is_packed(dt):
            return f"{name}[{local}] = ({c_type(dt)})({v});"
        return f"lowvm_set_bits({name}, ({local}) * {dt.nbits}, {dt.nbits}, (lowvm_u32)({v}));"

    def raw_get(self, tile: RegisterTensor, local: str) -> str:
        """Element ``local`` in its memory type (native tiles only)."""
        return f"{self.name(tile)}[{local}]"

    # layouts ------------------------------------------------------------------------
    @staticmethod
    def index(layout: RegisterLayout, dim: int, local: str = "l", thread: str = "tid") -> str:
        """C expression of the logical index along ``dim`` held at (thread, local)."""
        terms: list[str] = []
        for entries, sizes, var in ((layout.spatial_modes, layout.spatial_sizes, thread),
                                    (layout.local_modes, layout.local_sizes, local)):
            stride = 1
            for m, size in zip(reversed(entries), reversed(sizes)):
                if m >= 0 and layout.mode_dims[m] == dim:
                    digit = f"(({var} / {stride}) % {size})" if stride > 1 else f"({var} % {size})"
                    scale = layout.mode_strides[m]
                    terms.append(digit if scale == 1 else f"{digit} * {scale}")
                stride *= size
        return " + ".join(terms) if terms else "0"

    @staticmethod
    def row_major_stride(shape: tuple[int, ...], dim: int) -> int:
        """Elements between neighbours along ``dim`` of a row-major ``shape``."""
        return math.prod(shape[dim + 1:])

    def flat_index(self, layout: RegisterLayout, shape: tuple[int, ...]) -> str:
        """C expression of the row-major flat index held at (``tid``, ``l``)."""
        return " + ".join(f"({self.index(layout, d)}) * {self.row_major_stride(shape, d)}"
                          for d in range(len(shape)))

    # shared memory ------------------------------------------------------------------
    def shared_ref(self, tensor: SharedTensor, offset: str) -> str:
        """An lvalue for element ``offset`` (after swizzle) of a shared tile."""
        base = self.shared_offsets[tensor]
        return f"reinterpret_cast<{c_type(tensor.dtype)}*>(lowvm_smem + {base})[{offset}]"

    def shared_offset(self, tensor: SharedTensor, index: list[str]) -> str:
        """The swizzled element offset of ``index`` in a shared tile."""
        lay = tensor.layout
        linear = " + ".join(f"({i}) * {s}" for i, s in zip(index, lay.strides) if s != 0) or "0"
        if lay.swizzle is None:
            return linear
        sw = lay.swizzle
        mask = ((1 << sw.bits) - 1) << sw.base
        return f"(({linear}) ^ ((({linear}) >> {sw.shift}) & {mask}))"

    def scratch(self, nbytes: int) -> str:
        """A byte offset of scratch shared memory (shared by all instructions needing it)."""
        self.scratch_bytes = max(self.scratch_bytes, nbytes)
        return "lowvm_scratch"
