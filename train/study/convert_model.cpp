#include "train/study/convert_model.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>

#include "autograd/ops.h"
#include "autograd/runtime.h"
#include "nn/accounting.h"
#include "train/eval.h"
#include "train/formats/checkpoint.h"
#include "train/formats/model_source.h"
#include "train/formats/registry.h"
#include "train/streamed.h"
#include "train/study/convert/budget.h"

namespace tapelm {

double next_token_loss(GPT& m, const std::vector<Index>& windows) {
  std::vector<std::pair<Index, Index>> ready;
  for (const Index& x : windows) {
    Index y = x;
    const int64_t B = x.shape[0], T = x.shape[1];
    for (int64_t b = 0; b < B; b++) {
      for (int64_t t = 0; t + 1 < T; t++) y.data[b * T + t] = x.data[b * T + t + 1];
      y.data[b * T + T - 1] = -1;  // ignored
    }
    ready.emplace_back(x, std::move(y));
  }
  return evaluate(m, EvalBatches(std::move(ready))).loss;
}

int64_t kv_budget_of(const KvTarget& t, const Variant& v, const GPTConfig& c) {
  if (t.budget > 0) return t.budget;
  if (v.grouping != Grouping::PerLayer) return 0;
  if (t.heads.size() != 1) throw Error(ErrorKind::usage, "grouping per-layer places one count's budget: give one count of kv heads");
  return t.heads[0] * c.n_layer;
}

Converted calibrate_and_convert(GPT& src, const KvTarget& target, const Variant& v, uint64_t seed, const CalibrationSource& source) {
  const auto t0 = std::chrono::steady_clock::now();
  if ((target.budget > 0) == !target.heads.empty())
    throw Error(ErrorKind::internal, "calibrate_and_convert: a target of either kv heads or a budget");
  std::optional<Calibration> calib;
  std::vector<int64_t> heads = target.heads;
  const int64_t budget = kv_budget_of(target, v, src.config());
  if (budget > 0) {  // the allocation measures every layer's conversion on the calibration windows
    check_kv_budget(src.config(), budget);
    const std::vector<Index> windows = calibration_windows(source, src.config().block_size);
    calib = calibrate(src, windows);
    heads = kv_budget_heads(src, budget, v, &*calib, [&](GPT& m) { return next_token_loss(m, windows); });
  } else {
    calib = calibration_for(src, converted_config(src.config(), heads), v, source);
  }
  Converted c;
  c.model = convert_kv_heads(src, heads, {.variant = v, .seed = seed, .calib = calib ? &*calib : nullptr});
  c.calib_tokens = calib ? calib->tokens : 0;
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
}

Converted calibrate_and_convert(GPT& src, int64_t G, const Variant& v, uint64_t seed, const CalibrationSource& source) {
  return calibrate_and_convert(src, KvTarget{.heads = {G}}, v, seed, source);
}

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

/// The calibration source converting by v reads: text and corpora calibrate on their train split;
/// token and parity files on all they hold.
CalibrationSource calibration_source(const ConvertRequest& r, const formats::OpenedModel& src, const Variant& v) {
  if (r.calib.empty()) throw Error(ErrorKind::usage, "--calib: converting by " + v.name() + " needs calibration data");
  const EvalData data = load_eval_data(r.calib, "train", src.config, src.tok ? &*src.tok : nullptr);
  CalibrationSource cs{.ids = data.ids, .tokens = r.calib_tokens, .seed = r.seed, .what = r.calib};
  for (const auto& b : data.ready) cs.batches.push_back(b.first);
  return cs;
}

/// Memory a streamed conversion holds at its peak: the tensors outside the blocks, a block and its
/// attention twice more (the aligned copy, the converted one), and with calibration every batch's
/// hidden states, one batch's forward and the second-moment matrix.
double streaming_bytes(const formats::OpenedModel& src, const std::vector<Index>& batches) {
  const GPTConfig& c = src.config;
  double attention = 0;
  for (const auto& [name, shape] : parameter_shapes(c))
    if (name.find(".attn.") != std::string::npos) attention += static_cast<double>(shape_numel(shape));
  attention /= static_cast<double>(c.n_layer);
  double tokens = 0, biggest = 0;
  for (const Index& b : batches) {
    tokens += static_cast<double>(b.numel());
    biggest = std::max(biggest, static_cast<double>(b.shape[0]));
  }
  const double d = static_cast<double>(c.n_embd);
  return StreamedModel::resident_bytes(c) + 8 * attention + 4 * tokens * d +
         (batches.empty() ? 0 : prefill_bytes(c, static_cast<int64_t>(biggest), c.block_size, get_num_threads()) + 8 * (d + 1) * (d + 1));
}
void check_streaming_memory(const formats::OpenedModel& src, const std::vector<Index>& batches) {
  check_memory(streaming_bytes(src, batches), available_memory_bytes(), "converting " + src.what + " one block at a time");
}

/// What a streamed conversion runs on.
struct ConvertBlocks {
  const ConvertRequest& r;
  const formats::OpenedModel& src;
  const GPTConfig& nc;  // the converted model's
  const Variant& v;
  const std::vector<Index>& batches;  // calibration windows (none: the variant does not calibrate)
  int64_t calib_tokens;
  Clock::time_point t0;
};

/// Pushes the converted model to w: the tensors outside the blocks as read, then block by block
/// its calibration second moments (from the hidden states at its input, which its forward then
/// advances), its converted attention and the rest as read, with a progress line per block.
void convert_blocks(const ConvertBlocks& p, formats::ModelSink& w) {
  const GPTConfig& c = p.src.config;
  const int64_t L = c.n_layer, d = c.n_embd;
  const double block_flops = (model_cost(c).forward_flops_per_token - 2.0 * static_cast<double>(d) * static_cast<double>(c.vocab_size)) /
                             static_cast<double>(L) * static_cast<double>(p.calib_tokens);
  NoGrad ng;
  StreamedModel sm(p.src);
  for (const auto& [name, t] : sm.outer()) w.tensor(name, t);  // everything outside the blocks, as it is
  std::vector<Tensor> xs;  // each calibration batch's hidden state at the current block's input
  for (const Index& b : p.batches) xs.push_back(sm.embed(b));
  sm.drop_outer();
  Rng rng(p.r.seed ^ 0xC0DE);
  auto tb = Clock::now();
  sm.for_each_block([&](const Block& blk, int64_t l) {
    const double read_s = since(tb);
    std::optional<la::Mat> S;
    const auto tc = Clock::now();
    if (!p.batches.empty()) {  // this block's second moments, and the next block's inputs
      S.emplace(d + 1, d + 1);
      for (size_t i = 0; i < p.batches.size(); i++) {
        Tensor attn_in;
        Var y = blk.forward(Var(xs[i]), nullptr, &attn_in);
        accumulate_gram(*S, attn_in.reshape({p.batches[i].numel(), d}));
        if (l + 1 < L) xs[i] = y.val();
      }
      finish_gram(*S, p.calib_tokens);
    }
    const double calib_s = since(tc);
    const auto tv = Clock::now();
    Attention converted(p.nc.layer(l), std::make_shared<Rng>(0));  // the block's attention converted; the rest is written as read
    try {
      convert_attention(*blk.attn, converted, c.layer(l), p.nc.kv_heads(l), p.v, S ? &*S : nullptr, rng, l);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::data) throw;
      throw Error(ErrorKind::data, p.src.what + ": " + e.what());
    }
    const std::string prefix = "blocks." + std::to_string(l) + ".";
    for (const auto& [n, q] : blk.named_parameters())
      if (n.rfind("attn.", 0) != 0) w.tensor(prefix + n, q.val());
    for (const auto& [n, q] : converted.named_parameters()) w.tensor(prefix + "attn." + n, q.val());
    const double convert_s = since(tv), done = since(p.t0);
    if (p.r.progress) {
      const std::string rate = S ? " (" + std::to_string(static_cast<int>(block_flops / std::max(calib_s, 1e-9) / 1e9)) + " GFLOP/s)" : "";
      std::printf("block %ld/%ld: read %.1fs, calibration forward %.1fs%s, conversion %.1fs; %.0fs so far, about %.0fs left\n",
                  static_cast<long>(l + 1), static_cast<long>(L), read_s, calib_s, rate.c_str(), convert_s, done,
                  done / static_cast<double>(l + 1) * static_cast<double>(L - l - 1));
      std::fflush(stdout);
    }
    tb = Clock::now();
  });
}

