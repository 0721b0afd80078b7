#include "train/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "autograd/error.h"
#include "autograd/runtime.h"
#include "nn/accounting.h"
#include "nn/gpt.h"
#include "optim/optim.h"

namespace tapelm {

namespace {
template <class F>
std::vector<double> timeit(F&& fn, int iters, int warmup) {
  for (int i = 0; i < warmup; i++) fn();
  std::vector<double> ts;
  for (int i = 0; i < iters; i++) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return ts;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

BenchResult bench_train(const TrainConfig& cfg, int64_t B, int iters, int warmup, uint64_t seed) {
  GPTConfig c = cfg.model;
  c.dropout = 0;
  const Precision precision = cfg.precision;
  GPT model(c, seed);
  model.train();
  model.recompute_blocks = cfg.recompute == Recompute::blocks;
  NamedParams params = trained_parameters(model, cfg.trainable);
  AdamW opt(params, 1e-3, 0.9, 0.99, 1e-8, 0.1);
  const int64_t T = c.block_size;
  Rng r(seed + 1);
  Index x, y;
  x.shape = y.shape = {B, T};
  for (int64_t i = 0; i < B * T; i++) {
    x.data.push_back(static_cast<int32_t>(r.below(c.vocab_size)));
    y.data.push_back(static_cast<int32_t>(r.below(c.vocab_size)));
  }
  auto step = [&] {
    {
      const Autocast autocast(precision);  // as the trainer: one scope per step, before the update
      backward(model.loss(x, y));
    }
    clip_grad_norm(params, 1.0);
    opt.step(1e-3);
    opt.zero_grad(false);
  };
  BenchResult res;
  auto timed_step = [&] {
    const double l0 = linear_product_seconds();
    step();
    res.linear_times.push_back(linear_product_seconds() - l0);
  };
  res.times = timeit(timed_step, iters, warmup);
  res.linear_times.erase(res.linear_times.begin(), res.linear_times.begin() + warmup);
  res.linear_median_s = median(res.linear_times);
  res.median_s = median(res.times);
  res.min_s = *std::min_element(res.times.begin(), res.times.end());
  res.tokens_per_iter = B * T;
  res.tokens_per_s = static_cast<double>(res.tokens_per_iter) / res.median_s;
  return res;
}

DecodeResult bench_decode_shape(const GPTConfig& cfg, DecodeShape sh, int iters, int warmup, uint64_t seed) {
  if (sh.context == 0) sh.context = cfg.block_size;
  if (sh.batch < 1 || sh.prompt < 1 || sh.context <= sh.prompt || sh.context > cfg.block_size)
    throw Error(ErrorKind::usage, "decode shape: batch " + std::to_string(sh.batch) + ", prompt " + std::to_string(sh.prompt) +
                                      ", context " + std::to_string(sh.context) + " (need batch >= 1, 1 <= prompt < context <= block_size " +
                                      std::to_string(cfg.block_size) + ")");
  if (iters < 1 || warmup < 0) throw Error(ErrorKind::usage, "decode bench: iters must be positive and warmup >= 0");
  GPT model(cfg, seed);
  model.eval();
  if (sh.weights != WeightType::f32) model.pack_weights(sh.weights);
  NoGrad ng;
  Rng r(seed + 1);
  Index prompt;
  prompt.shape = {sh.batch, sh.prompt};
  for (int64_t i = 0; i < sh.batch * sh.prompt; i++) prompt.data.push_back(static_cast<int32_t>(r.below(cfg.vocab_size)));
  const int64_t steps = sh.context - sh.prompt;
  DecodeResult res;
  res.shape = sh;
  using Clock = std::chrono::steady_clock;
  // A long bench says up front what it costs and shows each run as it ends: an 80,000-token
  // prefill ran 15 minutes with no line. The prefill's attention is causal (half the T² scores).
  const int runs = warmup + iters;
  const ModelCost at_prompt = model_cost(cfg, sh.prompt), at_context = model_cost(cfg, sh.context);
  const double d = static_cast<double>(cfg.n_embd), L = static_cast<double>(cfg.n_layer), B = static_cast<double>(sh.batch);
  const double prefill_flops = B * static_cast<double>(sh.prompt) *
                               (at_prompt.forward_flops_per_token - 2.0 * L * static_cast<double>(sh.prompt) * d);
  const double run_flops = prefill_flops + B * static_cast<double>(steps) * at_context.forward_flops_per_token;
  const bool long_run = run_flops * runs > 1e12;
  if (long_run)
    std::fprintf(stderr, "tapelm: decode bench: %d runs (%d warm-up) of a %ld-token prefill and %ld step%s, %.1f TFLOP each: at least %.0f s at the sgemm peak\n",
                 runs, warmup, static_cast<long>(sh.prompt), static_cast<long>(steps), steps == 1 ? "" : "s", run_flops / 1e12,
                 run_flops * runs / sgemm_peak_flops());
  const auto start = Clock::now();
  for (int it = 0; it < warmup + iters; it++) {
    KVCache cache = model.make_cache(sh.batch, sh.context, sh.kv_cache);
    const auto t0 = Clock::now();
    Tensor logits = model.decode_step(prompt, cache);
    const auto t1 = Clock::now();
    Index next;
    next.shape = {sh.batch, 1};
    next.data.resize(static_cast<size_t>(sh.batch));
    for (int64_t s = 0; s < steps; s++) {
      const int64_t V = logits.shape()[1];
      for (int64_t b = 0; b < sh.batch; b++) {
        const float* row = logits.data() + b * V;
        next.data[b] = static_cast<int32_t>(std::max_element(row, row + V) - row);
      }
      logits = model.decode_step(next, cache);
    }
    const auto t2 = Clock::now();
    const double so_far = std::chrono::duration<double>(t2 - start).count();
    if (long_run || so_far > 10)
      std::fprintf(stderr, "tapelm: decode bench: run %d/%d%s: prefill %.1f s, %ld step%s %.1f s; %.0f s so far, about %.0f s left\n", it + 1, runs,
                   it < warmup ? " (warm-up)" : "", std::chrono::duration<double>(t1 - t0).count(), static_cast<long>(steps), steps == 1 ? "" : "s",
                   std::chrono::duration<double>(t2 - t1).count(), so_far, so_far / (it + 1) * (runs - it - 1));
    if (it < warmup) continue;
    res.prefill_s.push_back(std::chrono::duration<double>(t1 - t0).count());
    res.step_s.push_back(std::chrono::duration<double>(t2 - t1).count() / static_cast<double>(steps));
  }
  res.prefill_median_s = median(res.prefill_s);
  res.step_median_s = median(res.step_s);
  res.step_min_s = *std::min_element(res.step_s.begin(), res.step_s.end());
  res.step_max_s = *std::max_element(res.step_s.begin(), res.step_s.end());
  res.tokens_per_s = static_cast<double>(sh.batch) / res.step_median_s;
  // the step at position p reads p + 1 cached positions; averaged over p = prompt .. context - 1
  const double mean_positions = 0.5 * static_cast<double>(sh.prompt + 1 + sh.context);
  res.bytes_per_step = static_cast<double>(model.weight_bytes()) +
                       static_cast<double>(sh.batch) * mean_positions * static_cast<double>(kv_cache_bytes_per_token(cfg, sh.kv_cache));
  return res;
}

namespace {
// The fields every record has: the model's shape and the machine.
nlohmann::json record_base(const GPTConfig& cfg, int iters, int warmup, const ComputeInfo& ci) {
  return {{"iters", iters},
          {"warmup", warmup},
          {"threads", get_num_threads()},
          {"params", model_cost(cfg).params},
          {"L", cfg.n_layer},
          {"H", cfg.n_head},
          {"KV", cfg.kv_heads_json()},
          {"d", cfg.n_embd},
          {"T", cfg.block_size},
          {"blas_core", ci.blas_core},
          {"gemm", ci.gemm},
          {"omp_wait", ci.omp_wait},
          {"cpu", ci.cpu}};
}
}  // namespace

DecodeRoofline decode_roofline(const GPTConfig& cfg, const DecodeResult& r) {
  DecodeRoofline d;
  d.bandwidth = memory_bandwidth();
  d.bandwidth_s = r.bytes_per_step / d.bandwidth;
  const double mean_ctx = 0.5 * static_cast<double>(r.shape.prompt + 1 + r.shape.context);
  d.flops = static_cast<double>(r.shape.batch) * model_cost(cfg, static_cast<int64_t>(mean_ctx)).forward_flops_per_token;
  d.compute_s = d.flops / compute_info().sgemm_peak;
  return d;
}

nlohmann::json bench_record(const TrainConfig& tc, const BenchResult& r, int64_t batch, int iters, int warmup) {
  const GPTConfig& cfg = tc.model;
  const Precision p = tc.precision;
  const ComputeInfo ci = compute_info();
  nlohmann::json j = record_base(cfg, iters, warmup, ci);
  j.update({{"mode", "train"},
            {"tokens_per_s", r.tokens_per_s},
            {"median_s", r.median_s},
            {"min_s", r.min_s},
            {"batch", batch},
            {"tokens_per_iter", r.tokens_per_iter},
            {"precision", to_string(p)},
            {"times", r.times},
            {"linear_s", r.linear_median_s},  // the linear layers' products, median per step
            {"linear_times", r.linear_times},
            {"sgemm_peak_flops_per_s", ci.sgemm_peak},
            {"cpu_peak_flops_per_s", ci.cpu_peak},
            {"cpu_clock_hz", ci.clock_hz},
            {"cpu_peak_lanes", ci.lanes},
            {"recompute", to_string(tc.recompute)},
            {"trainable", to_string(tc.trainable)},
            {"model_flops_per_s", r.tokens_per_s * tc.train_flops_per_token()}});
  if (p == Precision::bf16) j["bf16_gemm_peak_flops_per_s"] = bf16_gemm_peak_flops();
  return j;
}

nlohmann::json bench_record(const GPTConfig& cfg, const DecodeResult& r, const DecodeRoofline& roof, int iters, int warmup) {
  const int64_t batch = r.shape.batch;
  nlohmann::json j = record_base(cfg, iters, warmup, compute_info());
  j.update({{"mode", "decode"},
            {"batch", batch},
            {"prompt", r.shape.prompt},
            {"context", r.shape.context},
            {"prefill_ms", r.prefill_median_s * 1e3},
            {"step_ms", r.step_median_s * 1e3},
            {"step_ms_min", r.step_min_s * 1e3},
            {"step_ms_max", r.step_max_s * 1e3},
            {"us_per_token", r.step_median_s * 1e6 / static_cast<double>(batch)},
            {"ms_per_sample", r.step_median_s * 1e3 * static_cast<double>(r.shape.context - r.shape.prompt) / static_cast<double>(batch)},
            {"tokens_per_s", r.tokens_per_s},
            {"bytes_per_step", r.bytes_per_step},
            {"memory_bandwidth_bytes_per_s", roof.bandwidth},
            {"bandwidth_limit_pct", 100.0 * roof.bandwidth_s / r.step_median_s},
            {"flops_per_step", roof.flops},
            {"roofline_pct", roof.roofline_pct(r.step_median_s)},
            {"kv_cache", to_string(r.shape.kv_cache)},
            {"weights", to_string(r.shape.weights)},
            {"kv_cache_bytes_per_token", kv_cache_bytes_per_token(cfg, r.shape.kv_cache)},
            {"step_times", r.step_s},
            {"prefill_times", r.prefill_s}});
  return j;
}

}  // namespace tapelm

