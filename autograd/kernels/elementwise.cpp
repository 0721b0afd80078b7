#include "autograd/kernels/elementwise.h"

#include <cmath>

#include "autograd/kernels/reduce.h"

namespace tapelm::kern {

// ---- binary, with broadcasting of one operand ----------------------------------------------

namespace {

// fn(i, k): i indexes the full operand and the output, k the small operand.
template <class Fn>
void for_each_pair(Bcast m, int64_t n, int64_t P, Fn fn) {
  switch (m) {
    case Bcast::Same:
#pragma omp parallel for simd schedule(static) if (parallel: n >= kParallelMin)
      for (int64_t i = 0; i < n; i++) fn(i, i);
      break;
    case Bcast::Scalar:
#pragma omp parallel for simd schedule(static) if (parallel: n >= kParallelMin)
      for (int64_t i = 0; i < n; i++) fn(i, 0);
      break;
    case Bcast::Row:
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
      for (int64_t r = 0; r < n / P; r++)
        for (int64_t j = 0; j < P; j++) fn(r * P + j, j);
      break;
    case Bcast::Col:
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
      for (int64_t r = 0; r < n / P; r++)
        for (int64_t j = 0; j < P; j++) fn(r * P + j, r);
      break;
  }
}

// Adds contributions c [n] (one per output element) into the small operand's gradient ds.
void reduce_into_small(float* ds, const float* c, Bcast m, int64_t n, int64_t P) {
  switch (m) {
    case Bcast::Same:
#pragma omp parallel for simd schedule(static) if (parallel: n >= kParallelMin)
      for (int64_t i = 0; i < n; i++) ds[i] += c[i];
      break;
    case Bcast::Scalar:
      ds[0] += static_cast<float>(sum_all(c, n));
      break;
    case Bcast::Row:
      colsum_add(ds, c, n / P, P);
      break;
    case Bcast::Col:
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
      for (int64_t r = 0; r < n / P; r++) {
        float s = 0;
        for (int64_t j = 0; j < P; j++) s += c[r * P + j];
        ds[r] += s;
      }
      break;
  }
}

// o = f(x, y) with x from A and y from B.
template <class F>
void binary_fwd_impl(F f, Bcast m, bool a_full, float* o, const float* A, const float* B, int64_t n, int64_t P) {
  if (a_full)
    for_each_pair(m, n, P, [=](int64_t i, int64_t k) { o[i] = f(A[i], B[k]); });
  else
    for_each_pair(m, n, P, [=](int64_t i, int64_t k) { o[i] = f(A[k], B[i]); });
}

// The partials dfx(x, y), dfy(x, y) of f, with x from A and y from B.
template <class DX, class DY>
void binary_bwd_impl(DX dfx, DY dfy, Bcast m, bool a_full, float* da, float* db, const float* g, const float* A,
                     const float* B, int64_t n, int64_t P, float* cd) {
  float* d = a_full ? da : db;  // the full operand's gradient
  if (d) {
    if (a_full)
      for_each_pair(m, n, P, [=](int64_t i, int64_t k) { d[i] += g[i] * dfx(A[i], B[k]); });
    else
      for_each_pair(m, n, P, [=](int64_t i, int64_t k) { d[i] += g[i] * dfy(A[k], B[i]); });
  }
  float* ds = a_full ? db : da;  // the small operand's
  if (ds) {
    if (a_full)
      for_each_pair(m, n, P, [=](int64_t i, int64_t k) { cd[i] = g[i] * dfy(A[i], B[k]); });
    else
      for_each_pair(m, n, P, [=](int64_t i, int64_t k) { cd[i] = g[i] * dfx(A[k], B[i]); });
    reduce_into_small(ds, cd, m, n, P);
  }
}

}  // namespace

void binary_fwd(BinaryOp op, Bcast m, bool a_full, float* out, const float* a, const float* b, int64_t n,
                int64_t P) {
  switch (op) {
    case BinaryOp::Add:
      return binary_fwd_impl([](float x, float y) { return x + y; }, m, a_full, out, a, b, n, P);
    case BinaryOp::Sub:
      return binary_fwd_impl([](float x, float y) { return x - y; }, m, a_full, out, a, b, n, P);
    case BinaryOp::Mul:
      return binary_fwd_impl([](float x, float y) { return x * y; }, m, a_full, out, a, b, n, P);
    case BinaryOp::Div:
      return binary_fwd_impl([](float x, float y) { return x / y; }, m, a_full, out, a, b, n, P);
  }
}

void binary_bwd(BinaryOp op, Bcast m, bool a_full, float* da, float* db, const float* dout, const float* a,
                const float* b, int64_t n, int64_t P, float* scratch) {
  switch (op) {
    case BinaryOp::Add:
      return binary_bwd_impl([](float, float) { return 1.f; }, [](float, float) { return 1.f; }, m, a_full, da, db,
                             dout, a, b, n, P, scratch);
    case BinaryOp::Sub:
      return binary_bwd_impl([](float, float) { return 1.f; }, [](float, float) { return -1.f; }, m, a_full, da, db,
                             dout, a, b, n, P, scratch);
    case BinaryOp::Mul:
      return binary_bwd_impl([](float, float y) { return y; }, [](float x, float) { return x; }, m, a_full, da, db,
                             dout, a, b, n, P, scratch);
    case BinaryOp::Div:
      return binary_bwd_impl([](float, float y) { return 1.f / y; }, [](float x, float y) { return -x / (y * y); }, m,
                             a_full, da, db, dout, a, b, n, P, scratch);
  }
}

// ---- unary maps ------------------------------------------------------------------------------

namespace {

// y = f(x).
template <class F>
void map_fwd(F f, float* o, const float* X, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) o[i] = f(X[i]);
}

// dx += dy * df(x, y), df the derivative given x and y = f(x).
template <class DF>
void map_bwd(DF df, float* d, const float* g, const float* X, const float* Y, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) d[i] += g[i] * df(X[i], Y[i]);
}

}  // namespace

