#pragma once
// The optimizers' fused updates: one pass over a parameter, its gradient and its state, in
// float32 with the operation order of torch.optim's single-tensor implementations.
#include <cstdint>

#include "autograd/kernels/common.h"

namespace tapelm::kern {

/// AdamW's scalars for one step, already in float as torch's kernel sees them.
struct AdamWScalars {
  float decay;     // 1 - lr * weight_decay (1 for parameters that are not decayed)
  float b1, c1;    // beta1, 1 - beta1
  float b2, c2;    // beta2, 1 - beta2
  float bc2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
  float neg_step;  // -lr / (1 - beta1^t)
};

/// m = b1 m + c1 g;  v = b2 v + c2 g²;  w = w·decay − step · m / (sqrt(v)/bc2_sqrt + eps)
///   w, g, m, v: [n]
void adamw_update(float* w, const float* g, float* m, float* v, int64_t n, const AdamWScalars& s);

/// SGD without momentum: w −= lr (g + wd·w)   (wd applied only when `decay`)
///   w, g: [n]
void sgd_update(float* w, const float* g, int64_t n, float neg_lr, bool decay, float wd);

/// SGD with momentum: d = g + wd·w; buf = fresh ? d : mu·buf + keep·d;
/// w −= lr · (nesterov ? d + mu·buf : buf)
///   w, g, buf: [n]
void sgd_momentum_update(float* w, const float* g, float* buf, int64_t n, float neg_lr, bool decay, float wd,
                         float mu, float keep, bool fresh, bool nesterov);

}  // namespace tapelm::kern
