#pragma once
// What the layers above need from the kernels' runtime, without the kernels: the thread count
// shared by the OpenMP kernels and OpenBLAS, and the machine's measured matrix-product rate.
namespace tapelm {

/// Threads for the OpenMP kernels and OpenBLAS (n <= 0: all cores).
void set_num_threads(int n);
int get_num_threads();

/// The sgemm throughput (FLOP/s) at the current thread count: best of several 1536³ products,
/// measured once per thread count and remembered. The denominator of MFU.
double sgemm_peak_flops();

}  // namespace tapelm

#include <cstdint>
#include <functional>

namespace tapelm {

/// Runs body(i) for i in [0, n) on the OpenMP threads, one i at a time per thread (for coarse,
/// uneven tasks such as encoding chunks of text). The first exception a body throws is rethrown
/// here once every task has finished. Never call it from inside another parallel region.
void parallel_for(int64_t n, const std::function<void(int64_t)>& body);

}  // namespace tapelm