void unary_fwd(UnaryOp op, float s, float* y, const float* x, int64_t n) {
  switch (op) {
    case UnaryOp::AddScalar:
      return map_fwd([s](float v) { return v + s; }, y, x, n);
    case UnaryOp::MulScalar:
      return map_fwd([s](float v) { return v * s; }, y, x, n);
    case UnaryOp::Exp:
      return map_fwd([](float v) { return std::exp(v); }, y, x, n);
    case UnaryOp::Log:
      return map_fwd([](float v) { return std::log(v); }, y, x, n);
    case UnaryOp::Tanh:
      return map_fwd([](float v) { return std::tanh(v); }, y, x, n);
    case UnaryOp::Relu:
      return map_fwd([](float v) { return v > 0.f ? v : 0.f; }, y, x, n);
  }
}

void unary_bwd(UnaryOp op, float s, float* dx, const float* dy, const float* x, const float* y, int64_t n) {
  switch (op) {
    case UnaryOp::AddScalar:
      return map_bwd([](float, float) { return 1.f; }, dx, dy, x, y, n);
    case UnaryOp::MulScalar:
      return map_bwd([s](float, float) { return s; }, dx, dy, x, y, n);
    case UnaryOp::Exp:
      return map_bwd([](float, float v) { return v; }, dx, dy, x, y, n);
    case UnaryOp::Log:
      return map_bwd([](float v, float) { return 1.f / v; }, dx, dy, x, y, n);
    case UnaryOp::Tanh:
      return map_bwd([](float, float v) { return 1.f - v * v; }, dx, dy, x, y, n);
    case UnaryOp::Relu:
      return map_bwd([](float v, float) { return v > 0.f ? 1.f : 0.f; }, dx, dy, x, y, n);
  }
}

void add_into(float* d, const float* s, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) d[i] += s[i];
}

// ---- activations -----------------------------------------------------------------------------

namespace {
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
}  // namespace

void triad(float* a, const float* b, const float* c, float s, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}

void gelu_fwd(float* y, const float* x, int64_t n, bool tanh_approx) {
  if (tanh_approx) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= kParallelMin)
    for (int64_t i = 0; i < n; i++) {
      const float v = x[i];
      y[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
    }
  } else {
#pragma omp parallel for simd schedule(static) if (parallel: n >= kParallelMin)
    for (int64_t i = 0; i < n; i++) y[i] = 0.5f * x[i] * (1.0f + erf_approx(x[i] * kInvSqrt2));
  }
}

void gelu_bwd(float* dx, const float* dy, const float* x, int64_t n, bool tanh_approx) {
  if (tanh_approx) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= kParallelMin)
    for (int64_t i = 0; i < n; i++) {
      const float v = x[i];
      const float u = kSqrt2OverPi * (v + 0.044715f * v * v * v);
      const float t = std::tanh(u);
      const float du = kSqrt2OverPi * (1.0f + 3.0f * 0.044715f * v * v);
      dx[i] += dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
    }
  } else {
#pragma omp parallel for simd schedule(static) if (parallel: n >= kParallelMin)
    for (int64_t i = 0; i < n; i++) {
      const float v = x[i];
      const float cdf = 0.5f * (1.0f + erf_approx(v * kInvSqrt2));
      const float pdf = kInvSqrt2Pi * exp_approx(-0.5f * v * v);
      dx[i] += dy[i] * (cdf + v * pdf);
    }
  }
}

void silu_fwd(float* y, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) y[i] = x[i] / (1.0f + exp_approx(-x[i]));
}

void silu_bwd(float* dx, const float* dy, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) {
    const float s = 1.0f / (1.0f + exp_approx(-x[i]));
    dx[i] += dy[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}

// ---- dropout ---------------------------------------------------------------------------------

void dropout_fwd(float* y, const float* x, int64_t n, float p, uint64_t seed, uint64_t offset) {
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) y[i] = hash_uniform(seed, offset + i) >= p ? x[i] * scale : 0.0f;
}

void dropout_bwd(float* dx, const float* dy, int64_t n, float p, uint64_t seed, uint64_t offset) {
  const float scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t i = 0; i < n; i++)
    if (hash_uniform(seed, offset + i) >= p) dx[i] += dy[i] * scale;
}

}  // namespace tapelm::kern
