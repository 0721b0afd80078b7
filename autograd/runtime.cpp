#include "autograd/runtime.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>

#include "autograd/kernels/blas.h"
#include "autograd/tensor.h"

namespace tapelm {

// set_num_threads and get_num_threads live in kernels/blas.cpp, next to the OpenMP and OpenBLAS
// calls they make.

double sgemm_peak_flops() {
  static std::mutex mu;
  static std::map<int, double> peak_at;  // by thread count
  std::lock_guard<std::mutex> lock(mu);
  const int threads = get_num_threads();
  if (auto it = peak_at.find(threads); it != peak_at.end()) return it->second;
  using Clock = std::chrono::steady_clock;
  // Large enough for OpenBLAS to reach its steady rate on every thread; best of several runs.
  const int64_t n = 1536;
  Tensor a = Tensor::full({n, n}, 0.5f), b = Tensor::full({n, n}, 0.25f), c = Tensor::zeros({n, n});
  double best = 1e30;
  for (int r = 0; r < 8; r++) {
    const auto t0 = Clock::now();
    kern::sgemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    if (r >= 2) best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double peak = 2.0 * n * n * n / best;
  peak_at[threads] = peak;
  return peak;
}

}  // namespace tapelm
