"""``cast`` from 1..8-bit types to float16/bfloat16 by bit manipulation, two lanes at a time.

The generic lowering converts element by element through ``float`` (``lowvm_get_bits``,
``lowvm_decode_float``, a rounding conversion). Every value of a 1..8-bit type is exactly
representable in float16 (except e5m1/e6m1) and in bfloat16, so the conversion needs no
rounding at all: the code's bits are moved into a 16-bit pattern and one half2/bfloat162
instruction per *pair* of locals fixes the value. Three parts:

- the **recipe** (:mod:`lowvm.layouts.cast_recipe`, below both codegen and the kernels
  that store weights in its order): the constants of one (source, destination) pair;
- the **plan** (:mod:`~lowvm.codegen.fast_cast.plan`): the straight-line list of 32-bit
  operations (:class:`Op`) built from a recipe;
- the **operations table** (:mod:`~lowvm.codegen.fast_cast.operations`): each kind of
  operation's numpy meaning and CUDA template.

The same list is printed as CUDA (:func:`emit_fast_cast`) and executed in numpy
(:func:`simulate`), both through the one table, so the tests prove the emitted code
exact on every code without a GPU: model and kernel cannot drift.
"""

from lowvm.codegen.fast_cast.emit import emit_fast_cast
from lowvm.codegen.fast_cast.operations import OPERATIONS, Op, OpKind, simulate
from lowvm.codegen.fast_cast.plan import (
    HARDWARE_MIN_ARCH,
    LOP3_AND_XOR,
    plan_cast,
    plan_hardware_cast,
    plan_work,
)

__all__ = ["Op", "OpKind", "OPERATIONS", "plan_cast", "plan_hardware_cast", "plan_work",
           "simulate", "emit_fast_cast", "LOP3_AND_XOR", "HARDWARE_MIN_ARCH"]
