#include "autograd/kernels/reduce.h"

#include <algorithm>
#include <vector>

namespace tapelm::kern {

namespace {
constexpr int64_t kSumChunk = 4096;  // fixed chunks keep sums independent of the thread count
}  // namespace

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

void sum_all_bwd(float* dx, float g, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel: n >= kParallelMin)
  for (int64_t i = 0; i < n; i++) dx[i] += g;
}

}  // namespace tapelm::kern
