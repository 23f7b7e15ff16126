"""The fuzz generator: deterministic, valid by construction, covering the language."""

from __future__ import annotations

import collections
import dataclasses
import json

import numpy as np
import pytest

from lowvm.dtypes import all_dtypes, decode, round_to
from lowvm.fuzz import numerics as nm
from lowvm.fuzz.analysis import Invalid, analyze
from lowvm.fuzz.build import program_name
from lowvm.fuzz.generate import generate, make_arrays, validate
from lowvm.fuzz.spec import Op, dumps, features, spec_from_json, spec_to_json

SPECS = [generate(7, i) for i in range(400)]


def test_same_seed_same_programs_and_data():
    again = [generate(7, i) for i in range(50)]
    assert [dumps(s) for s in again] == [dumps(s) for s in SPECS[:50]]
    a, b = make_arrays(SPECS[3]), make_arrays(SPECS[3])
    assert all(np.array_equal(x, y) for x, y in zip(a.values, b.values))
    assert [dumps(generate(8, i)) for i in range(20)] != [dumps(s) for s in SPECS[:20]]


def test_shared_structures_differ_only_in_data():
    group = [generate(3, i, share=4) for i in range(8)]
    assert len({program_name(s) for s in group[:4]}) == 1
    assert program_name(group[0]) != program_name(group[4])
    assert len({(s.extent, s.data_seed) for s in group[:4]}) == 4


def test_every_spec_is_valid_and_round_trips_through_json():
    for spec in SPECS:
        validate(spec)
        assert spec_from_json(json.loads(dumps(spec))) == spec
        assert spec_from_json(spec_to_json(spec)).structure() == spec.structure()


def test_coverage_of_types_and_features():
    seen = collections.Counter(f for s in SPECS for f in features(s))
    for dt in all_dtypes():
        assert seen[f"type:{dt.name}"] > 0, dt.name
    for feature in ("family:tile", "family:loop", "family:dot", "layout:explicit",
                    "layout:inferred", "path:async", "path:shared", "smem:swizzle",
                    "smem:pad", "smem:pad1", "partial_tile", "dot:packed_b",
                    "out_path:shared", "input_shape:row", "input_shape:col", "op:exp",
                    "op:sqrt", "op:div", "op:mod", "op:fma", "op:bitcast",
                    "op:reduce:sum", "op:reduce:max", "op:reduce:min", "op:select"):
        assert any(k.startswith(feature) for k in seen), feature
    assert any(k.startswith("stages:") and int(k.split(":")[1]) >= 2 for k in seen)
    assert seen["warps:1"] and seen["warps:2"] and seen["warps:4"]


def test_analysis_refuses_what_would_be_undefined():
    spec = next(s for s in SPECS if s.family == "tile" and
                nm.type_by_name(s.inputs[0].dtype).kind == "int" and s.inputs[0].shape == "full")
    inp = dataclasses.replace(spec.inputs[0], lo=-8.0, hi=7.0)
    small = dataclasses.replace(spec, inputs=(inp,), ops=(), out_dtype="float32")
    with pytest.raises(Invalid, match="divisor"):
        analyze(dataclasses.replace(small, ops=(Op("div", (0, 0)),)))
    typed = dataclasses.replace(small, inputs=(dataclasses.replace(inp, dtype="int4"),))
    with pytest.raises(Invalid, match="overflow"):
        analyze(dataclasses.replace(typed, ops=(Op("mul", (0, 0)),)))


def test_fuzzer_numerics_agree_with_lowvm_dtypes():
    """Two implementations of one documented format: each checks the other."""
    rng = np.random.default_rng(0)
    for dt in all_dtypes():
        x = rng.standard_normal(4000) * 2.0 ** rng.integers(-20, 36, 4000)
        if dt.nbits <= 8:
            table = nm.code_values(dt)
            assert np.array_equal(table, decode(np.arange(2**dt.nbits), dt), equal_nan=True)
            values = nm.finite_values(dt)
            x = np.concatenate([x, (values[1:] + values[:-1]) / 2, values * 1.0000001])
        assert np.array_equal(nm.round_to_type(x, dt), round_to(x, dt)), dt.name
        assert nm.max_value(dt) == dt.max_value


def test_pack_rows_is_the_dense_little_endian_stream():
    from lowvm.dtypes import pack

    codes = np.random.default_rng(1).integers(0, 8, (3, 16))
    packed = nm.pack_rows(codes, 3)
    assert np.array_equal(packed, np.stack([pack(r.astype(np.uint8), "int3") for r in codes]))
    assert np.array_equal(nm.unpack_rows(packed, 3, 16), codes)
