"""Round-to-nearest symmetric group quantisation on the host (numpy)."""

from __future__ import annotations

import numpy as np

from lowvm.dtypes import DType, encode
from lowvm.dtypes import dtype as as_dtype

__all__ = ["quantize_to_codes"]


def quantize_to_codes(weight: np.ndarray, wtype: DType | str, group: int
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Round-to-nearest symmetric group quantisation: ``(codes [N, K], scales [K/g, N])``."""
    wt = as_dtype(wtype)
    n, k = weight.shape
    groups = weight.reshape(n, k // group, group).astype(np.float64)
    scales = (np.abs(groups).max(axis=2) / wt.max_value).astype(np.float16)
    scales[scales == 0] = 1
    q = np.clip(groups / scales.astype(np.float64)[..., None], wt.min_value, wt.max_value)
    return encode(q.reshape(n, k), wt), np.ascontiguousarray(scales.T)
