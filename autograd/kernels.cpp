#include "autograd/kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace tapelm::kern {

namespace {
constexpr int64_t kColBlock = 16;     // one cache line of floats
constexpr int64_t kSumChunk = 4096;   // fixed chunks keep sums independent of the thread count
}  // namespace

// ---- reductions and layout -------------------------------------------------------------

void sum_axis_fwd(float* out, const float* x, int64_t O, int64_t N, int64_t I, float scale) {
  if (I == 1) {
#pragma omp parallel for schedule(static) if (O * N >= kParallelMin)
    for (int64_t o = 0; o < O; o++) {
      const float* xo = x + o * N;
      double s = 0;
      for (int64_t j = 0; j < N; j++) s += xo[j];
      out[o] = static_cast<float>(s) * scale;
    }
    return;
  }
  const int64_t nb = (I + kColBlock - 1) / kColBlock;
#pragma omp parallel for collapse(2) schedule(static) if (O * N * I >= kParallelMin)
  for (int64_t o = 0; o < O; o++)
    for (int64_t blk = 0; blk < nb; blk++) {
      const int64_t i0 = blk * kColBlock, i1 = std::min(I, i0 + kColBlock);
      float acc[kColBlock] = {0};
      for (int64_t j = 0; j < N; j++) {
        const float* xr = x + (o * N + j) * I;
        for (int64_t i = i0; i < i1; i++) acc[i - i0] += xr[i];
      }
      for (int64_t i = i0; i < i1; i++) out[o * I + i] = acc[i - i0] * scale;
    }
}

void sum_axis_bwd(float* dx, const float* dout, int64_t O, int64_t N, int64_t I, float scale) {
#pragma omp parallel for collapse(2) schedule(static) if (O * N * I >= kParallelMin)
  for (int64_t o = 0; o < O; o++)
    for (int64_t j = 0; j < N; j++) {
      float* d = dx + (o * N + j) * I;
      const float* g = dout + o * I;
      for (int64_t i = 0; i < I; i++) d[i] += g[i] * scale;
    }
}

void colsum_add(float* dst, const float* src, int64_t R, int64_t C) {
  const int64_t nb = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (R * C >= kParallelMin)
  for (int64_t blk = 0; blk < nb; blk++) {
    const int64_t c0 = blk * kColBlock, c1 = std::min(C, c0 + kColBlock);
    float acc[kColBlock] = {0};
    for (int64_t r = 0; r < R; r++) {
      const float* s = src + r * C;
      for (int64_t c = c0; c < c1; c++) acc[c - c0] += s[c];
    }
    for (int64_t c = c0; c < c1; c++) dst[c] += acc[c - c0];
  }
}

template <bool kSquare>
static double chunked_sum(const float* x, int64_t n) {
  const int64_t nc = (n + kSumChunk - 1) / kSumChunk;
  std::vector<double> part(static_cast<size_t>(nc));
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (int64_t c = 0; c < nc; c++) {
    const int64_t i0 = c * kSumChunk, i1 = std::min(n, i0 + kSumChunk);
    double s = 0;
    for (int64_t i = i0; i < i1; i++) s += kSquare ? double(x[i]) * x[i] : double(x[i]);
    part[c] = s;
  }
  double s = 0;
  for (double p : part) s += p;
  return s;
}

double sum_all(const float* x, int64_t n) { return chunked_sum<false>(x, n); }
double sumsq_all(const float* x, int64_t n) { return chunked_sum<true>(x, n); }

void permute(float* out, const float* x, const int64_t* shape, const int* perm, int ndim, bool add) {
  int64_t in_stride[8], out_shape[8];
  in_stride[ndim - 1] = 1;
  for (int k = ndim - 2; k >= 0; k--) in_stride[k] = in_stride[k + 1] * shape[k + 1];
  int64_t total = 1;
  for (int k = 0; k < ndim; k++) {
    out_shape[k] = shape[perm[k]];
    total *= out_shape[k];
  }
  if (total == 0) return;
  const int64_t L = out_shape[ndim - 1], rows = total / L, step = in_stride[perm[ndim - 1]];
#pragma omp parallel for schedule(static) if (total >= kParallelMin)
  for (int64_t r = 0; r < rows; r++) {
    int64_t rem = r, off = 0;
    for (int k = ndim - 2; k >= 0; k--) {
      off += (rem % out_shape[k]) * in_stride[perm[k]];
      rem /= out_shape[k];
    }
    float* o = out + r * L;
    const float* xi = x + off;
    if (add)
      for (int64_t j = 0; j < L; j++) o[j] += xi[j * step];
    else
      for (int64_t j = 0; j < L; j++) o[j] = xi[j * step];
  }
}

