#pragma once
// What the layers above need from the kernels' runtime, without the kernels: the thread count
// shared by the OpenMP kernels and OpenBLAS, and the machine's measured matrix-product rate.
#include <string>

namespace tapelm {

/// Threads for the OpenMP kernels and OpenBLAS (n <= 0: all cores).
void set_num_threads(int n);
int get_num_threads();

/// The side of the square products the peaks below are measured on.
constexpr int kPeakSide = 1536;

/// The sgemm throughput (FLOP/s) at the current thread count: best of several 1536³ products,
/// measured once per thread count and remembered. The denominator of MFU.
double sgemm_peak_flops();

/// The same for the bf16 products of --precision bf16 (kern::gemm_bf16: bf16 inputs, f32
/// accumulation and output); 0 where they cannot run (no AVX512-BF16, or no oneDNN).
double bf16_gemm_peak_flops();

/// "" where bf16 products cannot run; else one line: their measured rate as a multiple of
/// sgemm's, and, where it is below 1, that bf16 trains slower than f32 on this CPU (AVX512-BF16
/// without AMX can issue its bf16 dot products at half the FMA rate: bench/bench_gemm's
/// dpbf16_rate against fma_rate shows it).
std::string bf16_rate_note();

/// The CPU's theoretical single-precision peak (FLOP/s) at the current thread count: cores x FMA
/// units x lanes x 2 x measured clock (autograd/cpu.h), measured once per thread count. The
/// second denominator of MFU: a crippled BLAS makes sgemm_peak_flops() low, never this.
double cpu_peak_flops();

/// The machine's memory bandwidth (bytes/s) at the current thread count, as STREAM's triad measures
/// it: a[i] = b[i] + s·c[i] over three 64 MiB float arrays (far past the last-level cache), 12 bytes
/// per element, best of 5 passes after one to touch the pages; measured once per thread count.
/// The denominator of a decoding step's "% of the bandwidth limit".
double memory_bandwidth();

/// Wall seconds this process has spent in the linear layers' products (forward and backward, f32
/// and bf16; kern::linear_kernel_seconds): the benchmark's split of a training step into the part
/// bf16 products shorten and the rest.
double linear_product_seconds();

/// The library behind sgemm: "oneDNN (matrix-vector products: OpenBLAS)" or "OpenBLAS".
std::string gemm_backend_name();

/// The lines `inspect --system`, `train` and `bench` print: CPU, SIMD level, threads, OpenBLAS
/// core and how it was chosen, GEMM backend, and both peaks (measuring them if not yet done).
struct ComputeInfo {
  std::string cpu, simd, blas_core, gemm;
  std::string omp_wait;  // how idle OpenMP threads wait (autograd/omp_wait.h)
  int threads = 0;
  double sgemm_peak = 0, cpu_peak = 0;
  double clock_hz = 0;
  int fma_units = 0, lanes = 0;
  std::string peak_basis;
};
ComputeInfo compute_info();
/// One line: "CPU AMD EPYC (AVX-512 BF16), 2 threads | OpenBLAS core ... | GEMM ... | peaks: ...".
std::string compute_summary(const ComputeInfo& c);

}  // namespace tapelm

#include <cstdint>
#include <functional>

namespace tapelm {

/// Runs body(i) for i in [0, n) on the OpenMP threads, one i at a time per thread (for coarse,
/// uneven tasks such as encoding chunks of text). The first exception a body throws is rethrown
/// here once every task has finished. Never call it from inside another parallel region.
void parallel_for(int64_t n, const std::function<void(int64_t)>& body);

}  // namespace tapelm
