"""CUDA of elementwise arithmetic (:mod:`lowvm.instructions.elementwise`): packed
half2/bfloat162 math where :mod:`lowvm.codegen.packed_math` applies, else per element.

Every result is rounded to its type, as in the interpreter: float32 ``add``/``sub``/``mul``
are written ``__fadd_rn``/``__fsub_rn``/``__fmul_rn``, which the compiler never fuses into
an ``fma`` with a neighbouring multiply or add (``a * b`` then ``+ c`` would otherwise
become one ``FFMA`` that skips the product's rounding). Results of narrower float types
are computed in float and converted, and the conversion already keeps them apart."""

from __future__ import annotations

from lowvm.codegen.context import CudaContext
from lowvm.codegen.emitters.registry import register_emitter
from lowvm.codegen.packed_math import emit_packed_elementwise
from lowvm.dtypes import float32, int32
from lowvm.expr import const_value
from lowvm.instructions.base import gather_map
from lowvm.instructions.elementwise import COMPARISONS, Elementwise
from lowvm.ir import BOOL, ProgramError, RegisterTensor

__all__ = ["emit_elementwise"]


@register_emitter(Elementwise)
def emit_elementwise(inst: Elementwise, cg: CudaContext) -> None:

    if emit_packed_elementwise(inst, cg):
        return
    cg.line(f"// {inst}")
    is_float = any(
        (isinstance(a, RegisterTensor) and a.dtype.is_float)
        or (not isinstance(a, RegisterTensor) and isinstance(const_value(a), float))
        for a in inst.args
    )
    # an int32 result from float math (a float scalar): float32 would round ints
    # beyond 2^24 before the op; double holds them and the scalar exactly
    wide = (is_float and inst.op not in COMPARISONS and inst.out.dtype == int32)
    cg.line("#pragma unroll")
    with cg.block(f"for (int l = 0; l < {inst.out.layout.local_size}; ++l)"):
        values = []
        for a in inst.args:
            if isinstance(a, RegisterTensor):
                value = cg.get(a, _local_of(cg, inst.out, a))
                values.append(f"(double)({value})" if wide and a.dtype != BOOL else value)
            else:
                values.append(f"(double)({cg.expr(a)})" if wide else cg.expr(a))
        expr = _c_op(inst.op, values, is_float, wide, rn=inst.out.dtype == float32)
        if wide:
            cg.line(f"{cg.name(inst.out)}[l] = __double2int_rn({expr});")
            return
        result_float = is_float and inst.op not in COMPARISONS
        cg.line(cg.set(inst.out, "l", expr, result_float))


def _local_of(cg: CudaContext, out: RegisterTensor, operand: RegisterTensor) -> str:
    """The operand's local (a C expression in ``l``) feeding the result's local ``l``."""
    if operand.shape == out.shape and operand.layout == out.layout:
        return "l"
    table = gather_map(out, operand, "elementwise")
    if not (table == table[0]).all():
        raise ProgramError(
            f"lowering: the operand %{operand.name} reaches the result through different "
            "registers in different threads; give it the result's layout"
        )
    name = cg.fresh(f"map_{operand.name}")
    cg.line(f"const int {name}[{table.shape[1]}] = {{{', '.join(map(str, table[0]))}}};")
    return f"{name}[l]"


#: float32 arithmetic that the compiler may not contract into an fma
_ROUNDED = {"add": "__fadd_rn", "sub": "__fsub_rn", "mul": "__fmul_rn"}


def _c_op(op: str, v: list[str], is_float: bool, double: bool = False,
          rn: bool = False) -> str:
    f = is_float
    if rn and f and not double and op in _ROUNDED:
        return f"{_ROUNDED[op]}({v[0]}, {v[1]})"
    d = "" if double else "f"  # fmax (double) or fmaxf (float)
    table = {
        "neg": lambda: f"-({v[0]})",
        "abs": lambda: f"fabs{d}({v[0]})" if f else f"abs({v[0]})",
        "exp": lambda: f"expf({v[0]})",
        "sqrt": lambda: f"sqrtf({v[0]})",
        "add": lambda: f"({v[0]}) + ({v[1]})",
        "sub": lambda: f"({v[0]}) - ({v[1]})",
        "mul": lambda: f"({v[0]}) * ({v[1]})",
        "div": lambda: f"({v[0]}) / ({v[1]})",
        "mod": lambda: f"({v[0]}) % ({v[1]})",
        "max": lambda: f"fmax{d}({v[0]}, {v[1]})" if f else f"max({v[0]}, {v[1]})",
        "min": lambda: f"fmin{d}({v[0]}, {v[1]})" if f else f"min({v[0]}, {v[1]})",
        "lt": lambda: f"({v[0]}) < ({v[1]})",
        "le": lambda: f"({v[0]}) <= ({v[1]})",
        "gt": lambda: f"({v[0]}) > ({v[1]})",
        "ge": lambda: f"({v[0]}) >= ({v[1]})",
        "eq": lambda: f"({v[0]}) == ({v[1]})",
        "ne": lambda: f"({v[0]}) != ({v[1]})",
        "where": lambda: f"({v[0]}) ? ({v[1]}) : ({v[2]})",
        "fma": lambda: (f"fma{d}({v[0]}, {v[1]}, {v[2]})" if f
                        else f"({v[0]}) * ({v[1]}) + ({v[2]})"),
    }
    return table[op]()
