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

/// adamw_update with the moments held in bfloat16: each m, v is widened, updated and used in
/// float32 exactly as adamw_update does (so w moves as it would from those moments), then stored
/// rounded stochastically to one of its two bf16 neighbours, up with probability equal to the
/// distance from the lower one over the gap: unbiased, so the small increments of v (1 - beta2 of
/// it, below bf16's half-ulp of 2^-9 when beta2 > 0.998) add up in expectation instead of being
/// rounded away every step. The random bits of element i are splitmix64(key + (i + 1) gamma):
/// the same whatever the thread count or the rank that updates it.
///   w, g: [n];  m, v: [n] bf16 bits
void adamw_update_bf16(float* w, const float* g, uint16_t* m, uint16_t* v, int64_t n, const AdamWScalars& s,
                       uint64_t key);

/// x rounded to bfloat16 stochastically with 16 random bits r (non-finite x: to nearest).
uint16_t bf16_round_stochastic(float x, uint32_t r);

/// SGD without momentum: w −= lr (g + wd·w)   (wd applied only when `decay`)
///   w, g: [n]
void sgd_update(float* w, const float* g, int64_t n, float neg_lr, bool decay, float wd);

/// SGD with momentum: d = g + wd·w; buf = fresh ? d : mu·buf + keep·d;
/// w −= lr · (nesterov ? d + mu·buf : buf)
///   w, g, buf: [n]
void sgd_momentum_update(float* w, const float* g, float* buf, int64_t n, float neg_lr, bool decay, float wd,
                         float mu, float keep, bool fresh, bool nesterov);

}  // namespace tapelm::kern
