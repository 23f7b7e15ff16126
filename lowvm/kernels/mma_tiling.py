"""Moved to :mod:`lowvm.layouts.mma_tiling` (the layout inference pass uses it too);
these names stay importable from here for the kernels."""

from lowvm.layouts.mma_tiling import BlockMmaLayouts, block_mma_layouts

__all__ = ["BlockMmaLayouts", "block_mma_layouts"]
