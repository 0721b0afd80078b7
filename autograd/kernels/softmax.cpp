#include "autograd/kernels/softmax.h"

#include <algorithm>
#include <cmath>

namespace tapelm::kern {

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

// log Σ exp(x[c]·k) for one row.
static inline float log_sum_exp_scaled(const float* xr, int64_t C, float k) {
  float mx = -INFINITY;
  for (int64_t c = 0; c < C; c++) mx = std::max(mx, xr[c] * k);
  float s = 0;
  for (int64_t c = 0; c < C; c++) s += exp_approx(xr[c] * k - mx);
  return mx + std::log(s);
}

int64_t distill_kl_fwd(float* losses, float* lse_s, float* lse_t, const float* s, const float* t, const int32_t* targets,
                       int64_t N, int64_t V, float T) {
  const float k = 1.f / T;
  int64_t count = 0;
#pragma omp parallel for schedule(static) reduction(+ : count) if (N * V >= kParallelMin)
  for (int64_t r = 0; r < N; r++) {
    losses[r] = 0;
    if (targets[r] < 0) continue;
    const float* sr = s + r * V;
    const float* tr = t + r * V;
    const float ls = log_sum_exp_scaled(sr, V, k), lt = log_sum_exp_scaled(tr, V, k);
    lse_s[r] = ls;
    lse_t[r] = lt;
    double kl = 0;  // Σ p_t (log p_t − log p_s): terms of both signs, summed in double
    for (int64_t c = 0; c < V; c++) {
      const float log_pt = tr[c] * k - lt;
      kl += static_cast<double>(exp_approx(log_pt)) * static_cast<double>(log_pt - (sr[c] * k - ls));
    }
    losses[r] = static_cast<float>(kl) * T * T;
    count++;
  }
  return count;
}

void distill_kl_bwd(float* ds, const float* s, const float* t, const float* lse_s, const float* lse_t,
                    const int32_t* targets, int64_t N, int64_t V, float T, float scale) {
  const float k = 1.f / T, g = scale * T;
#pragma omp parallel for schedule(static) if (N * V >= kParallelMin)
  for (int64_t r = 0; r < N; r++) {
    if (targets[r] < 0) continue;
    const float* sr = s + r * V;
    const float* tr = t + r * V;
    float* d = ds + r * V;
    for (int64_t c = 0; c < V; c++) d[c] += g * (exp_approx(sr[c] * k - lse_s[r]) - exp_approx(tr[c] * k - lse_t[r]));
  }
}

}  // namespace tapelm::kern
