#pragma once
// LayerNorm and RMSNorm over the last axis of rows [N, C].
#include <cstdint>

#include "autograd/kernels/common.h"

namespace tapelm::kern {

/// out = (x - mean) * rstd * w + b per row; saves mean and rstd for backward (b may be null).
///   out, x: [N, C]   mean, rstd: [N] (written)   w, b: [C]
void layernorm_fwd(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                   int64_t N, int64_t C, float eps);
/// Adds into dx, dw, db (any may be null).
///   dx, dout, x: [N, C]   dw, db, w: [C]   mean, rstd: [N] (from forward)
void layernorm_bwd(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                   const float* mean, const float* rstd, int64_t N, int64_t C);

/// out = x * rstd * w per row, rstd = 1/sqrt(mean(x²) + eps); saves rstd for backward.
///   out, x: [N, C]   rstd: [N] (written)   w: [C]
void rmsnorm_fwd(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C, float eps);
/// Adds into dx, dw (either may be null).
///   dx, dout, x: [N, C]   dw, w: [C]   rstd: [N] (from forward)
void rmsnorm_bwd(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                 int64_t N, int64_t C);

}  // namespace tapelm::kern
