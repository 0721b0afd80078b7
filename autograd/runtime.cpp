#include "autograd/runtime.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "autograd/cpu.h"
#include "autograd/kernels/blas.h"
#include "autograd/kernels/elementwise.h"
#include "autograd/kernels/matmul.h"
#include "autograd/omp_wait.h"
#include "autograd/tensor.h"

namespace tapelm {

// set_num_threads and get_num_threads live in kernels/blas.cpp, next to the OpenMP and OpenBLAS
// calls they make.

namespace {

// The best rate (FLOP/s) of several n³ products (n = kPeakSide: large enough for the BLAS to reach
// its steady rate on every thread), remembered per thread count in `at`. make(n) allocates the
// operands and returns the product to time.
double product_peak(std::map<int, double>& at, const std::function<std::function<void()>(int64_t)>& make) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const int threads = get_num_threads();
  if (auto it = at.find(threads); it != at.end()) return it->second;
  using Clock = std::chrono::steady_clock;
  const int64_t n = kPeakSide;
  const std::function<void()> product = make(n);
  double best = 1e30;
  for (int r = 0; r < 8; r++) {
    const auto t0 = Clock::now();
    product();
    if (r >= 2) best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return at[threads] = 2.0 * n * n * n / best;
}

}  // namespace

double sgemm_peak_flops() {
  static std::map<int, double> at;  // by thread count
  return product_peak(at, [](int64_t n) -> std::function<void()> {
    Tensor a = Tensor::full({n, n}, 0.5f), b = Tensor::full({n, n}, 0.25f), c = Tensor::zeros({n, n});
    return [=]() mutable { kern::sgemm(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n); };
  });
}

double bf16_gemm_peak_flops() {
  if (!kern::bf16_gemm_native_missing().empty()) return 0;
  static std::map<int, double> at;  // by thread count
  return product_peak(at, [](int64_t n) -> std::function<void()> {
    // a = 0.5, b = 0.25 in bf16
    return [n, a = std::vector<uint16_t>(n * n, 0x3f00), b = std::vector<uint16_t>(n * n, 0x3e80),
            c = std::vector<float>(n * n)]() mutable {
      kern::gemm_bf16(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    };
  });
}

std::string bf16_rate_note() {
  const double bf = bf16_gemm_peak_flops();
  if (bf <= 0) return "";
  const double f = sgemm_peak_flops(), r = bf / f;
  char b[320];
  std::snprintf(b, sizeof b, "bf16 products run at %.2fx the f32 rate here (%.1f against %.1f GFLOP/s, %d^3, measured)%s", r,
                bf / 1e9, f / 1e9, int(kPeakSide),
                r < 1 ? ": on this CPU bf16 trains slower than f32 (bf16-emulated rounds alike at about f32's speed)" : "");
  return b;
}

double memory_bandwidth() {
  static std::mutex mu;
  static std::map<int, double> at;  // by thread count
  std::lock_guard<std::mutex> lock(mu);
  const int threads = get_num_threads();
  if (auto it = at.find(threads); it != at.end()) return it->second;
  using Clock = std::chrono::steady_clock;
  const int64_t n = int64_t(64) << 18;  // 64 MiB of floats per array
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  double best = 1e30;
  for (int r = 0; r < 6; r++) {
    const auto t0 = Clock::now();
    kern::triad(a.data(), b.data(), c.data(), 0.5f + 0.001f * static_cast<float>(r), n);
    if (r >= 1) best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const double bw = 12.0 * static_cast<double>(n) / best;
  at[threads] = bw;
  return bw;
}

namespace {
const CpuPeak& cpu_peak_at_threads() {
  static std::mutex mu;
  static std::map<int, CpuPeak> at;
  std::lock_guard<std::mutex> lock(mu);
  const int threads = get_num_threads();
  auto it = at.find(threads);
  if (it == at.end()) {
    CpuPeak p = cpu_peak_flops(threads);
    // The peak of the vectors the GEMMs run on: a CPU with AVX-512 whose GEMMs are held to AVX2
    // (ONEDNN_MAX_CPU_ISA, as an AVX2 stand-in does) can reach only the 8-lane peak.
    const int lanes = kern::gemm_vector_lanes();
    if (lanes > 0 && lanes < p.lanes) {
      p.flops *= double(lanes) / p.lanes;
      p.basis += "; GEMMs held to " + std::to_string(lanes) + " lanes (" + std::to_string(p.lanes) + " on this CPU)";
      p.lanes = lanes;
    }
    it = at.emplace(threads, p).first;
  }
  return it->second;
}
}  // namespace

double cpu_peak_flops() { return cpu_peak_at_threads().flops; }

double linear_product_seconds() { return kern::linear_kernel_seconds(); }

std::string gemm_backend_name() { return kern::gemm_backend_description(); }

ComputeInfo compute_info() {
  ComputeInfo c;
  const CpuInfo& cpu = cpu_info();
  c.cpu = cpu.brand.empty() ? cpu.vendor : cpu.brand;
  c.simd = cpu_simd_level(cpu);
  c.blas_core = blas_core_description();
  c.gemm = gemm_backend_name();
  c.omp_wait = omp_wait_description();
  c.threads = get_num_threads();
  c.sgemm_peak = sgemm_peak_flops();
  const CpuPeak& p = cpu_peak_at_threads();
  c.cpu_peak = p.flops;
  c.clock_hz = p.clock_hz;
  c.fma_units = p.fma_units;
  c.lanes = p.lanes;
  c.peak_basis = p.basis;
  return c;
}

std::string compute_summary(const ComputeInfo& c) {
  char b[768];
  std::snprintf(b, sizeof b,
                "CPU %s (%s), %d threads | OpenBLAS core %s | GEMM %s | OpenMP wait: %s | peaks: sgemm %.1f GFLOP/s, CPU "
                "%.1f GFLOP/s (%d cores x %d FMA x %d lanes x 2 x %.2f GHz)",
                c.cpu.c_str(), c.simd.c_str(), c.threads, c.blas_core.c_str(), c.gemm.c_str(), c.omp_wait.c_str(),
                c.sgemm_peak / 1e9, c.cpu_peak / 1e9, c.threads, c.fma_units, c.lanes, c.clock_hz / 1e9);
  return b;
}

}  // namespace tapelm
