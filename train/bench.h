#pragma once
// Speed of a training step or of KV-cache decoding, measured as ../shared/reference/bench.py
// measures PyTorch: same work, warm-up, then the median of timed iterations.
#include <algorithm>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/autocast.h"
#include "autograd/quant.h"
#include "nn/config.h"
#include "train/train_config.h"

namespace tapelm {

struct BenchResult {
  double median_s = 0;      // seconds per training step, or per decoded token step of the batch
  double min_s = 0;
  double tokens_per_s = 0;  // from the median
  int64_t tokens_per_iter = 0;
  std::vector<double> times;  // per iteration (a training step, or a whole generation)
  /// train: per step, the seconds in the linear layers' products (linear_product_seconds), and
  /// their median: the part of the step bf16 products shorten
  std::vector<double> linear_times;
  double linear_median_s = 0;
};

/// forward + backward + clip(1.0) + AdamW(1e-3, 0.9, 0.99, wd 0.1) on one fixed random batch, of
/// cfg's model in its precision, recompute and trainable (the other training keys are not read).
BenchResult bench_train(const TrainConfig& cfg, int64_t batch, int iters, int warmup, uint64_t seed);
/// Decoding at a serving shape: `batch` sequences, a prompt of `prompt` random tokens prefilled in
/// one batched forward, then greedy steps of one token per sequence until the cache holds
/// `context` positions (context - prompt steps).
struct DecodeShape {
  int64_t batch = 1, prompt = 1, context = 0;  // context 0: block_size
  KvType kv_cache = KvType::f32;                // how the cache stores K and V
  WeightType weights = WeightType::f32;          // linear weights as held (GPT::pack_weights)
};
struct DecodeResult {
  DecodeShape shape;
  std::vector<double> prefill_s;  // per iteration
  std::vector<double> step_s;     // per iteration: the mean time of its decoding steps
  double prefill_median_s = 0, step_median_s = 0, step_min_s = 0, step_max_s = 0;
  double tokens_per_s = 0;        // batch / step_median_s
  /// Bytes a decoding step must read at least, averaged over the steps: every weight once as held
  /// (f32, or q8_0 rows; the embedding table counted once, as the tied head reads it whole) and the
  /// KV cache of every sequence up to the step's position, as stored.
  double bytes_per_step = 0;
};
/// Times iters generations after warmup untimed ones; shape errors (prompt < 1, context past
/// block_size or not above prompt) are usage Errors.
DecodeResult bench_decode_shape(const GPTConfig& cfg, DecodeShape shape, int iters, int warmup, uint64_t seed);

/// A decoding step against its two limits: the bytes it must read at the memory bandwidth (STREAM
/// triad), and its FLOPs (weights and attention at the mean context) at the sgemm peak.
struct DecodeRoofline {
  double bandwidth = 0, bandwidth_s = 0;  // bytes/s; seconds the step's bytes take at it
  double flops = 0, compute_s = 0;        // the step's FLOPs; seconds at the sgemm peak
  /// The larger limit as a share of the measured step, in %.
  double roofline_pct(double step_s) const { return 100.0 * std::max(bandwidth_s, compute_s) / step_s; }
};
DecodeRoofline decode_roofline(const GPTConfig& cfg, const DecodeResult& r);

/// What `bench --json` prints for a training run (r of `batch` windows in precision p) or a decoding
/// run: the timings, the model's shape and the machine it ran on (compute_info), in one record.
nlohmann::json bench_record(const TrainConfig& cfg, const BenchResult& r, int64_t batch, int iters, int warmup);
nlohmann::json bench_record(const GPTConfig& cfg, const DecodeResult& r, const DecodeRoofline& roof, int iters, int warmup);

}  // namespace tapelm
