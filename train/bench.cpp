#include "train/bench.h"

#include <algorithm>
#include <chrono>

#include "nn/generate.h"
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

BenchResult bench_train(const GPTConfig& cfg, int64_t B, int iters, int warmup, uint64_t seed) {
  GPTConfig c = cfg;
  c.dropout = 0;
  GPT model(c, seed);
  model.train();
  NamedParams params = model.named_parameters();
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
    backward(model.loss(x, y));
    clip_grad_norm(params, 1.0);
    opt.step(1e-3);
    opt.zero_grad(false);
  };
  BenchResult res;
  res.times = timeit(step, iters, warmup);
  res.median_s = median(res.times);
  res.min_s = *std::min_element(res.times.begin(), res.times.end());
  res.tokens_per_iter = B * T;
  res.tokens_per_s = static_cast<double>(res.tokens_per_iter) / res.median_s;
  return res;
}

BenchResult bench_decode(const GPTConfig& cfg, int64_t B, int64_t len, int iters, int warmup, uint64_t seed) {
  GPT model(cfg, seed);
  model.eval();
  if (len < 2 || len > cfg.block_size) len = cfg.block_size;
  Rng r(seed + 1);
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t b = 0; b < B; b++) prompts.push_back({static_cast<int32_t>(r.below(cfg.vocab_size))});
  SampleOptions so;
  so.greedy = true;
  auto run = [&] { generate(model, prompts, len - 1, so, seed); };
  BenchResult res;
  res.times = timeit(run, iters, warmup);
  const double steps = static_cast<double>(len - 1);
  res.median_s = median(res.times) / steps;
  res.min_s = *std::min_element(res.times.begin(), res.times.end()) / steps;
  res.tokens_per_iter = B * (len - 1);
  res.tokens_per_s = static_cast<double>(B) / res.median_s;
  return res;
}

}  // namespace tapelm
