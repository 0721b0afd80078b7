// GEMM throughput through tapelm's one sgemm call site next to calling OpenBLAS directly, for the
// shapes a `mid` training step runs (B*T = 4096 rows, d = 256, hidden 1024, V = 65).
#include <benchmark/benchmark.h>
#include <cblas.h>

#include "autograd/gradcheck.h"
#include "autograd/kernels/blas.h"
#include "autograd/runtime.h"

using namespace tapelm;

namespace {
struct Shape3 {
  int M, N, K;
  bool ta, tb;
};
// forward x·Wᵀ, backward dY·W and dYᵀ·X for each projection of the mid config
const Shape3 kShapes[] = {
    {4096, 256, 256, false, true},  {4096, 256, 256, false, false}, {256, 256, 4096, true, false},   // attn proj
    {4096, 1024, 256, false, true}, {4096, 256, 1024, false, false}, {1024, 256, 4096, true, false},  // mlp fc
    {4096, 256, 1024, false, true}, {4096, 1024, 256, false, false}, {256, 1024, 4096, true, false},  // mlp proj
    {4096, 65, 256, false, true},   {4096, 256, 65, false, false},   {65, 256, 4096, true, false},    // lm head
};

template <bool kOurs>
void BM_gemm(benchmark::State& st) {
  const Shape3 s = kShapes[st.range(0)];
  set_num_threads(static_cast<int>(st.range(1)));
  const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
  Tensor A = randn({int64_t(s.M) * s.K}, 1), B = randn({int64_t(s.K) * s.N}, 2), C = Tensor::zeros({int64_t(s.M) * s.N});
  for (auto _ : st) {
    if constexpr (kOurs)
      kern::sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda, B.data(), ldb, 0.f, C.data(), s.N);
    else
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.M, s.N, s.K,
                  1.f, A.data(), (int)lda, B.data(), (int)ldb, 0.f, C.data(), s.N);
    benchmark::DoNotOptimize(C.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * s.M * s.N * s.K, benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
  st.SetLabel(std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K) + (s.ta ? " Aᵀ" : "") +
              (s.tb ? " Bᵀ" : ""));
}

}  // namespace

// Each shape's two variants are registered side by side, so they run one right after the other
// and share whatever else the machine is doing at that moment.
int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (int i = 0; i < static_cast<int>(std::size(kShapes)); i++)
    for (int t : {1, 2}) {
      benchmark::RegisterBenchmark("openblas_direct", BM_gemm<false>)->Args({i, t})->UseRealTime();
      benchmark::RegisterBenchmark("tapelm_sgemm", BM_gemm<true>)->Args({i, t})->UseRealTime();
    }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
