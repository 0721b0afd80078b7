#include "autograd/error.h"
#include "nn/generate.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tapelm {

std::vector<int32_t> sample_next(const Tensor& logits, const SampleOptions& opt, Rng& rng) {
  const int64_t B = logits.dim(0), stride = logits.dim(1);
  const int64_t V = opt.vocab_limit > 0 ? std::min(opt.vocab_limit, stride) : stride;  // ids past V are never drawn
  if (!opt.greedy && !(opt.temperature > 0))
    throw Error(ErrorKind::usage, "sample: temperature must be positive, got " + std::to_string(opt.temperature));
  if (opt.top_k < 0) throw Error(ErrorKind::usage, "sample: top_k must be >= 0, got " + std::to_string(opt.top_k));
  std::vector<int32_t> out(B);
  std::vector<double> p(V);
  for (int64_t b = 0; b < B; b++) {
    const float* l = logits.data() + b * stride;
    if (opt.greedy) {
      out[b] = static_cast<int32_t>(std::max_element(l, l + V) - l);
      continue;
    }
    double cut = -INFINITY;
    if (opt.top_k > 0 && opt.top_k < V) {  // keep logits >= the k-th largest, as nanoGPT
      std::vector<float> s(l, l + V);
      std::nth_element(s.begin(), s.begin() + (opt.top_k - 1), s.end(), std::greater<float>());
      cut = s[opt.top_k - 1];
    }
    double mx = -INFINITY;
    for (int64_t v = 0; v < V; v++)
      if (l[v] >= cut) mx = std::max(mx, double(l[v]) / opt.temperature);
    if (!std::isfinite(mx)) {
      // a temperature so small (subnormal) that logit / temperature overflows: the limit of the
      // distribution as the temperature goes to 0 is the greedy choice
      out[b] = static_cast<int32_t>(std::max_element(l, l + V) - l);
      continue;
    }
    double sum = 0;
    for (int64_t v = 0; v < V; v++) {
      p[v] = l[v] >= cut ? std::exp(double(l[v]) / opt.temperature - mx) : 0.0;
      sum += p[v];
    }
    double u = rng.uniform() * sum;
    int64_t pick = V - 1;
    for (int64_t v = 0; v < V; v++) {
      if (u < p[v]) {
        pick = v;
        break;
      }
      u -= p[v];
    }
    while (p[pick] == 0.0 && pick > 0) pick--;  // rounding at the end of the scan
    out[b] = static_cast<int32_t>(pick);
  }
  return out;
}

void generate_stream(const Decoder& model, const std::vector<std::vector<int32_t>>& prompts, int64_t n_new,
                     const SampleOptions& opt, uint64_t seed, const TokenSink& sink) {
  if (prompts.empty() || prompts[0].empty()) throw Error(ErrorKind::usage, "generate: empty prompt");
  const int64_t B = static_cast<int64_t>(prompts.size()), T = model.decoder_config().block_size;
  const size_t t0 = prompts[0].size();
  for (const auto& p : prompts)
    if (p.size() != t0) throw Error(ErrorKind::usage, "generate: prompts of different lengths");
  std::vector<std::vector<int32_t>> ctx = prompts;  // the tail of each sequence the model can still see
  Rng rng(seed);
  // positions the run can reach before the window is full: a short sample of a long-context model
  // allocates (and zeroes) what it uses, not block_size positions (4.3 GB for a 7B at 4,096)
  const int64_t positions = std::min<int64_t>(T, static_cast<int64_t>(t0) + std::max<int64_t>(0, n_new));
  KVCache cache = make_kv_cache(model.decoder_config(), B, positions, opt.kv_cache);
  auto feed_last = [&](int64_t count) {
    Index ids;
    ids.shape = {B, count};
    for (int64_t b = 0; b < B; b++) ids.data.insert(ids.data.end(), ctx[b].end() - count, ctx[b].end());
    return model.decode_step(ids, cache);
  };
  Tensor logits = feed_last(std::min<int64_t>(static_cast<int64_t>(t0), T));
  for (int64_t i = 0; i < n_new; i++) {
    std::vector<int32_t> next = sample_next(logits, opt, rng);
    if (opt.stop_id >= 0 && std::all_of(next.begin(), next.end(), [&](int32_t id) { return id == opt.stop_id; })) break;
    for (int64_t b = 0; b < B; b++) ctx[b].push_back(next[b]);
    sink(next);
    if (i + 1 == n_new) break;
    if (cache.len < T) {
      logits = feed_last(1);
    } else {  // window full: crop to the last T tokens and refill
      cache.len = 0;
      logits = feed_last(T);
    }
    if (static_cast<int64_t>(ctx[0].size()) > 2 * T)
      for (auto& c : ctx) c.erase(c.begin(), c.end() - T);
  }
}

std::vector<std::vector<int32_t>> generate(const Decoder& model, const std::vector<std::vector<int32_t>>& prompts,
                                           int64_t n_new, const SampleOptions& opt, uint64_t seed) {
  std::vector<std::vector<int32_t>> seqs = prompts;
  generate_stream(model, prompts, n_new, opt, seed, [&](const std::vector<int32_t>& next) {
    for (size_t b = 0; b < seqs.size(); b++) seqs[b].push_back(next[b]);
  });
  return seqs;
}

}  // namespace tapelm
