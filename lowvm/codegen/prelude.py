"""Device helpers every generated kernel includes: packed bit fields and small floats.

Register tiles of types narrower than a byte (and the 8-bit small floats) live in
``lowvm_u32`` words as the same dense little-endian bit stream the interpreter uses, so
a ``view`` is a plain copy of bytes. The encode/decode helpers are the device twins of
:func:`lowvm.dtypes.encode`/``decode``: round to nearest even with ``rintf`` on exactly
scaled values, keep the sign of zero; overflow and inf saturate to the largest finite
value, except in the IEEE-like e5m2, where they are inf; NaN becomes the type's NaN code
with its sign (e4m3 ``S.1111.111``, e5m2 ``S.11111.10``), or +-0 in a type without one
(where the interpreter stops with an error instead).
"""

from __future__ import annotations

__all__ = ["PRELUDE"]

PRELUDE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
// fixed-width types without <stdint.h>, which NVRTC does not ship
typedef unsigned int lowvm_u32;
typedef unsigned long long lowvm_u64;
typedef long long lowvm_i64;
typedef unsigned char lowvm_u8;
typedef signed char lowvm_i8;

// a * b as 64 bits in one multiply (mul.wide.s32): written as (lowvm_i64)a * b, the
// compiler, knowing a >= 0, widens it unsigned and then needs a full 64-bit multiply
__device__ __forceinline__ lowvm_i64 lowvm_wide(int a, int b) {
  lowvm_i64 r;
  asm("mul.wide.s32 %0, %1, %2;" : "=l"(r) : "r"(a), "r"(b));
  return r;
}

// bits [pos, pos + width) of a packed little-endian bit stream held in 32-bit words
__device__ __forceinline__ lowvm_u32 lowvm_get_bits(const lowvm_u32* words, int pos, int width) {
  int w = pos >> 5, s = pos & 31;
  lowvm_u64 both = (lowvm_u64)words[w];
  if (s + width > 32) both |= (lowvm_u64)words[w + 1] << 32;
  return (lowvm_u32)(both >> s) & ((1u << width) - 1u);
}

__device__ __forceinline__ void lowvm_set_bits(lowvm_u32* words, int pos, int width, lowvm_u32 v) {
  int w = pos >> 5, s = pos & 31;
  lowvm_u32 mask = (1u << width) - 1u;
  words[w] = (words[w] & ~(mask << s)) | ((v & mask) << s);
  if (s + width > 32) {
    int hi = s + width - 32;
    lowvm_u32 hmask = (1u << hi) - 1u;
    words[w + 1] = (words[w + 1] & ~hmask) | ((v & mask) >> (32 - s));
  }
}

__device__ __forceinline__ int lowvm_sign_extend(lowvm_u32 code, int width) {
  return ((int)(code << (32 - width))) >> (32 - width);
}

// KIND: 0 finite-only (every code a number), 1 e4m3fn (S.1111.111 is NaN), 2 IEEE-like
template <int E, int M, int KIND>
__device__ __forceinline__ float lowvm_decode_float(lowvm_u32 code) {
  const int bias = (1 << (E - 1)) - 1;
  lowvm_u32 sign = (code >> (E + M)) & 1u;
  lowvm_u32 ex = (code >> M) & ((1u << E) - 1u);
  lowvm_u32 mant = code & ((1u << M) - 1u);
  float v;
  if (KIND == 1 && ex == (1u << E) - 1u && mant == (1u << M) - 1u) {
    v = __int_as_float(0x7fc00000);
  } else if (KIND == 2 && ex == (1u << E) - 1u) {
    v = mant ? __int_as_float(0x7fc00000) : __int_as_float(0x7f800000);
  } else if (ex == 0) {
    v = ldexpf((float)mant, 1 - bias - M);
  } else {
    v = ldexpf((float)(mant | (1u << M)), (int)ex - bias - M);
  }
  return sign ? -v : v;
}

template <int E, int M, int KIND>
__device__ __forceinline__ lowvm_u32 lowvm_encode_float(float x) {
  const int bias = (1 << (E - 1)) - 1;
  const lowvm_u32 max_code = KIND == 0 ? (1u << (E + M)) - 1u
                          : KIND == 1 ? (1u << (E + M)) - 2u
                                      : ((((1u << E) - 2u) << M) | ((1u << M) - 1u));
  const lowvm_u32 inf_code = ((1u << E) - 1u) << M;               // KIND 2 only
  lowvm_u32 sign = (__float_as_uint(x) >> 31) << (E + M);
  float a = fabsf(x);
  if (a != a) return KIND == 0 ? sign                               // NaN: no code
                    : sign | (KIND == 1 ? max_code + 1u : inf_code | (1u << (M - 1)));
  const float max_value = lowvm_decode_float<E, M, KIND>(max_code);
  if (a >= max_value) {
    // IEEE-like: from max + half an ulp on (the tie too: max's mantissa is odd), inf
    if (KIND == 2 && a >= ldexpf((float)((4u << M) - 1u), (1 << E) - 3 - bias - M)) {
      return sign | inf_code;
    }
    return sign | max_code;                                         // saturate (and inf)
  }
  if (a < ldexpf(1.0f, 1 - bias)) {                               // subnormal range
    lowvm_u32 m = (lowvm_u32)rintf(ldexpf(a, M - 1 + bias));
    return sign | m;                                              // m == 2^M is the min normal
  }
  int e = ilogbf(a);
  lowvm_u32 mant = (lowvm_u32)rintf(ldexpf(a, M - e));              // in [2^M, 2^(M+1)]
  lowvm_u32 code = ((lowvm_u32)(e + bias) << M) + (mant - (1u << M));
  return sign | (code > max_code ? max_code : code);
}

__device__ __forceinline__ int lowvm_float2int_sat(float x, int lo, int hi) {
  int v = __float2int_rn(x);
  return v < lo ? lo : (v > hi ? hi : v);
}

// wgmma shared memory matrix descriptor of a K-major operand with the 128-byte swizzle:
// start address >> 4 (bits 0-13), leading byte offset 16 (unused by this mode, bits
// 16-29), 8-row groups 1024 bytes apart (stride byte offset >> 4, bits 32-45), swizzle
// mode 1 = 128 bytes (bits 62-63)
__device__ __forceinline__ unsigned long long lowvm_wgmma_desc(unsigned addr) {
    return static_cast<unsigned long long>((addr & 0x3FFFFu) >> 4) | (1ull << 16)
           | (64ull << 32) | (1ull << 62);
}
"""
