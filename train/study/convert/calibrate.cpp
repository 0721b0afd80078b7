#include "train/study/convert/calibrate.h"

#include <algorithm>

#include "autograd/ops.h"
#include "autograd/tape.h"

namespace tapelm {

using la::Mat;

Calibration calibrate(GPT& model, const std::vector<Index>& batches) {
  NoGrad ng;
  const bool was_training = model.is_training();
  model.eval();
  const int64_t d = model.config().n_embd, L = model.config().n_layer;
  Calibration c;
  c.gram.assign(static_cast<size_t>(L), Mat(d + 1, d + 1));
  for (const Index& idx : batches) {
    const std::vector<Tensor> xs = model.attention_inputs(idx);
    const int64_t N = idx.numel();
    for (int64_t l = 0; l < L; l++) accumulate_gram(c.gram[l], xs[l].reshape({N, d}));
    c.tokens += N;
  }
  model.train(was_training);
  if (c.tokens == 0) throw Error(ErrorKind::data, "calibration: no tokens");
  for (Mat& g : c.gram) finish_gram(g, c.tokens);
  return c;
}

void accumulate_gram(Mat& g, const Tensor& x) {
  const int64_t N = x.shape()[0], d = x.shape()[1];
  // Xᵀ X of this batch in float (at most a few thousand terms per entry), summed in double.
  const Tensor xtx = matmul(Var(x), Var(x), true, false).val();
  for (int64_t i = 0; i < d; i++)
    for (int64_t j = 0; j < d; j++) g(i, j) += xtx[i * d + j];
  for (int64_t t = 0; t < N; t++)
    for (int64_t i = 0; i < d; i++) g(i, d) += x[t * d + i];
  g(d, d) += static_cast<double>(N);
}

void finish_gram(Mat& g, int64_t tokens) {
  const int64_t d = g.rows - 1;
  for (int64_t i = 0; i < d; i++) g(d, i) = g(i, d);
  g = la::scale(g, 1.0 / static_cast<double>(tokens));
}

std::vector<Index> calibration_batches(const TokenSeq& ids, int64_t T, int64_t tokens, uint64_t seed,
                                       const std::string& what) {
  if (tokens <= 0) throw Error(ErrorKind::usage, "calibration tokens must be positive, got " + std::to_string(tokens));
  const int64_t n = ids.size();
  if (n < T)
    throw Error(ErrorKind::data, what + ": " + std::to_string(n) + " tokens, fewer than one calibration window of " +
                                     std::to_string(T));
  if (n < tokens)
    throw Error(ErrorKind::data, what + ": " + std::to_string(n) + " tokens, fewer than the " + std::to_string(tokens) +
                                     " calibration tokens asked for");
  // Up to 32 windows per forward, and at most kCalibrationForwardTokens tokens unless one window
  // is longer: one batch's activations stay bounded (4,096 Llama-2-7B tokens hold about 1 GB in
  // the MLP), however wide the model.
  const int64_t windows = (tokens + T - 1) / T, per_batch = std::clamp<int64_t>(kCalibrationForwardTokens / T, 1, 32);
  Rng rng(seed ^ 0xCA1B0u);
  std::vector<Index> out;
  for (int64_t w0 = 0; w0 < windows; w0 += per_batch) {
    const int64_t b = std::min(per_batch, windows - w0);
    Index x;
    x.shape = {b, T};
    for (int64_t w = 0; w < b; w++) {
      const int64_t s = static_cast<int64_t>(rng.below(static_cast<uint64_t>(n - T + 1)));
      const size_t at = x.data.size();
      x.data.resize(at + static_cast<size_t>(T));
      ids.copy(s, T, x.data.data() + at);
    }
    out.push_back(std::move(x));
  }
  return out;
}

bool conversion_calibrates(int64_t kv, int64_t G, const Variant& v) {
  return v.needs_calibration() && G > 0 && G < kv && kv % G == 0;
}

std::vector<Index> calibration_windows(const CalibrationSource& source, int64_t T) {
  if (!source.batches.empty()) return source.batches;
  return calibration_batches(source.ids, T, source.tokens, source.seed, source.what);
}

bool conversion_calibrates(const GPTConfig& from, const GPTConfig& to, const Variant& v) {
  for (int64_t l = 0; l < from.n_layer; l++)
    if (conversion_calibrates(from.kv_heads(l), to.kv_heads(l), v)) return true;
  return false;
}

std::optional<Calibration> calibration_for(GPT& model, const GPTConfig& to, const Variant& v, const CalibrationSource& source) {
  if (!conversion_calibrates(model.config(), to, v)) return std::nullopt;
  return calibrate(model, calibration_windows(source, model.config().block_size));
}

std::optional<Calibration> calibration_for(GPT& model, int64_t G, const Variant& v, const CalibrationSource& source) {
  if (!conversion_calibrates(model.config().n_kv_head, G, v)) return std::nullopt;
  return calibrate(model, calibration_windows(source, model.config().block_size));
}

}  // namespace tapelm
