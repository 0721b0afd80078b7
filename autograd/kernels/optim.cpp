#include "autograd/kernels/optim.h"

#include <cmath>

#include "autograd/float16.h"
#include "autograd/splitmix.h"

// PyTorch rounds every op on its own except where its kernels fuse (add with alpha, addcmul use
// FMA), so contraction is off here and the fused ones are spelled std::fma.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace tapelm::kern {

void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    const float gi = g[i];
    const float mi = std::fma(s.c1, gi, m[i] * s.b1);       // exp_avg.mul_(b1).add_(g, alpha=1-b1)
    const float vi = std::fma(s.c2 * gi, gi, v[i] * s.b2);  // exp_avg_sq.mul_(b2).addcmul_(g, g, value=1-b2)
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    w[i] = w[i] * s.decay + (s.neg_step * mi) / denom;  // p.mul_(decay).addcdiv_(m, denom, value=-step_size)
  }
}

uint16_t bf16_round_stochastic(float x, uint32_t r) {
  if (!std::isfinite(x)) return f32_to_bf16(x);
  // adding r below the kept 16 bits carries into them with probability (low bits + r) >= 2^16,
  // i.e. low bits / 2^16: the distance to the lower neighbour over the gap (sign-magnitude, so
  // the same holds for negative x, rounded away from zero with that probability)
  const uint32_t u = float_bits(x) + (r & 0xFFFFu);
  return static_cast<uint16_t>(u >> 16);
}

void adamw_update_bf16(float* w, const float* g, uint16_t* m, uint16_t* v, int64_t n, const AdamWScalars& s,
                       uint64_t key) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    const float gi = g[i];
    const float mi = std::fma(s.c1, gi, bf16_to_f32(m[i]) * s.b1);
    const float vi = std::fma(s.c2 * gi, gi, bf16_to_f32(v[i]) * s.b2);
    const uint64_t r = splitmix64(key + static_cast<uint64_t>(i + 1) * kSplitmix64Gamma);
    m[i] = bf16_round_stochastic(mi, static_cast<uint32_t>(r));
    v[i] = bf16_round_stochastic(vi, static_cast<uint32_t>(r >> 16));
    const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    w[i] = w[i] * s.decay + (s.neg_step * mi) / denom;
  }
}

void sgd_update(float* w, const float* g, int64_t n, float neg_lr, bool decay, float wd) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    const float d = decay ? std::fma(wd, w[i], g[i]) : g[i];
    w[i] = std::fma(neg_lr, d, w[i]);
  }
}

void sgd_momentum_update(float* w, const float* g, float* buf, int64_t n, float neg_lr, bool decay, float wd,
                         float mu, float keep, bool fresh, bool nesterov) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    const float d = decay ? std::fma(wd, w[i], g[i]) : g[i];  // d_p = grad.add(p, alpha=wd)
    const float b = fresh ? d : std::fma(keep, d, buf[i] * mu);
    buf[i] = b;
    w[i] = std::fma(neg_lr, nesterov ? std::fma(mu, b, d) : b, w[i]);
  }
}

}  // namespace tapelm::kern
