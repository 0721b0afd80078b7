#pragma once
// What the kernels share: when to fork threads, the column block, and the vectorisable exp, erf
// and counter-based uniform used by several of them.
//
// Conventions for every kernel in autograd/kernels/: raw float pointers to contiguous row-major
// buffers, shapes given in the comment next to each declaration; a forward `_fwd` and its
// backward `_bwd` sit side by side; every backward ADDS into its gradient outputs (fan-out and
// weight tying need no special case), and a null gradient pointer means "not wanted". Threads
// split the axis whose output each one owns; nothing allocates per element.
#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "autograd/splitmix.h"

namespace tapelm::kern {

/// Below this many elements a kernel runs on one thread: forking costs more than it saves.
constexpr int64_t kParallelMin = 1 << 14;
/// Column block of the column-owning loops: one cache line of floats.
constexpr int64_t kColBlock = 16;

/// exp(x) for float, within 2 ulp, written so loops over it vectorise (glibc's expf does not
/// without -ffast-math). Inputs are clamped to [-87.3, 88.3].
inline float exp_approx(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
  // Round to nearest by adding and removing 1.5·2^23 (floorf would not vectorise).
  const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // ln 2 in two parts (Cephes)
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

#if defined(__AVX2__)
/// The sum of v's eight lanes by one fixed shuffle tree (a dot product's last step).
inline float hsum8(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}
#endif

/// erf(x) by Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7), the form PyTorch's
/// vectorised CPU kernels use; vectorises.
inline float erf_approx(float x) {
  const float a = x < 0 ? -x : x;
  const float t = 1.0f / (1.0f + 0.3275911f * a);
  const float poly = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  const float y = 1.0f - poly * exp_approx(-a * a);
  return x < 0 ? -y : y;
}

/// A uniform [0,1) float per (seed, i), the same on every thread count and in backward: the top
/// 24 bits of splitmix64's (i+1)-th draw from seed.
inline float hash_uniform(uint64_t seed, uint64_t i) {
  return static_cast<float>(splitmix64(seed + (i + 1) * kSplitmix64Gamma) >> 40) * (1.0f / 16777216.0f);
}

}  // namespace tapelm::kern