/// With fill: writes the converted model as r.format asks (a row of the format registry: a
/// tapelm checkpoint with its converted_from note, an HF directory, a GGUF file). Without: only
/// refuses what that format cannot hold, before any work.
void write_output(const ConvertRequest& r, const GPTConfig& nc, const formats::OpenedModel& src, const nlohmann::json& from,
                  WeightType dtype, const formats::SinkFill* fill) {
  const formats::ModelFormat& f = formats::writable_format(r.format.empty() ? "tapelm" : r.format, "--format");
  const Tokenizer* tok = src.tok ? &*src.tok : nullptr;
  // named by the output where the format keeps a name (GGUF's general.name is its stem, as export's)
  const formats::Output o{.path = r.out, .dtype = dtype, .what = src.what + " converted to " + nc.kv_heads_str() + " kv heads",
                          .name = r.out, .note = {"converted_from", from.dump()}};
  if (fill) f.write(o, nc, tok, *fill);
  else f.check_writable(o, nc, tok);
}

/// A budget's counts per layer, measured on the whole model in memory (budget.h: a conversion per
/// layer and count, each evaluated on the calibration windows), as calibrate_and_convert measures them.
std::vector<int64_t> kv_budget_in_memory(const ConvertRequest& r, const formats::OpenedModel& src, const Variant& v, int64_t budget,
                                         const std::vector<Index>& batches) {
  if (r.progress) std::printf("KV budget %ld: converting each layer alone to each count, on %s\n", static_cast<long>(budget), src.what.c_str());
  const double params = static_cast<double>(model_cost(src.config).params);  // the model and one converted copy
  check_memory(8.0 * params, available_memory_bytes(), "a KV budget, which converts " + src.what + " in memory layer by layer");
  std::unique_ptr<GPT> whole = src.load();
  const Calibration calib = calibrate(*whole, batches);
  const std::vector<int64_t> heads = kv_budget_heads(*whole, budget, v, &calib, [&](GPT& m) { return next_token_loss(m, batches); });
  if (r.progress) std::printf("KV budget %ld: %s heads layer by layer\n", static_cast<long>(budget), converted_config(src.config, heads).kv_heads_str().c_str());
  return heads;
}

