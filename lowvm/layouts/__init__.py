"""The layout algebra: register, shared-memory and global layouts, MMA operand layouts."""

from lowvm.layouts.global_layout import (
    GlobalLayout,
    global_column_major,
    global_row_major,
    global_strided,
)
from lowvm.layouts.mma import MMA_SHAPES, MmaLayouts, WgmmaLayouts, mma_layouts, wgmma_layouts
from lowvm.layouts.register import (
    RegisterLayout,
    column_local,
    column_spatial,
    compose,
    concat,
    local,
    local_permutation,
    permute,
    reduce,
    spatial,
    split_pairs,
)
from lowvm.layouts.shared import (
    SharedLayout,
    Swizzle,
    shared_column_major,
    shared_row_major,
    shared_strided,
    swizzle_128b,
    tma_layout,
    tma_swizzle_bytes,
)
from lowvm.layouts.visualize import visualize

__all__ = [
    "RegisterLayout",
    "local",
    "spatial",
    "column_local",
    "column_spatial",
    "compose",
    "reduce",
    "concat",
    "permute",
    "split_pairs",
    "local_permutation",
    "MmaLayouts",
    "mma_layouts",
    "wgmma_layouts",
    "WgmmaLayouts",
    "MMA_SHAPES",
    "SharedLayout",
    "Swizzle",
    "shared_row_major",
    "shared_column_major",
    "shared_strided",
    "swizzle_128b",
    "tma_layout",
    "tma_swizzle_bytes",
    "GlobalLayout",
    "global_row_major",
    "global_column_major",
    "global_strided",
    "visualize",
]
