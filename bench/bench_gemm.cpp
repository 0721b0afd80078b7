// GEMM throughput through tapelm's one sgemm call site, with each backend (OpenBLAS, oneDNN)
// next to calling OpenBLAS directly, for the shapes the baby, mid and nano training steps run:
// every projection forward (x·Wᵀ) and backward (dY·W, dYᵀ·X), and one head's attention products.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdio>

#include <string>

#include "autograd/gradcheck.h"
#include "autograd/kernels/blas.h"
#include "autograd/cpu.h"
#include "autograd/runtime.h"

using namespace tapelm;

namespace {
struct Shape3 {
  const char* model;
  int M, N, K;
  bool ta, tb;
};
// Rows R = B·T tokens, width d, MLP hidden 4d, vocabulary 65, head size hd: for each model the
// forward x·Wᵀ and the two backward products of its projections, then QKᵀ and P·V of one head.
#define TAPELM_PROJ(m, R, d, h, V)                                                                     \
  {m, R, 3 * d, d, false, true}, {m, R, d, 3 * d, false, false}, {m, 3 * d, d, R, true, false},        \
      {m, R, h, d, false, true}, {m, R, d, h, false, false}, {m, h, d, R, true, false},                \
      {m, R, d, h, false, true}, {m, R, h, d, false, false}, {m, d, h, R, true, false},                \
      {m, R, V, d, false, true}, {m, R, d, V, false, false}, {m, V, d, R, true, false}
const Shape3 kShapes[] = {
    TAPELM_PROJ("baby", 768, 128, 512, 65),       {"baby", 64, 64, 32, false, true},   {"baby", 64, 32, 64, false, false},
    TAPELM_PROJ("mid", 4096, 256, 1024, 65),      {"mid", 128, 128, 32, false, true},  {"mid", 128, 32, 128, false, false},
    TAPELM_PROJ("nano", 16384, 384, 1536, 65),    {"nano", 256, 256, 64, false, true}, {"nano", 256, 64, 256, false, false},
};
#undef TAPELM_PROJ

enum Variant { kOpenBlasDirect, kTapelmOpenBlas, kTapelmOneDnn };

template <Variant kVariant>
void BM_gemm(benchmark::State& st) {
  const Shape3 s = kShapes[st.range(0)];
  set_num_threads(static_cast<int>(st.range(1)));
  if (kVariant != kOpenBlasDirect &&
      !kern::set_gemm_backend(kVariant == kTapelmOneDnn ? kern::GemmBackend::onednn : kern::GemmBackend::openblas)) {
    st.SkipWithError("this build has no oneDNN");
    return;
  }
  const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
  Tensor A = randn({int64_t(s.M) * s.K}, 1), B = randn({int64_t(s.K) * s.N}, 2), C = Tensor::zeros({int64_t(s.M) * s.N});
  for (auto _ : st) {
    if constexpr (kVariant != kOpenBlasDirect)
      kern::sgemm(s.ta, s.tb, s.M, s.N, s.K, 1.f, A.data(), lda, B.data(), ldb, 0.f, C.data(), s.N);
    else
      cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, s.M, s.N, s.K,
                  1.f, A.data(), (int)lda, B.data(), (int)ldb, 0.f, C.data(), s.N);
    benchmark::DoNotOptimize(C.data());
  }
  st.counters["GFLOP/s"] = benchmark::Counter(2.0 * s.M * s.N * s.K, benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
  st.SetLabel(std::string(s.model) + " " + std::to_string(s.M) + "x" + std::to_string(s.N) + "x" + std::to_string(s.K) + (s.ta ? " Aᵀ" : "") +
              (s.tb ? " Bᵀ" : ""));
}

}  // namespace

// Each shape's two variants are registered side by side, so they run one right after the other
// and share whatever else the machine is doing at that moment.
int main(int argc, char** argv) {
  guard_blas_core(argv);
  benchmark::Initialize(&argc, argv);
  std::printf("OpenBLAS core: %s\n", blas_core_description().c_str());
  for (int i = 0; i < static_cast<int>(std::size(kShapes)); i++)
    for (int t : {1, 2}) {
      benchmark::RegisterBenchmark("openblas_direct", BM_gemm<kOpenBlasDirect>)->Args({i, t})->UseRealTime();
      benchmark::RegisterBenchmark("tapelm_openblas", BM_gemm<kTapelmOpenBlas>)->Args({i, t})->UseRealTime();
      benchmark::RegisterBenchmark("tapelm_onednn", BM_gemm<kTapelmOneDnn>)->Args({i, t})->UseRealTime();
    }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