/// Fills a model in memory by name, each parameter once (its shape checked), as a file sink would
/// write them: what convert_blocks pushes, kept instead of written.
class ParameterFill : public formats::ModelSink {
 public:
  /// With held_as, each block is narrowed (into `narrowed`) once its last parameter is filled.
  ParameterFill(GPT& m, const NarrowedBlocks::HeldAs& held_as = nullptr, NarrowedBlocks* narrowed = nullptr)
      : model_(m), held_as_(held_as), narrowed_(narrowed), unfilled_(m.blocks.size(), 0) {
    for (const auto& [name, p] : m.named_parameters()) {
      params_.emplace(name, p);
      if (const int64_t l = block_index(name); l >= 0) unfilled_.at(static_cast<size_t>(l))++;
    }
  }
  void tensor(const std::string& name, const Tensor& t) override {
    const auto it = params_.find(name);
    if (it == params_.end()) throw Error(ErrorKind::internal, "conversion: no parameter " + name + " to fill, or filled twice");
    if (it->second.shape() != t.shape())
      throw Error(ErrorKind::internal, "conversion: " + name + " is " + shape_str(t.shape()) + ", the model's " + shape_str(it->second.shape()));
    std::copy_n(t.data(), t.numel(), it->second.val().data());
    params_.erase(it);
    if (const int64_t l = block_index(name); held_as_ && l >= 0 && --unfilled_.at(static_cast<size_t>(l)) == 0)
      narrowed_->narrow(model_, static_cast<size_t>(l), held_as_);
  }
  /// Every parameter was filled (an internal Error naming the first one that was not).
  void check_filled() const {
    if (!params_.empty()) throw Error(ErrorKind::internal, "conversion: parameter " + params_.begin()->first + " was never filled");
  }

 private:
  GPT& model_;
  const NarrowedBlocks::HeldAs held_as_;
  NarrowedBlocks* narrowed_;
  std::vector<int64_t> unfilled_;  // of each block's parameters
  std::map<std::string, Var> params_;
};

}  // namespace

