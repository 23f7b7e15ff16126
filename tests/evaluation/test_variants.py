"""Variant keys: what each names, and the mistakes refused with what is accepted."""

from __future__ import annotations

import pytest

from lowvm.evaluation import EvaluationError, parse_variant, parse_variants
from lowvm.evaluation.variants import DEFAULT_VARIANTS


def test_keys_name_a_type_and_method_or_a_budget():
    v = parse_variant("int3-gptq")
    assert (v.dtype, v.method, v.bits, v.label) == ("int3", "gptq", None, "int3 g128 gptq")
    assert v.needs_calibration
    v = parse_variant("uint4-rtn", group_size=64)
    assert (v.dtype, v.method, v.label, v.needs_calibration) == ("uint4", "rtn",
                                                                  "uint4 g64 rtn", False)
    v = parse_variant("bits3.5")
    assert (v.bits, v.dtype, v.label, v.needs_calibration) == (3.5, None, "3.5 bits g128", True)
    assert parse_variant("fp16").label == "float16"


@pytest.mark.parametrize("key, match", [("int9-rtn", "int9"), ("int4-awq", "rtn or gptq"),
                                        ("int4", "rtn or gptq"), ("bitsx", "'x'"),
                                        ("bits-1", "'-1'"), ("bits0", "'0'")])
def test_bad_keys_say_what_is_accepted(key, match):
    with pytest.raises(EvaluationError, match=match) as info:
        parse_variant(key)
    assert repr(key) in str(info.value)


def test_float16_comes_first_and_keys_are_not_repeated():
    assert [v.key for v in parse_variants("int4-rtn, bits3")] == ["fp16", "int4-rtn", "bits3"]
    assert [v.key for v in parse_variants(",".join(DEFAULT_VARIANTS))] == list(DEFAULT_VARIANTS)
    with pytest.raises(EvaluationError, match="repeat int4-rtn"):
        parse_variants("int4-rtn,fp16,int4-rtn")
