"""The bit-manipulation cast's constants and the split_pairs span it reads best
(lowvm.layouts.cast_recipe); exactness of the casts built from them is proved in
tests/codegen/test_fast_cast.py."""

from __future__ import annotations

import numpy as np

import lowvm
from lowvm.dtypes import all_dtypes, bfloat16, float16
from lowvm.instructions.values import to_codes
from lowvm.layouts.cast_recipe import pair_span, recipe


def test_recipe_table():
    assert recipe(lowvm.int4, float16).magic == 0x6400
    assert recipe(lowvm.int7, bfloat16).magic == 0x4300
    assert recipe(lowvm.int8, bfloat16).method == "int8_f32"
    e5m2 = recipe(lowvm.float8_e5m2, float16)
    assert e5m2.shift == 0 and e5m2.scale == 0 and e5m2.special_max == 0  # just a shift
    assert recipe(lowvm.float8_e4m3, float16).special_max != 0
    for src in (lowvm.float7_e5m1, lowvm.float8_e6m1):  # overflow float16
        assert recipe(src, float16) is None and recipe(src, bfloat16) is not None
    assert recipe(lowvm.int4, lowvm.float32) is None
    assert recipe(lowvm.float16, bfloat16) is None


def test_constants_are_the_destination_bit_patterns():
    """The half2 constants of an integer recipe are the float16/bfloat16 patterns of
    ``2^P + b`` (t = 0) and of ``2^-t``, ``-(2^(P-t) + b)`` (t > 0), lane by lane."""
    for src in (lowvm.int3, lowvm.uint5, lowvm.int6):
        for dst in (float16, bfloat16):
            rec = recipe(src, dst)
            p, b = rec.mantissa, rec.sign_flip

            def pattern(v, dst=dst):
                return int(to_codes(np.array([v]), dst)[0])

            assert rec.int_finish(0) == ("hsub2", (pattern(2.0**p + b) * 0x10001,))
            kind, (mul, add) = rec.int_finish((1, 0))
            assert kind == "hfma2"
            assert mul == pattern(2.0**-1) | pattern(1.0) << 16
            assert add == pattern(-(2.0 ** (p - 1) + b)) | pattern(-(2.0**p + b)) << 16


def test_pair_span_puts_codes_16_bits_apart_for_both_activation_types():
    for src in all_dtypes():
        if src.nbits > 8:
            continue
        span = pair_span(src, float16, 64)
        assert span == pair_span(src, bfloat16, 64)
        if src.nbits == 8 or src in (lowvm.float7_e5m1,):
            assert span is None  # bytes need no reordering; e5m1 has no float16 recipe
            continue
        assert span is not None and src.nbits * span // 2 % 32 == 16
    assert pair_span(lowvm.int4, float16, 8) == 8
    assert pair_span(lowvm.int3, float16, 32) == 32
    assert pair_span(lowvm.int3, float16, 16) is None  # no whole run
    assert pair_span(lowvm.int4, lowvm.float32, 8) is None
