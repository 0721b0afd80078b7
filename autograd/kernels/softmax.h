#pragma once
// Row softmax, log-softmax and the fused softmax-cross-entropy, over the last axis of [N, C].
#include <cstdint>

#include "autograd/kernels/common.h"

namespace tapelm::kern {

/// y = softmax(x) per row; y may alias x.
///   y, x: [N, C]
void softmax_fwd(float* y, const float* x, int64_t N, int64_t C);
/// dx += y * (dy - <dy, y>) per row.
///   dx, dy, y: [N, C]   (y: the forward's output)
void softmax_bwd(float* dx, const float* dy, const float* y, int64_t N, int64_t C);

/// y = x - logsumexp(x) per row.
///   y, x: [N, C]
void log_softmax_fwd(float* y, const float* x, int64_t N, int64_t C);
/// dx += dy - exp(y) * sum(dy) per row.
///   dx, dy, y: [N, C]   (y: the forward's output)
void log_softmax_bwd(float* dx, const float* dy, const float* y, int64_t N, int64_t C);

/// Per-row loss lse - logits[target] (0 where target == -1) and the row's log-sum-exp; returns
/// the number of counted rows.
///   losses, lse: [N] (written)   logits: [N, V]   targets: [N], in [-1, V)
int64_t cross_entropy_fwd(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V);
/// dlogits += scale * (softmax - onehot(target)) on counted rows.
///   dlogits, logits: [N, V]   lse: [N] (from forward)   targets: [N]
void cross_entropy_bwd(float* dlogits, const float* logits, const float* lse, const int32_t* targets, int64_t N,
                       int64_t V, float scale);

/// Knowledge distillation's soft-target loss per row (Hinton et al. 2015): T²·KL(softmax(t/T) ‖
/// softmax(s/T)) for student logits s and teacher logits t (0 where target == -1), with both rows'
/// log-sum-exp of the logits divided by T; returns the number of counted rows.
///   losses, lse_s, lse_t: [N] (written)   s, t: [N, V]   targets: [N], in [-1, V)
int64_t distill_kl_fwd(float* losses, float* lse_s, float* lse_t, const float* s, const float* t, const int32_t* targets,
                       int64_t N, int64_t V, float T);
/// ds += scale · T · (softmax(s/T) − softmax(t/T)) on counted rows.
///   ds, s, t: [N, V]   lse_s, lse_t: [N] (from forward)   targets: [N]
void distill_kl_bwd(float* ds, const float* s, const float* t, const float* lse_s, const float* lse_t,
                    const int32_t* targets, int64_t N, int64_t V, float T, float scale);

}  // namespace tapelm::kern
