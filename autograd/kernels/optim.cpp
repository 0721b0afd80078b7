#include "autograd/kernels/optim.h"

#include <cmath>

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
