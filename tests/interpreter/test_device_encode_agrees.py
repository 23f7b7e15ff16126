"""The GPU's per-element conversion to small floats rounds as the interpreter does.

Generated kernels convert a ``float`` to a 3..8-bit float with the prelude's
``lowvm_encode_float`` (:mod:`lowvm.codegen.prelude`); the interpreter rounds with
:func:`lowvm.dtypes.encode`. The prelude's two templates are plain C++ apart from a few
CUDA names, so this test compiles them for the host (no GPU needed) and compares their
codes with ``encode`` for every small float type on inputs probing each rule: rounding
boundaries and ties, subnormals, overflow and the IEEE overflow threshold of e5m2, +-inf
and NaN of either sign.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from lowvm.codegen.prelude import PRELUDE
from lowvm.dtypes import DType, all_dtypes, decode, encode

SMALL_FLOATS = [d for d in all_dtypes() if d.is_float and d.nbits <= 8]

_HOST_SHIMS = r"""
#include <cmath>
#include <cstdio>
#include <cstring>
#define __device__
#define __forceinline__ inline
typedef unsigned int lowvm_u32;
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
"""


def _kind(d: DType) -> int:
    """The prelude's KIND of a small float (see lowvm.codegen.context)."""
    return 2 if d.has_inf else 1 if d.has_nan else 0


def _templates() -> str:
    """lowvm_decode_float and lowvm_encode_float, as the prelude defines them."""
    start = PRELUDE.index("// KIND: ")
    end = PRELUDE.index("__device__ __forceinline__ int lowvm_float2int_sat")
    text = PRELUDE[start:end]
    assert "lowvm_encode_float" in text and "lowvm_decode_float" in text
    return text


@pytest.fixture(scope="module")
def host_encoder(tmp_path_factory):
    """A host program: float32 bits on stdin, one line of codes per type on stdout."""
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no host C++ compiler (g++ or clang++) to build the prelude's encoder")
    calls = "\n".join(
        f'  for (int i = 0; i < n; ++i) std::printf("%u ", '
        f"lowvm_encode_float<{d.exponent_bits}, {d.mantissa_bits}, {_kind(d)}>(x[i]));\n"
        '  std::printf("\\n");' for d in SMALL_FLOATS)
    main = ("int main() {\n  static float x[1 << 16];\n"
            "  int n = (int)std::fread(x, 4, 1 << 16, stdin);\n" + calls + "\n  return 0;\n}\n")
    folder = tmp_path_factory.mktemp("prelude")
    source = folder / "encode.cpp"
    source.write_text(_HOST_SHIMS + _templates() + main)
    binary = folder / "encode"
    subprocess.run([compiler, "-O1", "-std=c++17", "-o", str(binary), str(source)],
                   check=True, capture_output=True)

    def run(x: np.ndarray) -> dict[DType, np.ndarray]:
        assert x.dtype == np.float32 and x.size <= 1 << 16
        out = subprocess.run([str(binary)], input=x.tobytes(), check=True,
                             capture_output=True).stdout.decode().splitlines()
        return {d: np.array(line.split(), dtype=np.int64) for d, line in zip(SMALL_FLOATS, out)}

    return run


def _probes(d: DType, rng: np.random.Generator) -> np.ndarray:
    """float32 inputs at every rounding boundary of ``d`` and beyond its range."""
    codes = np.arange(2 ** (d.nbits - 1))
    values = decode(codes, d).astype(np.float64)
    values = values[np.isfinite(values)]
    mids = (values[:-1] + values[1:]) / 2
    top = values[-1] + (values[-1] - values[-2]) / 2  # max + half an ulp
    parts = [values, mids, np.nextafter(mids.astype(np.float32), np.float32(np.inf)),
             np.nextafter(mids.astype(np.float32), np.float32(0)),
             [top, np.nextafter(np.float32(top), np.float32(0)), 2 * values[-1], 1e30,
              values[1] / 4, values[1] / 2, 0.0],
             rng.uniform(0, 1.2 * values[-1], 500)]
    x = np.concatenate([np.asarray(p, dtype=np.float32) for p in parts])
    return np.concatenate([x, -x, np.float32([np.inf, -np.inf])])


def test_prelude_encode_matches_the_interpreter(host_encoder):
    rng = np.random.default_rng(11)
    for d in SMALL_FLOATS:
        x = _probes(d, rng)
        got = host_encoder(x)[d]
        want = encode(x.astype(np.float64), d).astype(np.int64)
        bad = np.flatnonzero(got != want)
        assert bad.size == 0, (f"{d.name}: x={x[bad[0]]!r} gives {got[bad[0]]:#x} on the GPU, "
                               f"{want[bad[0]]:#x} in the interpreter")


def test_prelude_nan_codes(host_encoder):
    """NaN keeps its sign in the types with a NaN code; where there is none the
    interpreter refuses it (tested in test_dtypes) and the GPU writes +-0."""
    nan = np.float32(np.nan)
    x = np.array([nan, -nan], dtype=np.float32)
    codes = host_encoder(x)
    for d in SMALL_FLOATS:
        sign = 1 << (d.nbits - 1)
        if d.has_nan:
            want = encode(x.astype(np.float64), d).astype(np.int64)
            assert want[1] == want[0] | sign
        else:
            want = np.array([0, sign])
        np.testing.assert_array_equal(codes[d], want, err_msg=d.name)


def test_the_shims_cover_every_cuda_name_the_templates_use():
    """The host build replaces only these CUDA names; a new one must be added above."""
    used = set(re.findall(r"\b__\w+", _templates()))
    assert used <= {"__device__", "__forceinline__", "__float_as_uint", "__int_as_float"}
