#include "train/eval.h"

#include "train/streamed.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "data/dataset.h"
#include "data/sampler.h"
#include "data/tokens.h"
#include "train/dist.h"
#include "train/formats/h5file.h"
#include "data/tokenizer/char.h"

namespace tapelm {

namespace fs = std::filesystem;

EvalBatches::EvalBatches(TokenSeq data, std::vector<int64_t> starts, int64_t T, int64_t batch)
    : data_(std::move(data)), windows_(true), starts_(std::move(starts)), T_(T), batch_(batch) {
  if (batch <= 0) throw Error(ErrorKind::usage, "evaluation batch size " + std::to_string(batch) + " is not positive");
}

EvalBatches::EvalBatches(std::vector<std::pair<Index, Index>> ready) : ready_(std::move(ready)) {}

size_t EvalBatches::size() const {
  if (!windows_) return ready_.size();
  const size_t b = static_cast<size_t>(batch_);
  return (starts_.size() + b - 1) / b;
}

void EvalBatches::fill(size_t i, Index& x, Index& y) const {
  if (!windows_) {
    x = ready_.at(i).first;
    y = ready_.at(i).second;
    return;
  }
  const size_t b = static_cast<size_t>(batch_);
  const std::vector<int64_t> chunk(starts_.begin() + i * b, starts_.begin() + std::min(starts_.size(), (i + 1) * b));
  fill_windows(data_, chunk, T_, x, y);
  for (int64_t s : chunk) data_.release(s, s + T_ + 1);
}

namespace {

int64_t count_targets(const Index& y) {
  return std::count_if(y.data.begin(), y.data.end(), [](int32_t t) { return t >= 0; });
}

// Eval mode for the life of the object, then the mode the model had.
class EvalMode {
 public:
  explicit EvalMode(GPT& model) : model_(model), was_training_(model.is_training()) { model_.eval(); }
  ~EvalMode() { model_.train(was_training_); }
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  GPT& model_;
  bool was_training_;
};

}  // namespace

EvalResult evaluate(GPT& model, const EvalBatches& batches, bool split_across_ranks) {
  NoGrad ng;
  EvalMode mode(model);
  const size_t stride = split_across_ranks ? static_cast<size_t>(dist::size()) : 1;
  const size_t first = split_across_ranks ? static_cast<size_t>(dist::rank()) : 0;
  // Sums of loss × targets and of targets: exact in double for any realistic split, so the mean
  // is the same however the batches fall (and over however many ranks).
  double sums[2] = {0, 0};
  Index x, y;
  // A model whose blocks are gathered from other ranks as they run (ZeRO stage 3) needs every rank
  // to run as many forwards: a rank past its last batch runs batch 0 again, not counted.
  const bool lockstep = split_across_ranks && model.residency && model.residency->collective() && batches.size() > 0;
  const size_t rounds = lockstep ? (batches.size() + stride - 1) / stride : 0;
  for (size_t k = 0, i = first; i < batches.size() || k < rounds; k++, i += stride) {
    const bool counted = i < batches.size();
    batches.fill(counted ? i : 0, x, y);
    const int64_t n = count_targets(y);
    if (n == 0 || !counted) {  // a mean over no targets is NaN, and NaN × 0 would spoil the sum
      if (lockstep) model.forward(x);
      continue;
    }
    sums[0] += static_cast<double>(model.loss(x, y).item()) * static_cast<double>(n);
    sums[1] += static_cast<double>(n);
  }
  if (split_across_ranks) dist::allreduce_sum(sums, 2);
  return {sums[1] > 0 ? sums[0] / sums[1] : 0.0, static_cast<int64_t>(sums[1])};
}

EvalResult evaluate_streamed(const formats::OpenedModel& m, const EvalBatches& batches) {
  NoGrad ng;
  const StreamedModel sm(m);
  std::vector<Tensor> xs;
  std::vector<Index> ys;
  Index x, y;
  for (size_t i = 0; i < batches.size(); i++) {
    batches.fill(i, x, y);
    if (count_targets(y) == 0) continue;
    xs.push_back(sm.embed(x));
    ys.push_back(y);
  }
  sm.for_each_block([&](const Block& b, int64_t) {
    for (Tensor& h : xs) h = b.forward(Var(h), nullptr).val();
  });
  double sums[2] = {0, 0};
  for (size_t i = 0; i < xs.size(); i++) {
    const int64_t n = count_targets(ys[i]);
    sums[0] += static_cast<double>(cross_entropy(sm.logits(xs[i]), ys[i]).item()) * static_cast<double>(n);
    sums[1] += static_cast<double>(n);
  }
  return {sums[1] > 0 ? sums[0] / sums[1] : 0.0, static_cast<int64_t>(sums[1])};
}

namespace {
// The bytes a stored element takes, by the dtype names the formats give.
double stored_element_bytes(const std::string& dtype) {
  if (dtype == "F64") return 8;
  if (dtype == "F16" || dtype == "BF16") return 2;
  if (dtype == "Q8_0") return 34.0 / 32.0;
  return 4;
}

// The largest block's tensors as the file stores them.
double largest_block_file_bytes(const formats::OpenedModel& m) {
  std::vector<double> per_layer(static_cast<size_t>(std::max<int64_t>(1, m.config.n_layer)), 0.0);
  for (const formats::FileTensor& t : m.layout) {
    if (t.parts.empty() || t.parts.front().first.rfind("blocks.", 0) != 0) continue;
    const size_t l = static_cast<size_t>(std::strtoll(t.parts.front().first.c_str() + 7, nullptr, 10));
    const formats::TensorSource::Info* info = m.src ? m.src->find(t.name) : nullptr;
    if (l < per_layer.size()) per_layer[l] += static_cast<double>(shape_numel(t.shape)) * stored_element_bytes(info ? info->dtype : "F32");
  }
  return *std::max_element(per_layer.begin(), per_layer.end());
}
}  // namespace

double streamed_eval_bytes(const formats::OpenedModel& m, double tokens, double pass_rows) {
  const GPTConfig& c = m.config;
  const double d = static_cast<double>(c.n_embd), h = static_cast<double>(c.mlp_hidden), v = static_cast<double>(c.vocab_size);
  // Floats a row of one pass holds at the peak of each phase, as measured (bench/EVAL_MEMORY.md:
  // d 2048, h 5504, vocab 512 and 32,000, 2,048 and 4,096 rows): the block's forward about 8d + 4h
  // (at the MLP's down projection its input, norm, attention output and residual, the norm the
  // MLP reads, its fused gate|up, their activation and product, and the projection's output), the
  // logits 2 vocab + 2d (the logits and their log-softmax beside the last hidden state and norm).
  const double pass = 4.0 * pass_rows * std::max(8 * d + 4 * h, 2 * v + 2 * d);
  constexpr double kProcess = 32e6;  // the binary, its libraries and the thread pools: 28 MB measured
  return StreamedModel::resident_bytes(c) + 4.0 * tokens * d + pass + largest_block_file_bytes(m) + kProcess;
}

EvalResult evaluate_with_grads(GPT& model, const EvalBatches& batches) {
  EvalMode mode(model);
  Index x, y;
  int64_t total = 0;  // first, so each batch's backward carries its share of the mean
  for (size_t i = 0; i < batches.size(); i++) {
    batches.fill(i, x, y);
    total += count_targets(y);
  }
  double loss_sum = 0;
  for (size_t i = 0; i < batches.size(); i++) {
    batches.fill(i, x, y);
    const int64_t n = count_targets(y);
    if (n == 0) continue;
    Var l = model.loss(x, y);
    loss_sum += static_cast<double>(l.item()) * static_cast<double>(n);
    backward(mul(l, static_cast<float>(static_cast<double>(n) / static_cast<double>(total))));
  }
  return {total > 0 ? loss_sum / static_cast<double>(total) : 0.0, total};
}

double evaluate_windows(GPT& model, const TokenSeq& data, const std::vector<int64_t>& starts, int64_t T,
                        int64_t batch, bool split_across_ranks) {
  return evaluate(model, EvalBatches(data, starts, T, batch), split_across_ranks).loss;
}

int64_t split_eval_batch(const GPTConfig& c) {
  const double logits = static_cast<double>(c.block_size) * static_cast<double>(c.vocab_size) * sizeof(float);
  return std::clamp<int64_t>(static_cast<int64_t>(static_cast<double>(int64_t{1} << 28) / logits), 1, 32);
}

namespace {
/// The windows evaluate_split covers: all, or the first ⌈max_tokens / T⌉ of them (as `eval --tokens`).
size_t split_windows(int64_t max_tokens, size_t all, int64_t T) {
  return max_tokens > 0 ? std::min(all, static_cast<size_t>((max_tokens + T - 1) / T)) : all;
}
}  // namespace

double evaluate_split(GPT& model, const TokenSeq& split, bool split_across_ranks, int64_t max_tokens) {
  const int64_t T = model.config().block_size;
  std::vector<int64_t> starts = eval_windows(split, T, "val split");
  starts.resize(split_windows(max_tokens, starts.size(), T));
  return evaluate_windows(model, split, starts, T, split_eval_batch(model.config()), split_across_ranks);
}

std::string split_eval_what(int64_t max_tokens, int64_t n, int64_t T) {
  const size_t all = n >= T + 1 ? static_cast<size_t>((n - 1) / T) : 0;
  const size_t used = split_windows(max_tokens, all, T);
  if (used == all) return "the whole val split";
  return "the first " + std::to_string(static_cast<int64_t>(used) * T) + " tokens of the val split";
}

EvalBatches EvalData::batches(int64_t batch) const {
  return ready.empty() ? EvalBatches(ids, starts, T, batch) : EvalBatches(ready);
}

namespace {

bool is_hdf5(const std::string& path) {
  if (!fs::is_regular_file(path)) return false;  // a FIFO would block the read below
  std::ifstream in(path, std::ios::binary);
  char sig[8] = {};
  in.read(sig, 8);
  return in.gcount() == 8 && std::string(sig, 8) == std::string("\x89HDF\r\n\x1a\n", 8);
}

// A parity file's /tokens [B, T+1] as one batch: inputs [:, :-1], targets [:, 1:].
std::pair<Index, Index> read_parity_tokens(const std::string& path, const GPTConfig& c) {
  H5File f = H5File::open_read(path);
  Shape s;
  std::vector<int32_t> tok = f.read_ints("/tokens", &s);
  if (s.size() != 2 || s[1] < 2) throw Error(ErrorKind::data, path + ": /tokens must be [B, T+1], got " + shape_str(s));
  if (s[1] - 1 > c.block_size)
    throw Error(ErrorKind::data, path + ": /tokens holds " + std::to_string(s[1] - 1) + " positions, block_size is " +
                                std::to_string(c.block_size));
  Index x, y;
  x.shape = y.shape = {s[0], s[1] - 1};
  for (int64_t b = 0; b < s[0]; b++)
    for (int64_t t = 0; t + 1 < s[1]; t++) {
      const int32_t in = tok[b * s[1] + t], out = tok[b * s[1] + t + 1];
      if (in < 0 || in >= c.vocab_size || out < -1 || out >= c.vocab_size)
        throw Error(ErrorKind::data, path + ": /tokens[" + std::to_string(b) + ", " + std::to_string(t) +
                                    "] holds an id outside [0, " + std::to_string(c.vocab_size) + ")");
      x.data.push_back(in);
      y.data.push_back(out);
    }
  if (count_targets(y) == 0) throw Error(ErrorKind::data, path + ": no target positions to evaluate");
  return {std::move(x), std::move(y)};
}

}  // namespace

EvalData load_eval_data(const std::string& path, const std::string& split, const GPTConfig& c,
                        const Tokenizer* tok) {
  EvalData d;
  if (path.ends_with(".h5") || is_hdf5(path)) {
    d.ready.push_back(read_parity_tokens(path, c));
    return d;
  }
  if (path.ends_with(".bin")) {
    d.ids = TokenSeq::map_files({path});
  } else {
    Corpus corpus;
    if (fs::is_directory(path)) {
      corpus = load_corpus(path);
    } else {
      const std::string text = read_text_file(path);
      std::vector<int32_t> ids;
      try {  // invalid UTF-8 named no file (convert --calib, eval --data)
        corpus.tok = tok ? *tok : Tokenizer::of(CharTokenizer::from_text(text));
        ids = corpus.tok.encode(text);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::data) throw;
        throw Error(ErrorKind::data, "data file " + path + ": " + e.what());
      }
      // one document: a sentencepiece tokenizer starts it with BOS, as prepare does
      if (corpus.tok.bos_id() >= 0) ids.insert(ids.begin(), corpus.tok.bos_id());
      TokenSplit sp = split_90_10(ids);
      corpus.train = std::move(sp.train);
      corpus.val = std::move(sp.val);
    }
    if (split == "train") {
      d.ids = std::move(corpus.train);
    } else if (split == "val") {
      d.ids = std::move(corpus.val);
    } else {
      d.ids = TokenSeq::concat(corpus.train, corpus.val);
    }
  }
  d.ids.check_below(c.vocab_size, path);
  d.T = c.block_size;
  d.starts = eval_windows(d.ids, d.T, path);
  return d;
}

}  // namespace tapelm