void slice_rows(float* out, const float* x, int64_t O, int64_t N, int64_t I, int64_t start, int64_t M, bool add) {
#pragma omp parallel for schedule(static) if (O * M * I >= kParallelMin)
  for (int64_t o = 0; o < O; o++) {
    const float* s = x + (o * N + start) * I;
    float* d = out + o * M * I;
    if (add)
      for (int64_t i = 0; i < M * I; i++) d[i] += s[i];
    else
      std::memcpy(d, s, sizeof(float) * M * I);
  }
}

void unslice_rows(float* out, const float* x, int64_t O, int64_t N, int64_t I, int64_t start, int64_t M, bool add) {
#pragma omp parallel for schedule(static) if (O * M * I >= kParallelMin)
  for (int64_t o = 0; o < O; o++) {
    float* d = out + (o * N + start) * I;
    const float* s = x + o * M * I;
    if (add)
      for (int64_t i = 0; i < M * I; i++) d[i] += s[i];
    else
      std::memcpy(d, s, sizeof(float) * M * I);
  }
}

// ---- embedding ---------------------------------------------------------------------------

void embedding_fwd(float* out, const float* w, const int32_t* idx, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t t = 0; t < N; t++) std::memcpy(out + t * C, w + int64_t(idx[t]) * C, sizeof(float) * C);
}

void embedding_bwd(float* dw, const float* dout, const int32_t* idx, int64_t N, int64_t C) {
  const int64_t nb = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t blk = 0; blk < nb; blk++) {
    const int64_t c0 = blk * kColBlock, c1 = std::min(C, c0 + kColBlock);
    for (int64_t t = 0; t < N; t++) {
      float* d = dw + int64_t(idx[t]) * C;
      const float* g = dout + t * C;
      for (int64_t c = c0; c < c1; c++) d[c] += g[c];
    }
  }
}

// ---- norms, softmax, loss ------------------------------------------------------------------

void layernorm_fwd(float* out, float* mean, float* rstd, const float* x, const float* w, const float* b,
                   int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t r = 0; r < N; r++) {
    const float* xr = x + r * C;
    float m = 0;
    for (int64_t c = 0; c < C; c++) m += xr[c];
    m /= C;
    float v = 0;
    for (int64_t c = 0; c < C; c++) {
      float d = xr[c] - m;
      v += d * d;
    }
    v /= C;
    const float s = 1.0f / std::sqrt(v + eps);
    float* o = out + r * C;
    if (b)
      for (int64_t c = 0; c < C; c++) o[c] = (xr[c] - m) * s * w[c] + b[c];
    else
      for (int64_t c = 0; c < C; c++) o[c] = (xr[c] - m) * s * w[c];
    mean[r] = m;
    rstd[r] = s;
  }
}

void layernorm_bwd(float* dx, float* dw, float* db, const float* dout, const float* x, const float* w,
                   const float* mean, const float* rstd, int64_t N, int64_t C) {
  if (dx) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
    for (int64_t r = 0; r < N; r++) {
      const float* xr = x + r * C;
      const float* g = dout + r * C;
      const float m = mean[r], s = rstd[r];
      float dnorm_mean = 0, dnorm_xhat = 0;
      for (int64_t c = 0; c < C; c++) {
        const float dn = g[c] * w[c];
        dnorm_mean += dn;
        dnorm_xhat += dn * (xr[c] - m) * s;
      }
      dnorm_mean /= C;
      dnorm_xhat /= C;
      float* d = dx + r * C;
      for (int64_t c = 0; c < C; c++) {
        const float xhat = (xr[c] - m) * s;
        d[c] += s * (g[c] * w[c] - dnorm_mean - xhat * dnorm_xhat);
      }
    }
  }
  if (dw || db) {
    const int64_t nb = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
    for (int64_t blk = 0; blk < nb; blk++) {
      const int64_t c0 = blk * kColBlock, c1 = std::min(C, c0 + kColBlock);
      float aw[kColBlock] = {0}, ab[kColBlock] = {0};
      for (int64_t r = 0; r < N; r++) {
        const float* xr = x + r * C;
        const float* g = dout + r * C;
        const float m = mean[r], s = rstd[r];
        for (int64_t c = c0; c < c1; c++) {
          aw[c - c0] += g[c] * (xr[c] - m) * s;
          ab[c - c0] += g[c];
        }
      }
      for (int64_t c = c0; c < c1; c++) {
        if (dw) dw[c] += aw[c - c0];
        if (db) db[c] += ab[c - c0];
      }
    }
  }
}

void rmsnorm_fwd(float* out, float* rstd, const float* x, const float* w, int64_t N, int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t r = 0; r < N; r++) {
    const float* xr = x + r * C;
    float ss = 0;
    for (int64_t c = 0; c < C; c++) ss += xr[c] * xr[c];
    const float s = 1.0f / std::sqrt(ss / C + eps);
    float* o = out + r * C;
    for (int64_t c = 0; c < C; c++) o[c] = xr[c] * s * w[c];
    rstd[r] = s;
  }
}