Converted convert_streamed_in_memory(const std::string& from, int64_t G, const Variant& v, uint64_t seed,
                                     const CalibrationSource& source, const NarrowedBlocks::HeldAs& held_as, double narrowed_values) {
  const auto t0 = Clock::now();
  const formats::OpenedModel src = formats::open_model(from);
  const GPTConfig& c = src.config;
  if (kv_budget_of({.heads = {G}}, v, c) > 0)
    throw Error(ErrorKind::internal, "convert_streamed_in_memory: a budget converts the model loaded whole");
  const GPTConfig nc = converted_config(c, {G});
  const std::vector<Index> batches = conversion_calibrates(c, nc, v) ? calibration_windows(source, c.block_size) : std::vector<Index>{};
  const double weights = 4.0 * static_cast<double>(model_cost(nc).params) - (held_as ? 2.0 * narrowed_values : 0.0);
  check_memory(weights + streaming_bytes(src, batches), available_memory_bytes(),
               "converting " + src.what + " one block at a time into a model in memory" +
                   (held_as && narrowed_values > 0 ? " (its frozen block weights in 16 bits)" : ""));
  Converted out;
  // seeded as convert_kv_heads seeds it (its dropout stream too); nothing drawn: every weight is filled
  out.model = std::make_unique<GPT>(nc, seed, [](const std::string&) { return false; });
  for (const Index& b : batches) out.calib_tokens += b.numel();
  ConvertRequest r;
  r.seed = seed;
  const ConvertBlocks plan{r, src, nc, v, batches, out.calib_tokens, t0};
  const auto narrowed = held_as ? std::make_shared<NarrowedBlocks>(out.model->blocks.size()) : nullptr;
  ParameterFill fill(*out.model, held_as, narrowed.get());
  convert_blocks(plan, fill);
  fill.check_filled();
  if (narrowed && narrowed->values() > 0) out.model->residency = narrowed;
  out.seconds = since(t0);
  return out;
}

ConvertModelResult convert_model(const ConvertRequest& r) {
  const auto t0 = Clock::now();
  const Variant& v = r.variant;
  const formats::OpenedModel src = formats::open_model(r.from);
  const GPTConfig& c = src.config;
  if ((r.kv_budget > 0) == !r.kv_heads.empty()) throw Error(ErrorKind::usage, "convert: give either --kv-heads or --kv-budget");
  // a budget calibrates (its allocation measures the layers' conversions), whatever the variant
  const int64_t budget = kv_budget_of({.heads = r.kv_heads, .budget = r.kv_budget}, v, c);
  if (budget > 0) check_kv_budget(c, budget);
  const WeightType dtype = r.dtype ? *r.dtype : src.kept_dtype();
  // what the output cannot hold is refused before any work (a budget's counts: again once known)
  write_output(r, budget > 0 ? c : converted_config(c, r.kv_heads), src, {}, dtype, nullptr);
  const bool calibrates = budget > 0 || conversion_calibrates(c, converted_config(c, r.kv_heads), v);
  const std::vector<Index> batches =
      calibrates ? calibration_windows(calibration_source(r, src, v), c.block_size) : std::vector<Index>{};
  check_streaming_memory(src, batches);
  const GPTConfig nc = converted_config(c, budget > 0 ? kv_budget_in_memory(r, src, v, budget, batches) : r.kv_heads);
  const nlohmann::json from{
      {"kv_heads_from", c.kv_heads_json()}, {"kv_heads", nc.kv_heads_json()}, {"method", v.method->name}, {"grouping", to_string(v.grouping)}};
  ConvertModelResult out;
  out.dtype = dtype;
  out.kv_heads = nc.per_layer_kv() ? nc.layer_kv_heads : std::vector<int64_t>{nc.n_kv_head};
  if (budget > 0) write_output(r, nc, src, from, out.dtype, nullptr);
  out.kv_heads_from = c.n_kv_head;
  for (const Index& b : batches) out.calib_tokens += b.numel();
  const ConvertBlocks plan{r, src, nc, v, batches, out.calib_tokens, t0};
  const formats::SinkFill fill = [&](formats::ModelSink& w) { convert_blocks(plan, w); };
  write_output(r, nc, src, from, out.dtype, &fill);
  out.seconds = since(t0);
  return out;
}

}  // namespace tapelm
