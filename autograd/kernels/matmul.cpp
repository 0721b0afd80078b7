#include "autograd/kernels/matmul.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>

#include <omp.h>

#include "autograd/float16.h"
#include "autograd/kernels/blas.h"
#include "autograd/kernels/common.h"
#include "autograd/kernels/reduce.h"

namespace tapelm::kern {

namespace {
std::atomic<int64_t> g_linear_ns{0};

// Adds its lifetime to g_linear_ns, for calls made outside a parallel region (the tape's thread),
// so that a product run by several threads at once is counted once.
class LinearClock {
 public:
  LinearClock() : on_(!omp_in_parallel()), t0_(std::chrono::steady_clock::now()) {}
  ~LinearClock() {
    if (on_) g_linear_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_).count();
  }
  LinearClock(const LinearClock&) = delete;
  LinearClock& operator=(const LinearClock&) = delete;

 private:
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

void add_bias(float* y, const float* b, int64_t rows, int64_t outf) {
#pragma omp parallel for schedule(static) if (rows * outf >= kParallelMin)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t j = 0; j < outf; j++) y[r * outf + j] += b[j];
}
}  // namespace

void matmul_fwd(float* c, const float* a, const float* b, const MatmulShape& s) {
  sgemm_batched(s.batch, s.ta, s.tb, s.M, s.N, s.K, 1.f, a, s.lda, s.sa, b, s.ldb, s.sb, 0.f, c, s.N, s.sc);
}

void matmul_bwd(float* dA, float* dB, const float* dC, const float* a, const float* b, const MatmulShape& s) {
  const int64_t batch = s.batch, M = s.M, N = s.N, K = s.K, lda = s.lda, ldb = s.ldb, sa = s.sa, sb = s.sb,
                sc = s.sc;
  const bool ta = s.ta, tb = s.tb;
  if (dA) {
    if (!ta)
      sgemm_batched(batch, false, !tb, M, K, N, 1.f, dC, N, sc, b, ldb, sb, 1.f, dA, lda, sa);
    else
      sgemm_batched(batch, tb, true, K, M, N, 1.f, b, ldb, sb, dC, N, sc, 1.f, dA, lda, sa);
  }
  if (dB) {
    if (s.b_shared) {  // one gemm over all rows: dB accumulates their sum
      if (!tb)
        sgemm(true, false, K, N, M, 1.f, a, lda, dC, N, 1.f, dB, ldb);
      else
        sgemm(true, false, N, K, M, 1.f, dC, N, a, lda, 1.f, dB, ldb);
    } else if (!tb) {
      sgemm_batched(batch, !ta, false, K, N, M, 1.f, a, lda, sa, dC, N, sc, 1.f, dB, ldb, sb);
    } else {
      sgemm_batched(batch, true, ta, N, K, M, 1.f, dC, N, sc, a, lda, sa, 1.f, dB, ldb, sb);
    }
  }
}

void linear_fwd(float* y, const float* x, const float* w, const float* b, int64_t rows, int64_t in, int64_t outf) {
  const LinearClock clock;
  sgemm(false, true, rows, outf, in, 1.f, x, in, w, in, 0.f, y, outf);
  if (b) add_bias(y, b, rows, outf);
}

void linear_many_fwd(float* const* ys, const float* x, const float* const* ws, const float* const* bs, const int64_t* outs,
                     int n, int64_t rows, int64_t in) {
  const LinearClock clock;
  XwtProduct ps[kMaxXwtProducts];
  for (int i = 0; i < n && i < kMaxXwtProducts; i++) ps[i] = XwtProduct{ws[i], in, outs[i], ys[i], outs[i], bs[i]};
  sgemm_xwt_many(rows, in, x, in, ps, n);
}

void linear_bwd(float* dx, float* dw, float* db, const float* dy, const float* x, const float* w, int64_t rows,
                int64_t in, int64_t outf) {
  const LinearClock clock;
  if (dx) sgemm(false, false, rows, in, outf, 1.f, dy, outf, w, in, 1.f, dx, in);
  if (dw) sgemm(true, false, outf, in, rows, 1.f, dy, outf, x, in, 1.f, dw, in);
  if (db) colsum_add(db, dy, rows, outf);
}


void linear_fwd_bf16(float* y, const uint16_t* x, const uint16_t* w, const float* b, int64_t rows,
                     int64_t in, int64_t outf) {
  const LinearClock clock;
  gemm_bf16(false, true, rows, outf, in, 1.f, x, in, w, in, 0.f, y, outf);
  if (b) add_bias(y, b, rows, outf);
}

void linear_bwd_bf16(float* dx, float* dw, float* db, const float* dy, const uint16_t* x,
                     const uint16_t* w, int64_t rows, int64_t in, int64_t outf) {
  const LinearClock clock;
  if (dx || dw) {
    // dy rounded to bf16 a block of output columns at a time, at most kDyBlock values, so that a
    // wide layer's gradient (the head's: rows x 50257) is never copied whole. Column blocks, not
    // row blocks: dx sums over them (dx, rows x in, is small to pass again), while each block's dw
    // is its own rows of dw (the large one, passed once).
    constexpr int64_t kDyBlock = int64_t{8} << 20;  // 16 MB of bf16
    const int64_t widest = std::max<int64_t>(1, kDyBlock / std::max<int64_t>(rows, 1));  // columns a block may hold
    const int64_t blocks = std::max<int64_t>(1, (outf + widest - 1) / widest);
    const int64_t cb = (outf + blocks - 1) / blocks;  // blocks as even as they can be, each within the bound
    const std::unique_ptr<uint16_t[]> dyb(new uint16_t[static_cast<size_t>(rows * cb)]);
    for (int64_t j0 = 0; j0 < outf; j0 += cb) {
      const int64_t n = std::min(cb, outf - j0);
      if (n == outf) {
        to_bf16(dyb.get(), dy, rows * outf);
      } else {
#pragma omp parallel for schedule(static) if (rows * n >= 4 * kParallelMin)
        for (int64_t r = 0; r < rows; r++)
          for (int64_t j = 0; j < n; j++) dyb[static_cast<size_t>(r * n + j)] = f32_to_bf16(dy[r * outf + j0 + j]);
      }
      if (dx) gemm_bf16(false, false, rows, in, n, 1.f, dyb.get(), n, w + j0 * in, in, 1.f, dx, in);
      if (dw) gemm_bf16(true, false, n, in, rows, 1.f, dyb.get(), n, x, in, 1.f, dw + j0 * in, in);
    }
  }
  if (db) colsum_add(db, dy, rows, outf);
}

double linear_kernel_seconds() { return 1e-9 * static_cast<double>(g_linear_ns.load()); }

}  // namespace tapelm::kern
