// GEMM throughput through tapelm's one sgemm call site, with each backend (OpenBLAS, oneDNN)
// next to calling OpenBLAS directly, for the shapes the baby, mid and nano training steps run:
// every projection forward (x·Wᵀ) and backward (dY·W, dYᵀ·X), and one head's attention products.
// Beside them, on a CPU with AVX512-BF16, the same shapes through gemm_bf16 (what --precision bf16
// multiplies with), and the instruction rates that bound both: VFMADD231PS against VDPBF16PS.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <immintrin.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

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

enum Variant { kOpenBlasDirect, kTapelmOpenBlas, kTapelmOneDnn, kTapelmBf16 };

template <Variant kVariant>
void BM_gemm(benchmark::State& st) {
  const Shape3 s = kShapes[st.range(0)];
  set_num_threads(static_cast<int>(st.range(1)));
  if (kVariant == kTapelmBf16) {
    if (const std::string why = kern::bf16_gemm_native_missing(); !why.empty()) {
      st.SkipWithError(why.c_str());
      return;
    }
  } else if (kVariant != kOpenBlasDirect &&
             !kern::set_gemm_backend(kVariant == kTapelmOneDnn ? kern::GemmBackend::onednn : kern::GemmBackend::openblas)) {
    st.SkipWithError("this build has no oneDNN");
    return;
  }
  const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
  Tensor A = randn({int64_t(s.M) * s.K}, 1), B = randn({int64_t(s.K) * s.N}, 2), C = Tensor::zeros({int64_t(s.M) * s.N});
  std::vector<uint16_t> Ab, Bb;
  if constexpr (kVariant == kTapelmBf16) {
    Ab.resize(A.numel()), Bb.resize(B.numel());
    kern::to_bf16(Ab.data(), A.data(), A.numel());
    kern::to_bf16(Bb.data(), B.data(), B.numel());
  }
  for (auto _ : st) {
    if constexpr (kVariant == kTapelmBf16)
      kern::gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, 1.f, Ab.data(), lda, Bb.data(), ldb, 0.f, C.data(), s.N);
    else if constexpr (kVariant != kOpenBlasDirect)
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

// One core's rate of 512-bit multiply-adds: `kChains` independent accumulators (more than the
// FMA latency times the ports, so throughput rather than latency bounds the loop). VFMADD231PS
// does 16 multiply-adds (32 FLOP); VDPBF16PS does 32 bf16 products summed in pairs into 16 f32
// lanes (64 FLOP). The counter is GFLOP/s of each: the bf16 one beats f32 only if the CPU issues
// VDPBF16PS at more than half the rate of FMAs.
constexpr int kChains = 12;
constexpr int64_t kInstr = int64_t(1) << 20;

__attribute__((target("avx512f"))) float lanes_sum(const __m512* acc) {
  alignas(64) float v[16];
  __m512 s = acc[0];
  for (int i = 1; i < kChains; i++) s = _mm512_add_ps(s, acc[i]);
  _mm512_store_ps(v, s);
  float t = 0;
  for (float x : v) t += x;
  return t;
}

__attribute__((target("avx512f"))) float fma_loop(float seed) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; i++) acc[i] = _mm512_set1_ps(seed + float(i));  // a new seed per call: no call is hoisted
  const __m512 a = _mm512_set1_ps(1e-9f), b = _mm512_set1_ps(1.f);
  for (int64_t n = 0; n < kInstr / kChains; n++)
#pragma GCC unroll 12
    for (int i = 0; i < kChains; i++) acc[i] = _mm512_fmadd_ps(a, b, acc[i]);
  return lanes_sum(acc);
}

__attribute__((target("avx512f,avx512bf16"))) float dpbf16_loop(float seed) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; i++) acc[i] = _mm512_set1_ps(seed + float(i));  // a new seed per call: no call is hoisted
  const __m512bh a = (__m512bh)_mm512_set1_epi32(0x30893089), b = (__m512bh)_mm512_set1_epi32(0x3f803f80);  // 1e-9, 1
  for (int64_t n = 0; n < kInstr / kChains; n++)
#pragma GCC unroll 12
    for (int i = 0; i < kChains; i++) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  return lanes_sum(acc);
}

template <bool kBf16>
void BM_instruction_rate(benchmark::State& st) {
  const CpuInfo& c = cpu_info();
  if (kBf16 ? !c.avx512bf16 : !c.avx512f) {
    st.SkipWithError(kBf16 ? "this CPU has no avx512_bf16" : "this CPU has no avx512f");
    return;
  }
  float seed = 0;
  for (auto _ : st) benchmark::DoNotOptimize(kBf16 ? dpbf16_loop(seed++) : fma_loop(seed++));
  st.counters["GFLOP/s"] = benchmark::Counter(double(kInstr) * (kBf16 ? 64 : 32), benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
  st.counters["ns/instr"] = benchmark::Counter(double(kInstr), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert,
                                               benchmark::Counter::kIs1000);
  st.SetLabel(kBf16 ? "VDPBF16PS zmm, 1 thread" : "VFMADD231PS zmm, 1 thread");
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
      benchmark::RegisterBenchmark("tapelm_bf16", BM_gemm<kTapelmBf16>)->Args({i, t})->UseRealTime();
    }
  benchmark::RegisterBenchmark("fma_rate", BM_instruction_rate<false>)->UseRealTime();
  benchmark::RegisterBenchmark("dpbf16_rate", BM_instruction_rate<true>)->UseRealTime();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