void rmsnorm_bwd(float* dx, float* dw, const float* dout, const float* x, const float* w, const float* rstd,
                 int64_t N, int64_t C) {
  if (dx) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
    for (int64_t r = 0; r < N; r++) {
      const float* xr = x + r * C;
      const float* g = dout + r * C;
      const float s = rstd[r];
      float dot = 0;
      for (int64_t c = 0; c < C; c++) dot += g[c] * w[c] * xr[c] * s;
      dot /= C;
      float* d = dx + r * C;
      for (int64_t c = 0; c < C; c++) d[c] += s * (g[c] * w[c] - xr[c] * s * dot);
    }
  }
  if (dw) {
    const int64_t nb = (C + kColBlock - 1) / kColBlock;
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
    for (int64_t blk = 0; blk < nb; blk++) {
      const int64_t c0 = blk * kColBlock, c1 = std::min(C, c0 + kColBlock);
      float aw[kColBlock] = {0};
      for (int64_t r = 0; r < N; r++) {
        const float* xr = x + r * C;
        const float* g = dout + r * C;
        for (int64_t c = c0; c < c1; c++) aw[c - c0] += g[c] * xr[c] * rstd[r];
      }
      for (int64_t c = c0; c < c1; c++) dw[c] += aw[c - c0];
    }
  }
}

// log Σ exp(x[c]) for one row, shifted by its max so nothing overflows.
static inline float log_sum_exp(const float* xr, int64_t C) {
  float mx = -INFINITY;
  for (int64_t c = 0; c < C; c++) mx = std::max(mx, xr[c]);
  float s = 0;
  for (int64_t c = 0; c < C; c++) s += exp_approx(xr[c] - mx);
  return mx + std::log(s);
}

void softmax_fwd(float* y, const float* x, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t r = 0; r < N; r++) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    float mx = -INFINITY;
    for (int64_t c = 0; c < C; c++) mx = std::max(mx, xr[c]);
    float s = 0;
    for (int64_t c = 0; c < C; c++) {
      yr[c] = exp_approx(xr[c] - mx);
      s += yr[c];
    }
    const float inv = 1.0f / s;
    for (int64_t c = 0; c < C; c++) yr[c] *= inv;
  }
}

void softmax_bwd(float* dx, const float* dy, const float* y, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t r = 0; r < N; r++) {
    const float* g = dy + r * C;
    const float* yr = y + r * C;
    float dot = 0;
    for (int64_t c = 0; c < C; c++) dot += g[c] * yr[c];
    float* d = dx + r * C;
    for (int64_t c = 0; c < C; c++) d[c] += yr[c] * (g[c] - dot);
  }
}

void log_softmax_fwd(float* y, const float* x, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t r = 0; r < N; r++) {
    const float* xr = x + r * C;
    float* yr = y + r * C;
    const float lse = log_sum_exp(xr, C);
    for (int64_t c = 0; c < C; c++) yr[c] = xr[c] - lse;
  }
}

void log_softmax_bwd(float* dx, const float* dy, const float* y, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C >= kParallelMin)
  for (int64_t r = 0; r < N; r++) {
    const float* g = dy + r * C;
    const float* yr = y + r * C;
    float s = 0;
    for (int64_t c = 0; c < C; c++) s += g[c];
    float* d = dx + r * C;
    for (int64_t c = 0; c < C; c++) d[c] += g[c] - exp_approx(yr[c]) * s;
  }
}

int64_t cross_entropy_fwd(float* losses, float* lse, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V) {
  int64_t count = 0;
#pragma omp parallel for schedule(static) reduction(+ : count) if (N * V >= kParallelMin)
  for (int64_t r = 0; r < N; r++) {
    const float* xr = logits + r * V;
    lse[r] = log_sum_exp(xr, V);
    if (targets[r] < 0) {
      losses[r] = 0;
    } else {
      losses[r] = lse[r] - xr[targets[r]];
      count++;
    }
  }
  return count;
}

void cross_entropy_bwd(float* dlogits, const float* logits, const float* lse, const int32_t* targets, int64_t N,
                       int64_t V, float scale) {
#pragma omp parallel for schedule(static) if (N * V >= kParallelMin)
  for (int64_t r = 0; r < N; r++) {
    if (targets[r] < 0) continue;
    const float* xr = logits + r * V;
    float* d = dlogits + r * V;
    const float l = lse[r];
    for (int64_t c = 0; c < V; c++) d[c] += scale * exp_approx(xr[c] - l);
    d[targets[r]] -= scale;
  }
}

// ---- elementwise -----------------------------------------------------------------------------

namespace {
constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;
constexpr float kSqrt2OverPi = 0.79788456080286536f;
}  // namespace

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
