#pragma once
// splitmix64, the one 64-bit mixer in tapelm: Rng's stream (nn/rng.h), the counter-based dropout
// mask (autograd/kernels/common.h) and dist's checksums and per-rank seeds (train/dist.cpp).
#include <cstdint>

namespace tapelm {

/// The golden-ratio step between successive splitmix64 states.
inline constexpr uint64_t kSplitmix64Gamma = 0x9E3779B97F4A7C15ull;

/// splitmix64's output function (Stafford's Mix13, Vigna's constants): a bijection of 64 bits in
/// which every input bit reaches every output bit. The generator's n-th draw from `seed` is
/// splitmix64(seed + n * kSplitmix64Gamma), n = 1, 2, ...
constexpr uint64_t splitmix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace tapelm
