#pragma once
// Speed of a training step or of KV-cache decoding, measured as ../shared/reference/bench.py
// measures PyTorch: same work, warm-up, then the median of timed iterations.
#include <vector>

#include "nn/config.h"

namespace tapelm {

struct BenchResult {
  double median_s = 0;      // seconds per training step, or per decoded token step of the batch
  double min_s = 0;
  double tokens_per_s = 0;  // from the median
  int64_t tokens_per_iter = 0;
  std::vector<double> times;  // per iteration (a training step, or a whole generation)
};

/// forward + backward + clip(1.0) + AdamW(1e-3, 0.9, 0.99, wd 0.1) on one fixed random batch.
BenchResult bench_train(const GPTConfig& cfg, int64_t batch, int iters, int warmup, uint64_t seed);
/// Greedy generation from a 1-token prompt to decode_len tokens with the KV cache, batch sequences.
BenchResult bench_decode(const GPTConfig& cfg, int64_t batch, int64_t decode_len, int iters, int warmup, uint64_t seed);

}  // namespace tapelm
