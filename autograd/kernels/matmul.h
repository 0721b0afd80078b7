#pragma once
// Matrix products as forward/backward pairs over kern::sgemm (autograd/kernels/blas.h).
#include <cstdint>

#include "autograd/kernels/blas.h"

namespace tapelm::kern {

/// One matmul: C = op(A) · op(B), op(X) = Xᵀ when its flag is set; `batch` independent products
/// whose operands start sa, sb, sc floats apart. With b_shared, B is one matrix for all the rows
/// of A (then batch = 1, sa = sb = 0, and M counts every row of A).
struct MatmulShape {
  int64_t batch, M, N, K;
  bool ta, tb;
  bool b_shared;
  int64_t lda, ldb;  // row strides of A and B as stored (A: a1, B: b1)
  int64_t sa, sb;    // floats between batches of A and of B (0 when b_shared)
  int64_t sc;        // floats between batches of C: M * N
};

/// c = op(a) · op(b)
///   c: [batch, M, N]   a: [batch, M, K] ([batch, K, M] if ta)   b: [batch, K, N] ([batch, N, K] if tb);
///   with b_shared, a: [M, K] and b: [K, N] ([N, K] if tb)
void matmul_fwd(float* c, const float* a, const float* b, const MatmulShape& s);
/// da += dc · op(b)ᵀ (transposed back if ta), db += op(a)ᵀ · dc (likewise); either may be null.
///   dc: as c   da, a: as a   db, b: as b
void matmul_bwd(float* da, float* db, const float* dc, const float* a, const float* b, const MatmulShape& s);

/// y = x · wᵀ + b   (b may be null)
///   y: [rows, out]   x: [rows, in]   w: [out, in]   b: [out]
void linear_fwd(float* y, const float* x, const float* w, const float* b, int64_t rows, int64_t in, int64_t out);
/// How many weights linear_many_fwd takes at once.
constexpr int kMaxLinearsAtOnce = kMaxXwtProducts;
/// y_i = x·w_iᵀ + b_i for n ≤ kMaxLinearsAtOnce weights of the same x, in one pass over the
/// weights when x has at most 16 rows (see sgemm_xwt_many); bit-identical to n linear_fwd
/// calls for more rows.
///   ys[i]: [rows, outs[i]]   x: [rows, in]   ws[i]: [outs[i], in]   bs[i]: [outs[i]] or null
void linear_many_fwd(float* const* ys, const float* x, const float* const* ws, const float* const* bs, const int64_t* outs,
                     int n, int64_t rows, int64_t in);
/// dx += dy · w, dw += dyᵀ · x, db += Σ_rows dy; any may be null.
///   dx, x: [rows, in]   dw, w: [out, in]   db: [out]   dy: [rows, out]
void linear_bwd(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w, int64_t rows,
                int64_t in, int64_t out);

/// linear_fwd with x and w in bf16 on bf16 instructions (gemm_bf16): y = x·wᵀ + b, f32
/// accumulation, y and b f32.
///   y: [rows, out]   x: [rows, in]   w: [out, in]   b: [out] or null
void linear_fwd_bf16(float* y, const uint16_t* x, const uint16_t* w, const float* b, int64_t rows,
                     int64_t in, int64_t out);
/// Its backward: dy rounded to bf16 once for both products, dx += bf16(dy)·w, dw += bf16(dy)ᵀ·x;
/// db += Σ_rows dy in f32 (a reduction, not a product). Any gradient may be null.
///   dx: [rows, in]   dw: [out, in]   db: [out]   dy: [rows, out]   x, w as in linear_fwd_bf16
void linear_bwd_bf16(float* dx, float* dw, float* db, const float* dy, const uint16_t* x,
                     const uint16_t* w, int64_t rows, int64_t in, int64_t out);

/// Wall seconds spent in the linear kernels above (linear_fwd, linear_many_fwd, linear_bwd and their
/// bf16 forms: the products, bias, and the bf16 rounding of the output gradient) since the process
/// started, counting calls made outside OpenMP parallel regions: the linear layers' share of a
/// training step, for the benchmark (what bf16 products shorten).
double linear_kernel_seconds();

}  // namespace tapelm::kern
