"""The numpy entry point of round-to-nearest is the torch one, adapted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lowvm.dtypes import dtype as as_dtype
from lowvm.kernels.quantize import quantize_to_codes, round_to_nearest


@pytest.mark.parametrize("wtype", ["int2", "int4", "int8", "uint4", "e2m1", "e4m3"])
@pytest.mark.parametrize("group", [32, 128])
def test_quantize_to_codes_is_round_to_nearest(wtype, group):
    weight = np.random.default_rng(group).standard_normal((64, 256)).astype(np.float32)
    weight[:, :group] = 0  # all-zero groups get scale 1
    codes, scales = quantize_to_codes(weight, wtype, group)
    ref_codes, ref_scales, zeros = round_to_nearest(torch.from_numpy(weight),
                                                    as_dtype(wtype), group)
    assert zeros is None
    assert codes.dtype == np.uint8 and scales.dtype == np.float16
    assert codes.shape == (64, 256) and scales.shape == (256 // group, 64)
    np.testing.assert_array_equal(codes, ref_codes.numpy())
    np.testing.assert_array_equal(scales, ref_scales.numpy())
    assert (scales[0] == 1).all()


def test_symmetric_int1_is_refused_by_name():
    """int1 holds -1 and 0 only: a symmetric scale would be inf for every group."""
    from lowvm.errors import DTypeError

    w = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32)
    with pytest.raises(DTypeError, match="wtype=int1.*uint1"):
        quantize_to_codes(w, "int1", 64)
    codes, scales, zeros = round_to_nearest(torch.from_numpy(w), as_dtype("uint1"), 64,
                                            zero_point=True)
    assert torch.isfinite(scales.float()).all() and zeros is not None
