#pragma once
// IEEE half (f16) and bfloat16 to and from float32, bit for bit as PyTorch converts: widening is
// exact; narrowing rounds to nearest, ties to even, overflows to infinity and keeps NaN a NaN.
#include <cstdint>
#include <cstring>

namespace tapelm {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// bfloat16 is float32's upper half.
inline float bf16_to_f32(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t f32_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  // round to nearest even on the 16 dropped bits (carries into the exponent as it should); NaN
  // stays NaN (quiet). A select, not a branch, so that loops over whole buffers vectorise.
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));  // inf, NaN
  if (exp != 0) return bits_float(sign | ((exp + 112) << 23) | (man << 13));
  // zero and subnormals: man · 2^-24, exact in float32
  const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504: inf
  if (a >= 0x38800000u) {  // a normal half: drop 13 mantissa bits, nearest even, rebias 127 -> 15
    const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
  }
  // a subnormal half (or zero): the value in units of 2^-24, nearest even
  const uint32_t exp = a >> 23;
  if (exp < 102) return sign;  // below half the smallest subnormal
  const uint32_t man = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exp;  // man · 2^(exp-150) / 2^-24 = man >> (126 - exp)
  const uint32_t q = man >> shift, rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1);
  const uint32_t rounded = q + ((rem > half || (rem == half && (q & 1u))) ? 1u : 0u);
  return static_cast<uint16_t>(sign | rounded);
}

}  // namespace tapelm
