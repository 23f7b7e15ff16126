"""Two-lane float16/bfloat16 arithmetic: ``__hadd2_rn``/``__hsub2_rn``/``__hmul2_rn`` on
pairs.

Why: an ``add``/``sub``/``mul`` of f16 tiles in the generic lowering converts each
element to float, computes and rounds back (three instructions per element); the
tensor-core dequantisation (``cast(q) * scale``) runs one per weight. With two
consecutive locals of the result in one 32-bit register, one ``HMUL2`` does two.

Exactness: the sum, difference or product of two f16 (or bf16) values, rounded once to
the type, is what the interpreter computes (exact float64 arithmetic, one rounding), and
what the IEEE ``.rn`` two-lane instructions compute. The ``_rn`` intrinsics are the ones
that say ``.rn``: plain ``__hmul2`` is ``mul.f16x2`` (and on sm_90 ``mul.bf16x2``), which
ptxas may fuse with a following ``add`` into one ``fma`` rounded once, so ``acc + x * x``
would skip the product's rounding the program asks for. ``fma`` is left to the generic
path.

Each operand pair must be either the operand's own aligned pair (one 32-bit load) or
one element used twice (a broadcast, e.g. a group scale shared by neighbours along K).
"""

from __future__ import annotations

from lowvm.codegen.context import CudaContext
from lowvm.dtypes import bfloat16, float16
from lowvm.instructions.base import gather_map
from lowvm.ir import RegisterTensor

__all__ = ["emit_packed_elementwise"]

_OPS = {"add": "__hadd2_rn", "sub": "__hsub2_rn", "mul": "__hmul2_rn"}
_PAIR = {float16: ("__half2", "__half2half2"), bfloat16: ("__nv_bfloat162", "__bfloat162bfloat162")}


def _pair_sources(out: RegisterTensor, operand: RegisterTensor) -> list[str] | None:
    """For each result pair, ``"pair:p"`` (locals p, p+1) or ``"dup:p"``; None if neither."""
    if operand.shape == out.shape and operand.layout == out.layout:
        return [f"pair:{2 * j}" for j in range(out.layout.local_size // 2)]
    table = gather_map(out, operand, "elementwise")
    if not (table == table[0]).all():
        return None
    row, kinds = table[0], []
    for j in range(0, len(row), 2):
        a, b = int(row[j]), int(row[j + 1])
        if b == a + 1 and a % 2 == 0:
            kinds.append(f"pair:{a}")
        elif a == b:
            kinds.append(f"dup:{a}")
        else:
            return None
    return kinds


def emit_packed_elementwise(inst, cg: CudaContext) -> bool:
    """Emit ``inst`` with two-lane instructions; False when it does not qualify."""
    out = inst.out
    if inst.op not in _OPS or out.dtype not in _PAIR or out.layout.local_size % 2:
        return False
    if not all(isinstance(a, RegisterTensor) and a.dtype == out.dtype for a in inst.args):
        return False
    sources = [_pair_sources(out, a) for a in inst.args]
    if any(s is None for s in sources):
        return False
    vec, dup = _PAIR[out.dtype]
    cg.line(f"// {inst}  (two lanes per instruction)")
    dst = f"reinterpret_cast<{vec}*>({cg.name(out)})"
    for j in range(out.layout.local_size // 2):
        operands = []
        for a, kinds in zip(inst.args, sources):
            kind, p = kinds[j].split(":")
            if kind == "pair":
                operands.append(f"reinterpret_cast<const {vec}*>({cg.name(a)})[{int(p) // 2}]")
            else:
                operands.append(f"{dup}({cg.raw_get(a, p)})")
        cg.line(f"{dst}[{j}] = {_OPS[inst.op]}({', '.join(operands)});")
    return True
