#pragma once
// Sums: over one axis, over rows, over everything. Sums over everything and over rows are
// deterministic whatever the thread count (fixed chunks, column-owning threads).
#include <cstdint>

#include "autograd/kernels/common.h"

namespace tapelm::kern {

/// out[o,i] = scale * sum_j x[o,j,i]   (the sum and mean over one axis of x viewed as [O,N,I])
///   out: [O, I]   x: [O, N, I]
void sum_axis_fwd(float* out, const float* x, int64_t O, int64_t N, int64_t I, float scale);
/// dx[o,j,i] += scale * dout[o,i]
///   dx: [O, N, I]   dout: [O, I]
void sum_axis_bwd(float* dx, const float* dout, int64_t O, int64_t N, int64_t I, float scale);

/// Sum of all elements in double, in an order that does not depend on the thread count.
///   x: [n]
double sum_all(const float* x, int64_t n);
/// Backward of scale * sum_all: dx[i] += g, where g = dout * scale.
///   dx: [n]
void sum_all_bwd(float* dx, float g, int64_t n);
/// Sum of squares, likewise deterministic.
///   x: [n]
double sumsq_all(const float* x, int64_t n);

/// dst[c] += sum_r src[r,c]; deterministic whatever the thread count (a bias's gradient, a
/// broadcast row's).
///   dst: [C]   src: [R, C]
void colsum_add(float* dst, const float* src, int64_t R, int64_t C);

}  // namespace tapelm::kern
