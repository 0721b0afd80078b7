#include "train/study/convert_model.h"

#include <chrono>
#include <nlohmann/json.hpp>

#include "autograd/ops.h"
#include "autograd/runtime.h"
#include "nn/accounting.h"
#include "train/eval.h"
#include "train/formats/checkpoint.h"
#include "train/formats/gguf.h"
#include "train/formats/hf.h"
#include "train/formats/model_source.h"
#include "train/streamed.h"

namespace tapelm {

Converted calibrate_and_convert(GPT& src, int64_t G, const Variant& v, uint64_t seed, const CalibrationSource& source) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::optional<Calibration> calib = calibration_for(src, G, v, source);
  Converted c;
  c.model = convert_kv_heads(src, G, {.variant = v, .seed = seed, .calib = calib ? &*calib : nullptr});
  c.calib_tokens = calib ? calib->tokens : 0;
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return c;
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
void check_streaming_memory(const formats::OpenedModel& src, const std::vector<Index>& batches) {
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
  const double need = StreamedModel::resident_bytes(c) + 8 * attention + 4 * tokens * d +
                      (batches.empty() ? 0 : prefill_bytes(c, static_cast<int64_t>(biggest), c.block_size, get_num_threads()) +
                                                 8 * (d + 1) * (d + 1));
  check_memory(need, available_memory_bytes(), "converting " + src.what + " one block at a time");
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
    Attention converted(p.nc, std::make_shared<Rng>(0));  // the block's attention converted; the rest is written as read
    convert_attention(*blk.attn, converted, c, p.nc.n_kv_head, p.v, S ? &*S : nullptr, rng);
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

/// With fill: writes the converted model as r.format asks — a tapelm checkpoint (with its
/// converted_from note), an HF directory or a GGUF file. Without: only refuses what that format
/// cannot hold, before any work.
void write_output(const ConvertRequest& r, const GPTConfig& nc, const formats::OpenedModel& src, const nlohmann::json& from,
                  const std::string& dtype, const formats::SinkFill* fill) {
  const Tokenizer* tok = src.tok ? &*src.tok : nullptr;
  const std::string what = src.what + " converted to " + std::to_string(nc.n_kv_head) + " kv heads";
  if (r.format == "hf") {
    if (!fill) hf::check_writable(r.out, nc, dtype, what);
    else hf::write_model(r.out, nc, tok, dtype, what, *fill);
  } else if (r.format == "gguf") {
    if (!fill) gguf::check_writable(r.out, nc, tok, dtype, what);
    else gguf::write_model(r.out, nc, tok, dtype, r.out, *fill);  // named by the output: general.name is its stem, as export's
  } else if (r.format.empty() || r.format == "tapelm") {
    if (dtype == "q8_0") throw Error(ErrorKind::usage, "--dtype q8_0: only --format gguf holds q8_0 weights");
    if (fill) write_streamed(r.out, nc, tok, {"converted_from", from.dump()}, dtype, *fill);
  } else {
    throw Error(ErrorKind::usage, "--format " + r.format + ": convert writes tapelm, hf or gguf");
  }
}

}  // namespace

ConvertModelResult convert_model(const ConvertRequest& r) {
  const auto t0 = Clock::now();
  const Variant v{&method(r.method), parse_grouping(r.grouping)};
  const formats::OpenedModel src = formats::open_model(r.from);
  const GPTConfig& c = src.config;
  const int64_t G = r.kv_heads;
  if (G <= 0 || c.n_kv_head % G != 0)
    throw Error(ErrorKind::config, "cannot convert " + std::to_string(c.n_kv_head) + " kv heads to " + std::to_string(G) +
                                       ": the new count must divide the old");
  GPTConfig nc = c;
  nc.n_kv_head = G;
  const nlohmann::json from{{"kv_heads_from", c.n_kv_head}, {"kv_heads", G}, {"method", r.method}, {"grouping", r.grouping}};
  ConvertModelResult out;
  out.dtype = !r.dtype.empty() ? r.dtype : src.kept_dtype();
  write_output(r, nc, src, from, out.dtype, nullptr);
  const bool calibrates = conversion_calibrates(c.n_kv_head, G, v);
  const std::vector<Index> batches =
      calibrates ? calibration_windows(calibration_source(r, src, v), c.block_size) : std::vector<Index>{};
  check_streaming_memory(src, batches);
  out.kv_heads_from = c.n_kv_head;
  for (const Index& b : batches) out.calib_tokens += b.numel();
  const ConvertBlocks plan{r, src, nc, v, batches, out.calib_tokens, t0};
  const formats::SinkFill fill = [&](formats::ModelSink& w) { convert_blocks(plan, w); };
  write_output(r, nc, src, from, out.dtype, &fill);
  out.seconds = since(t0);
  return out;
}

}  // namespace tapelm
