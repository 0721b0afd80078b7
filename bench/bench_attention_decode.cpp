// One decoding step's attention alone, as bench/decode_ab.sh's model runs it: 6 layers of 8 query
// heads of 64 over 8, 4, 2 or 1 KV heads, one sequence, the keys and values in an f16 cache of
// CONTEXT rows (bench/LLAMA_CPP_DECODE.md). Plain timing, the median of REPS steps with the
// quartiles, each KV count in turn; the caches of the 6 layers stay where the step leaves them,
// as in decoding (the MQA cache, 6 MB, in L3; the MHA cache, 50 MB, not).
//
//   build/bench_attention_decode [CONTEXT 4096] [THREADS 2] [REPS 60]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "autograd/kernels/attention.h"
#include "autograd/quant.h"
#include "autograd/runtime.h"

using namespace tapelm;

int main(int argc, char** argv) {
  const int64_t len = argc > 1 ? std::atol(argv[1]) : 4096, H = 8, hd = 64, layers = 6;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2, reps = argc > 3 ? std::atoi(argv[3]) : 60;
  if (len < 1 || threads < 1 || reps < 1) {
    std::fprintf(stderr, "usage: bench_attention_decode [CONTEXT >= 1] [THREADS >= 1] [REPS >= 1]\n");
    return 1;
  }
  set_num_threads(threads);
  std::mt19937 gen(1);
  std::normal_distribution<float> normal;
  std::printf("context %lld, %d threads, f16 cache, %d layers of %lld heads of %lld\n", static_cast<long long>(len), threads,
              static_cast<int>(layers), static_cast<long long>(H), static_cast<long long>(hd));
  for (int64_t kv : {8, 4, 2, 1}) {
    const int64_t rb = kv_row_bytes(KvType::f16, hd);
    std::vector<std::vector<uint8_t>> k(layers), v(layers);
    std::vector<float> kn(static_cast<size_t>(kv * len * hd)), vn(kn.size());
    for (int64_t l = 0; l < layers; l++) {
      k[l].resize(static_cast<size_t>(kv * len * rb));
      v[l].resize(k[l].size());
      // written as a prefill writes them, standard normal values: all len positions of every head
      for (float& x : kn) x = normal(gen);
      for (float& x : vn) x = normal(gen);
      kern::kv_cache_write(k[l].data(), v[l].data(), KvType::f16, kn.data(), vn.data(), 1, len, kv, hd, len, 0);
    }
    std::vector<float> q(static_cast<size_t>(H * hd)), y(q.size());
    for (float& x : q) x = 0.1f * normal(gen);
    kern::AttnShape s{1, 1, len, H, kv, hd, kv * len * hd, len - 1};
    s.kv_head_stride = len * hd;
    s.kv_row_stride = hd;
    std::vector<double> ms;
    for (int r = 0; r < reps; r++) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t l = 0; l < layers; l++) kern::attention_fwd_stored(y.data(), q.data(), k[l].data(), v[l].data(), KvType::f16, s);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("KV %lld: %.3f ms a step (quartiles %.3f-%.3f)\n", static_cast<long long>(kv), ms[ms.size() / 2], ms[ms.size() / 4],
                ms[ms.size() * 3 / 4]);
  }
  return 0;
}
