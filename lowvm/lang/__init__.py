"""The authoring front end: ``import lowvm.lang as vm`` and write ``@vm.program`` functions.

Everything a program needs is here: the decorator, parameter types (``vm.ptr[...]``,
``vm.dtype_of``, data types), layouts, and the instruction functions of :mod:`lowvm.lang.ops`.
"""

from lowvm.dtypes import *  # noqa: F403
from lowvm.lang.async_ops import *  # noqa: F403
from lowvm.lang.async_ops import __all__ as _async_ops
from lowvm.lang.builder import Pointer
from lowvm.lang.ops import *  # noqa: F403
from lowvm.lang.ops import __all__ as _ops
from lowvm.lang.program import ProgramTemplate, constexpr, dtype_of, program, ptr
from lowvm.layouts import (
    column_local,
    column_spatial,
    concat,
    local,
    mma_layouts,
    shared_column_major,
    shared_row_major,
    shared_strided,
    spatial,
    swizzle_128b,
    tma_layout,
)

__all__ = [
    "program", "ProgramTemplate", "ptr", "dtype_of", "constexpr", "Pointer",
    "local", "spatial", "column_local", "column_spatial", "concat", "mma_layouts",
    "shared_row_major", "shared_column_major", "shared_strided", "swizzle_128b",
    "tma_layout",
    *_ops, *_async_ops,
]  # fmt: skip
