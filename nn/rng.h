#pragma once
// A small counter-based generator (splitmix64) whose whole state is one integer, so checkpoints
// can store it and every platform draws the same numbers.
#include <cmath>
#include <cstdint>

#include "autograd/splitmix.h"

namespace tapelm {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : state_(seed) {}
  uint64_t next_u64() { return splitmix64(state_ += kSplitmix64Gamma); }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * (1.0 / 9007199254740992.0); }
  /// Standard normal (Box-Muller; one draw per call, so the stream position is simple to reason about).
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  /// Uniform integer in [0, n) (n > 0), by rejection, so it is exactly uniform.
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next_u64();
    while (x >= limit);
    return x % n;
  }
  /// Moves the stream past n normal() draws (two 64-bit draws each) without making them.
  void skip_normals(uint64_t n) { state_ += 2 * n * kSplitmix64Gamma; }
  uint64_t state() const { return state_; }
  void set_state(uint64_t s) { state_ = s; }

 private:
  uint64_t state_;
};

}  // namespace tapelm
