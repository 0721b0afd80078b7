#include "autograd/kernels/norms.h"

#include <algorithm>
#include <cmath>

namespace tapelm::kern {

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

}  // namespace tapelm::kern
