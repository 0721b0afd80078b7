#include "train/cli/cli.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "autograd/autocast.h"
#include "autograd/gradcheck.h"
#include "autograd/isa.h"
#include "autograd/runtime.h"
#include "data/dataset.h"
#include "data/prepare.h"
#include "data/sampler.h"
#include "train/dist.h"
#include "nn/accounting.h"
#include "nn/generate.h"
#include "train/bench.h"
#include "train/study/convert_model.h"
#include "train/streamed.h"
#include "train/eval.h"
#include "train/formats/hf_tokenizer.h"
#include "train/formats/model_source.h"
#include "train/formats/registry.h"
#include "train/study/plot.h"
#include "train/study/sweep/runner.h"
#include "train/study/uptrain.h"
#include "train/trainer.h"
#include "train/train_config.h"

namespace tapelm::cli {

namespace fs = std::filesystem;

namespace {

// seeds follow the config's rule (TrainConfig's max_seed): 0 to 2^63 - 1
const CLI::Range seed_range(uint64_t{0}, max_seed);

/// "a,b,c" -> {a, b, c}; an empty item is a usage error naming the flag.
std::vector<std::string> split_list(const std::string& s, const std::string& flag) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (item.empty()) throw Error(ErrorKind::usage, flag + ": empty item in \"" + s.substr(0, 80) + "\"");
    out.push_back(item);
  }
  if (out.empty()) throw Error(ErrorKind::usage, flag + ": no items");
  return out;
}

/// A usage Error when `out` names the same file as the input `in`: writing it would replace the
/// input it is made from (convert --out equal to --from silently overwrote its source).
void refuse_same_file(const std::string& in, const std::string& in_flag, const std::string& out, const std::string& out_flag) {
  std::error_code ec;
  if (fs::equivalent(in, out, ec) || fs::absolute(in).lexically_normal() == fs::absolute(out).lexically_normal())
    throw Error(ErrorKind::usage, out_flag + " " + out + " is the " + in_flag + " file: write the result elsewhere");
}

// More tokens than any sample is read for: sample warns, as it will run for hours.
constexpr int64_t sample_warn_tokens = 1000000;

/// "llama2c, hf, gguf".
std::string format_list() {
  std::string out;
  for (const std::string& n : formats::model_format_names()) out += (out.empty() ? "" : ", ") + n;
  return out;
}

/// Registers a subcommand whose flags fill an Args (starting as `init`) held by the command itself.
template <typename Args>
Command command(CLI::App& app, const char* name, const std::string& help, void (*flags)(CLI::App&, Args&),
                int (*run)(const Args&), Args init = {}) {
  auto args = std::make_shared<Args>(std::move(init));
  CLI::App* sub = app.add_subcommand(name, help);
  flags(*sub, *args);
  return {sub, [args, run] { return run(*args); }};
}

const std::vector<std::string> precision_names = enum_names<Precision>();
constexpr const char* precision_help =
    "products of the linear layers: f32, bf16 (bf16 inputs, f32 sums and outputs, as torch.autocast; needs AVX512-BF16), "
    "bf16-emulated (bf16's numbers on any CPU, no faster than f32); the same as --set precision=...";

/// The one-line refusal of a precision this machine cannot run, before any work is done.
void check_precision_runs(Precision p) {
  if (const std::string why = precision_unavailable(p); !why.empty())
    throw Error(ErrorKind::usage, why);
}

struct TrainArgs {
  std::string config, data, out;
  std::vector<std::string> sets;
  std::string precision;  // --precision: appended to sets
  bool resume = false, quiet = false;
  bool check_sync = false;  // multi-rank: checksum every rank's weights after every step
  const int* threads = nullptr;  // the global --threads
};

void train_flags(CLI::App& c, TrainArgs& a) {
  c.add_option("--config", a.config, "training config JSON (model and training keys)");
  c.add_option("--set", a.sets, "override a config key: key=value (repeatable)");
  c.add_option("--precision", a.precision, precision_help)->check(CLI::IsMember(precision_names));
  c.add_option("--data", a.data, "UTF-8 text file or a directory of token shards (`prepare`)")->required();
  c.add_option("--out", a.out, "run directory (checkpoint.h5, metrics.jsonl)")->required();
  c.add_flag("--resume", a.resume, "continue from RUN_DIR/checkpoint.h5");
  c.add_flag("--quiet", a.quiet, "no progress lines");
  c.add_flag("--check-sync", a.check_sync, "under mpirun: compare every rank's weights after every step (debugging)");
}

int run_train(const TrainArgs& a) {
  const int threads = *a.threads;
  const StopToken stop = signal_stop_token();  // first, so a signal during set-up cannot kill one rank of a job
  Corpus corpus;
  TrainConfig cfg;
  std::string setup_error;
  try {  // in a multi-rank job every rank reads its own inputs; dist::agree ends the job if one fails
    corpus = load_corpus(a.data);
    std::vector<std::string> sets = a.sets;
    if (!a.precision.empty()) sets.push_back("precision=" + a.precision);
    cfg = build_train_config(a.config, a.resume, a.out, sets, corpus.tok.vocab_size(), threads);
    check_precision_runs(cfg.precision);
    check_training_memory(cfg);
    check_window_fits(corpus.train.size(), cfg.model.block_size, a.data + ": the train split");
    check_window_fits(corpus.val.size(), cfg.model.block_size, a.data + ": the val split");
  } catch (const std::exception& e) {
    if (!dist::multi()) throw;
    setup_error = *e.what() ? e.what() : "unknown error";
  }
  dist::agree(setup_error);
  TrainOptions opt;
  opt.resume = a.resume;
  opt.quiet = a.quiet;
  opt.check_sync = a.check_sync;
  opt.stop = stop;
  const bool talk = !a.quiet && dist::rank() == 0;
  if (dist::rank() == 0 && cfg.model.vocab_size > corpus.tok.vocab_size())
    std::fprintf(stderr, "tapelm: warning: vocab_size %ld exceeds the %d symbols of %s's tokenizer: ids %d to %ld never occur (sample never draws them)\n",
                 (long)cfg.model.vocab_size, corpus.tok.vocab_size(), a.data.c_str(), corpus.tok.vocab_size(),
                 (long)cfg.model.vocab_size - 1);
  const ModelCost cost = model_cost(cfg.model);
  if (talk) {
    std::printf("training %.2fM parameters (%ld layers, %ld heads, %s kv heads, d %ld, T %ld) on %zu tokens; run dir %s\n",
                cost.params / 1e6, (long)cfg.model.n_layer, (long)cfg.model.n_head, cfg.model.kv_heads_str().c_str(),
                (long)cfg.model.n_embd, (long)cfg.model.block_size, corpus.train.size(), a.out.c_str());
    if (dist::multi())
      std::printf("data parallel over %d ranks: %ld windows per rank per micro-step, %ld per step in all\n", dist::size(),
                  (long)cfg.batch_size, (long)(cfg.batch_size * cfg.grad_accum * dist::size()));
  }
  TrainResult r = train(cfg, corpus, a.out, opt);
  if (talk) {
    std::string full;
    if (r.val_loss_full >= 0) {
      char b[96];
      std::snprintf(b, sizeof b, ", %.4f on the whole val split", r.val_loss_full);
      full = b;
    }
    std::printf("%s after %ld steps in %.1fs: val loss %.4f (%ld fixed batches)%s, median %.0f tokens/s\n",
                r.interrupted ? "stopped" : "done", (long)r.steps, r.seconds, r.val_loss, (long)cfg.eval_iters,
                full.c_str(), r.tokens_per_s);
    if (dist::multi())
      std::printf("gradient all-reduce: %.1fs, %.1f%% of the wall time\n", r.comm_seconds,
                  100.0 * r.comm_seconds / std::max(r.seconds, 1e-9));
  }
  return 0;
}

/// --distill and its settings, as uptrain and sweep take them.
struct DistillArgs {
  bool on = false;
  double lambda = -1;  // not given
  double temperature = UptrainOptions{}.distill_temperature;
  double attention = 0;

  /// with_attention: also --distill-attention (uptrain)
  void add_flags(CLI::App& c, const std::string& what, bool with_attention = false) {
    c.add_flag("--distill", on, what);
    c.add_option("--distill-lambda", lambda, "with --distill: the weight of the source's soft targets (default " +
                                                 std::to_string(kDefaultDistillLambda).substr(0, 4) + ")")
        ->check(CLI::Range(0.0, 1.0));
    c.add_option("--distill-temperature", temperature, "with --distill: the softmax temperature T")->check(CLI::PositiveNumber);
    if (with_attention)
      c.add_option("--distill-attention", attention,
                   "with --distill: the weight beta of a per-layer term, beta·mean over layers of |o - t|²/|t|², each "
                   "block's attention output o against the source's t (default 0: off)")
          ->check(CLI::NonNegativeNumber);
  }
  /// λ: 0 without --distill; the settings without --distill are a usage Error.
  double lambda_for(const std::string& command) const {
    if ((lambda >= 0 || temperature != UptrainOptions{}.distill_temperature || attention > 0) && !on)
      throw Error(ErrorKind::usage, command + ": --distill-lambda, --distill-temperature and --distill-attention need --distill");
    return !on ? 0 : lambda >= 0 ? lambda : kDefaultDistillLambda;
  }
};

struct UptrainArgs {
  std::string from, method = "mean", data, out, schedule = "rewarm", grouping = "contiguous", config, precision;
  int64_t kv_heads = 0, calib_tokens = 16384;
  double fraction = 0.05, lr = 0;
  DistillArgs distill;
  bool lr_given = false;
  uint64_t seed = 1;
  bool resume = false, quiet = false;
};

void uptrain_flags(CLI::App& c, UptrainArgs& a) {
  c.add_option("--from", a.from, "full checkpoint of the original run")->required();
  c.add_option("--kv-heads", a.kv_heads, "new number of key/value heads")->required();
  c.add_option("--method", a.method, "conversion method")->check(CLI::IsMember(method_names()));
  c.add_option("--grouping", a.grouping, "contiguous, similar, or per-layer (--kv-heads' budget over all layers, placed where the "
                                         "conversion error is largest)")
      ->check(CLI::IsMember({"contiguous", "similar", "per-layer"}));
  c.add_option("--calib-tokens", a.calib_tokens, "calibration tokens from the train split (aligned, fit, aligned-fit, similar)");
  c.add_option("--fraction", a.fraction, "uptraining steps as a fraction of the original max_iters (0: convert and evaluate)");
  c.add_option("--schedule", a.schedule, "rewarm (warmup + cosine) or continue (the original final lr)")
      ->check(CLI::IsMember({"rewarm", "continue"}));
  c.add_option("--data", a.data, "the original run's text or prepared directory")->required();
  c.add_option("--out", a.out, "run directory")->required();
  c.add_option("--config", a.config,
               "training config JSON for a weights-only source (an imported model); the model keys are the checkpoint's");
  c.add_option("--lr", a.lr, "rewarm: peak learning rate (default: half the original run's peak)")
      ->each([&a](const std::string&) { a.lr_given = true; });
  c.add_option("--seed", a.seed, "seed for batches, dropout and random init")->check(seed_range);
  c.add_option("--precision", a.precision, std::string(precision_help) + " (default: the original run's)")
      ->check(CLI::IsMember(precision_names));
  a.distill.add_flags(c, "distil from the source model: loss (1 - lambda)·CE + lambda·T²·KL(source || converted)", true);
  c.add_flag("--resume", a.resume, "continue an interrupted uptraining run");
  c.add_flag("--quiet", a.quiet, "no progress lines");
}

int run_uptrain(const UptrainArgs& a) {
  Corpus corpus = load_corpus(a.data);
  const TrainConfig original = source_train_config(a.from, a.config, "uptraining");
  check_precision_runs(a.precision.empty() ? original.precision : enum_from_name<Precision>(a.precision, "--precision"));
  if (const H5File f = H5File::open_read(a.from); has_tokenizer(f) && !(read_tokenizer(f) == corpus.tok))
    throw Error(ErrorKind::data, a.data + ": its characters differ from the tokenizer of " + a.from);
  UptrainOptions o;
  o.kv_heads = a.kv_heads;
  o.variant = {&method(a.method), enum_from_name<Grouping>(a.grouping, "--grouping")};
  o.calib_tokens = a.calib_tokens;
  o.fraction = a.fraction;
  o.schedule = parse_uptrain_schedule(a.schedule);
  if (a.lr_given) o.lr = a.lr;
  o.seed = a.seed;
  o.resume = a.resume;
  o.quiet = a.quiet;
  o.stop = signal_stop_token();
  o.original = original;
  if (!a.precision.empty()) o.precision = enum_from_name<Precision>(a.precision, "--precision");
  o.distill_lambda = a.distill.lambda_for("uptrain");
  o.distill_temperature = a.distill.temperature;
  o.distill_attention = a.distill.attention;
  UptrainResult r = uptrain(a.from, corpus, a.out, o);
  if (o.stop.requested()) {
    std::printf("uptraining stopped by signal; resume with --resume\n");
    return 0;
  }
  std::printf("uptrained %s to %s kv heads by %s (%s groups, converted in %.2fs): %ld steps (fraction %g, schedule %s, lr %.2e -> %.2e): val loss %.4f "
              "(converted, before uptraining: %.4f); checkpoint %s/checkpoint.h5\n",
              a.from.c_str(), r.config.model.kv_heads_str().c_str(), a.method.c_str(), a.grouping.c_str(), r.convert_seconds, (long)r.steps, a.fraction, a.schedule.c_str(),
              r.config.learning_rate, r.config.decay_lr ? r.config.min_lr : r.config.learning_rate, r.val_loss,
              r.loss_before, a.out.c_str());
  return 0;
}

struct SweepArgs {
  std::string preset = "tiny", data, out, methods, groupings, from, config, precision, distill_methods;
  DistillArgs distill;
  bool quiet = false, scratch = false;
};

void sweep_flags(CLI::App& c, SweepArgs& a) {
  c.add_option("--preset", a.preset, "tiny (~10 min), small (~1 h) or paper (long)")
      ->check(CLI::IsMember({"tiny", "small", "paper", "micro"}));
  c.add_option("--data", a.data, "UTF-8 text (or a prepared directory)")->required();
  c.add_option("--out", a.out, "report directory (re-running resumes)")->required();
  c.add_option("--methods", a.methods, "conversion methods, comma-separated (default: all; must include mean)");
  c.add_option("--groupings", a.groupings, "groupings, comma-separated: contiguous,similar,per-layer (default: contiguous)");
  CLI::Option* from = c.add_option("--from", a.from,
                                   "start from this MHA checkpoint (e.g. an imported model) instead of pretraining one; "
                                   "--data must be tokenized by its tokenizer");
  c.add_option("--config", a.config, "with --from: training config JSON (its max_iters is the P that α multiplies)")->needs(from);
  c.add_flag("--scratch", a.scratch, "with --from: also train each GQA/MQA model from scratch (off by default)")->needs(from);
  c.add_option("--precision", a.precision, std::string(precision_help) + " — for every training and uptraining run of the study")
      ->check(CLI::IsMember(precision_names));
  a.distill.add_flags(c, "also uptrain each KV count at the headline alpha distilled from the MHA model (every seed; the MHA "
                         "row alike; models from scratch again at the distilled compute)");
  c.add_option("--distill-methods", a.distill_methods, "with --distill: the conversions distilled, comma-separated (default: mean,aligned-fit "
                                                       "where among --methods)");
  c.add_flag("--quiet", a.quiet, "no progress lines");
}

int run_sweep(const SweepArgs& a) {
  SweepPreset p = sweep_preset(a.preset);
  if (!a.methods.empty()) p.methods = split_list(a.methods, "--methods");
  if (!a.groupings.empty()) p.groupings = split_list(a.groupings, "--groupings");
  if (!a.from.empty()) {
    p.pretrain = source_train_config(a.from, a.config, "the study");
    p.from = a.from;
    p.scratch = a.scratch;
    p.smaller = false;  // the study trains no model of its own here (but --scratch's)
  }
  if (!a.precision.empty()) p.pretrain.precision = enum_from_name<Precision>(a.precision, "--precision");
  check_precision_runs(p.pretrain.precision);
  p.distill_lambda = a.distill.lambda_for("sweep");
  p.distill_temperature = a.distill.temperature;
  if (!a.distill_methods.empty()) {
    if (!a.distill.on) throw Error(ErrorKind::usage, "sweep: --distill-methods needs --distill");
    p.distill_methods = split_list(a.distill_methods, "--distill-methods");
  }
  if (a.distill.on && p.distill_lambda == 0) throw Error(ErrorKind::usage, "sweep: --distill-lambda 0 distils nothing (leave out --distill)");
  if (!tapelm::run_sweep(p, a.data, a.out, a.quiet, signal_stop_token())) {
    std::printf("sweep stopped by signal; run the same command again to resume\n");
  }
  return 0;
}

struct PlotArgs {
  std::string run_dir;
};

void plot_flags(CLI::App& c, PlotArgs& a) { c.add_option("run_dir", a.run_dir, "run directory")->required(); }

int run_plot(const PlotArgs& a) {
  std::printf("%s\n", plot_run(a.run_dir).c_str());
  return 0;
}

struct BenchArgs {
  std::string config, mode = "train";
  std::vector<std::string> sets;
  int64_t batch = 0, decode_len = 0, prompt = 1;
  int iters = 10, warmup = 3;
  uint64_t seed = 1337;
  bool json = false;
  std::string kv_cache = "f32", weights = "f32", precision;
};

const std::vector<std::string> kv_cache_names = enum_names<KvType>();
constexpr const char* kv_cache_help =
    "how the KV cache stores keys and values: f32, f16 or bf16 (half the bytes), q8 (q8_0 blocks of 32: 34 bytes per 32 values)";
constexpr const char* weights_help = "linear weights while decoding: f32, or q8_0 (int8 rows with an f16 scale per 32, as llama.cpp's q8_0)";

void bench_flags(CLI::App& c, BenchArgs& a) {
  c.add_option("--config", a.config, "config JSON (model keys, batch_size)");
  c.add_option("--set", a.sets, "override a config key: key=value (repeatable)");
  c.add_option("--mode", a.mode, "train or decode")->check(CLI::IsMember({"train", "decode"}));
  c.add_option("--batch", a.batch, "batch (default: batch_size for train, 1 for decode)")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  c.add_option("--decode-len,--context", a.decode_len, "decode: positions each sequence reaches, prompt included (default: block_size)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  c.add_option("--prompt", a.prompt, "decode: prompt tokens per sequence, prefilled in one forward (default 1)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 30));
  c.add_option("--iters", a.iters, "timed iterations");
  c.add_option("--warmup", a.warmup, "untimed iterations first");
  c.add_option("--seed", a.seed, "seed for weights and tokens")->check(seed_range);
  c.add_flag("--json", a.json, "print one JSON line");
  c.add_option("--precision", a.precision, std::string("train: ") + precision_help)->check(CLI::IsMember(precision_names));
  c.add_option("--kv-cache", a.kv_cache, std::string("decode: ") + kv_cache_help)->check(CLI::IsMember(kv_cache_names));
  c.add_option("--weights", a.weights, std::string("decode: ") + weights_help)->check(CLI::IsMember({"f32", "q8_0"}));
}

// Decoding at a serving shape, against the memory-bandwidth limit: every step must read the
// weights and the batch's KV cache at least once.
int run_bench_decode(const BenchArgs& a, const TrainConfig& cfg, int64_t batch) {
  DecodeShape shape{batch, a.prompt, a.decode_len};
  shape.kv_cache = enum_from_name<KvType>(a.kv_cache, "--kv-cache");
  shape.q8_weights = a.weights == "q8_0";
  const DecodeResult r = bench_decode_shape(cfg.model, shape, a.iters, a.warmup, a.seed);
  const ComputeInfo ci = compute_info();
  const double bw = memory_bandwidth(), limit_s = r.bytes_per_step / bw;
  const ModelCost cost = model_cost(cfg.model);
  // the other roof: the step's FLOPs (weights and attention at the mean context) at the sgemm peak
  const double mean_ctx = 0.5 * static_cast<double>(r.shape.prompt + 1 + r.shape.context);
  const double flops = static_cast<double>(batch) * model_cost(cfg.model, static_cast<int64_t>(mean_ctx)).forward_flops_per_token;
  const double compute_s = flops / ci.sgemm_peak;
  nlohmann::json out{{"mode", "decode"},
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
                     {"memory_bandwidth_bytes_per_s", bw},
                     {"bandwidth_limit_pct", 100.0 * limit_s / r.step_median_s},
                     {"flops_per_step", flops},
                     {"roofline_pct", 100.0 * std::max(limit_s, compute_s) / r.step_median_s},
                     {"iters", a.iters},
                     {"warmup", a.warmup},
                     {"threads", get_num_threads()},
                     {"params", cost.params},
                     {"kv_cache", a.kv_cache},
                     {"weights", a.weights},
                     {"kv_cache_bytes_per_token", kv_cache_bytes_per_token(cfg.model, shape.kv_cache)},
                     {"L", cfg.model.n_layer},
                     {"H", cfg.model.n_head},
                     {"KV", cfg.model.kv_heads_json()},
                     {"d", cfg.model.n_embd},
                     {"T", cfg.model.block_size},
                     {"step_times", r.step_s},
                     {"prefill_times", r.prefill_s},
                     {"blas_core", ci.blas_core},
                     {"gemm", ci.gemm},
                     {"omp_wait", ci.omp_wait},
                     {"cpu", ci.cpu}};
  if (a.json) {
    std::printf("%s\n", out.dump().c_str());
    return 0;
  }
  std::printf("%s | memory bandwidth %.1f GB/s (triad)\n", compute_summary(ci).c_str(), bw / 1e9);
  std::printf("decode (%s weights, %s KV cache): batch %ld, prompt %ld, context %ld (%ld steps): prefill %.2f ms; %.3f ms per step (%.1f us per token, "
              "%.0f tokens/s; min %.3f, max %.3f over %d iterations after %d warm-up, %d threads)\n",
              a.weights.c_str(), a.kv_cache.c_str(), (long)batch, (long)r.shape.prompt, (long)r.shape.context,
              (long)(r.shape.context - r.shape.prompt),
              r.prefill_median_s * 1e3, r.step_median_s * 1e3, r.step_median_s * 1e6 / static_cast<double>(batch), r.tokens_per_s,
              r.step_min_s * 1e3, r.step_max_s * 1e3, a.iters, a.warmup, get_num_threads());
  std::printf("bandwidth: %.1f MB per step at least (weights and KV cache as stored), %.3f ms at %.1f GB/s: %.0f%% of the bandwidth limit\n",
              r.bytes_per_step / 1e6, limit_s * 1e3, bw / 1e9,
              100.0 * limit_s / r.step_median_s);
  std::printf("compute: %.2f GFLOP per step, %.3f ms at the sgemm peak; roofline (the larger limit): %.0f%%\n", flops / 1e9,
              compute_s * 1e3, 100.0 * std::max(limit_s, compute_s) / r.step_median_s);
  return 0;
}

int run_bench(const BenchArgs& a) {
  nlohmann::json j = a.config.empty() ? nlohmann::json::object() : read_config_file(a.config);
  TrainConfig::apply_overrides(j, a.sets);
  if (!a.precision.empty()) j["precision"] = a.precision;
  TrainConfig cfg = TrainConfig::from_json(j);
  check_precision_runs(cfg.precision);
  if (a.iters <= 0 || a.warmup < 0) throw Error(ErrorKind::usage, "bench: --iters must be positive and --warmup >= 0");
  const bool train_mode = a.mode == "train";
  const int64_t batch = a.batch > 0 ? a.batch : train_mode ? cfg.batch_size : 1;
  if (!train_mode) {
    // decoding holds the weights, the batch's KV cache and one prefill's activations, not training state
    const ModelCost cost = model_cost(cfg.model);
    const int64_t context = a.decode_len > 0 ? a.decode_len : cfg.model.block_size;
    const double kv = static_cast<double>(kv_cache_bytes_per_token(cfg.model, enum_from_name<KvType>(a.kv_cache, "--kv-cache")));
    check_memory(4.0 * static_cast<double>(cost.params) + static_cast<double>(batch) * static_cast<double>(context) * kv +
                     prefill_bytes(cfg.model, batch, a.prompt, get_num_threads()),
                 available_memory_bytes(), "decoding " + std::to_string(batch) + " sequences of " + std::to_string(context) + " positions");
    return run_bench_decode(a, cfg, batch);
  }
  cfg.batch_size = batch;  // --batch is what runs: count it, not the config's batch_size
  cfg.eval_iters = 0;
  check_training_memory(cfg);
  const BenchResult r = bench_train(cfg.model, batch, a.iters, a.warmup, a.seed, cfg.precision);
  const ModelCost cost = model_cost(cfg.model);
  nlohmann::json out{{"mode", a.mode},
                     {"tokens_per_s", r.tokens_per_s},
                     {"median_s", r.median_s},
                     {"min_s", r.min_s},
                     {"iters", a.iters},
                     {"warmup", a.warmup},
                     {"batch", batch},
                     {"tokens_per_iter", r.tokens_per_iter},
                     {"threads", get_num_threads()},
                     {"params", cost.params},
                     {"L", cfg.model.n_layer},
                     {"H", cfg.model.n_head},
                     {"KV", cfg.model.kv_heads_json()},
                     {"d", cfg.model.n_embd},
                     {"T", cfg.model.block_size},
                     {"precision", to_string(cfg.precision)},
                     {"times", r.times}};
  if (train_mode) {
    out["linear_s"] = r.linear_median_s;  // the linear layers' products, median per step
    out["linear_times"] = r.linear_times;
  }
  const ComputeInfo ci = compute_info();
  out["blas_core"] = ci.blas_core;
  out["gemm"] = ci.gemm;
  out["omp_wait"] = ci.omp_wait;
  out["cpu"] = ci.cpu;
  out["sgemm_peak_flops_per_s"] = ci.sgemm_peak;
  out["cpu_peak_flops_per_s"] = ci.cpu_peak;
  out["cpu_clock_hz"] = ci.clock_hz;
  out["cpu_peak_lanes"] = ci.lanes;
  if (train_mode && cfg.precision == Precision::bf16) out["bf16_gemm_peak_flops_per_s"] = bf16_gemm_peak_flops();
  if (train_mode) out["model_flops_per_s"] = r.tokens_per_s * cost.train_flops_per_token;
  if (a.json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    std::printf("%s\n", compute_summary(ci).c_str());
    std::printf("%s%s: median %.3f ms per %s, %.0f tokens/s (%d iterations after %d warm-up, %d threads)\n",
                a.mode.c_str(), train_mode ? (" (" + to_string(cfg.precision) + ")").c_str() : "", r.median_s * 1e3,
                train_mode ? "step" : "token step", r.tokens_per_s, a.iters, a.warmup, get_num_threads());
    if (train_mode) {
      const double mf = r.tokens_per_s * cost.train_flops_per_token;
      std::printf("model FLOP/s %.1f G: MFU %.1f%% of sgemm peak, %.1f%% of CPU peak\n", mf / 1e9,
                  100.0 * mf / ci.sgemm_peak, 100.0 * mf / ci.cpu_peak);
      std::printf("linear layers' products: median %.3f ms per step (%.0f%% of the step's median)\n",
                  r.linear_median_s * 1e3, 100.0 * r.linear_median_s / r.median_s);
      if (cfg.precision == Precision::bf16) std::printf("%s\n", bf16_rate_note().c_str());
    }
  }
  return 0;
}

struct EvalArgs {
  std::string checkpoint, data, split = "val", grad_out, kv_cache = "f32";
  int64_t batch = 16, tokens = 0;
  bool json = false, stream = false;
};

void eval_flags(CLI::App& c, EvalArgs& a) {
  c.add_option("--checkpoint", a.checkpoint, "model: a checkpoint, a Hugging Face directory or a GGUF file")->required();
  c.add_option("--data", a.data, "text file, token file (.bin), prepared directory or parity file (.h5)")->required();
  c.add_option("--tokens", a.tokens, "evaluate the first windows holding this many tokens (0: all)")->check(CLI::NonNegativeNumber);
  c.add_flag("--stream", a.stream, "read the model one block at a time (also when it does not fit in memory in float32)");
  c.add_option("--split", a.split, "for text: train, val or all")->check(CLI::IsMember({"train", "val", "all"}));
  c.add_option("--grad-out", a.grad_out, "write d loss / d parameter to this HDF5 file");
  c.add_option("--batch", a.batch, "windows per forward pass");
  c.add_flag("--json", a.json, "print one JSON line");
  c.add_option("--kv-cache", a.kv_cache, "round K and V as a KV cache of this type stores them: the loss a 16-bit or 8-bit cache gives")
      ->check(CLI::IsMember(kv_cache_names));
}

int run_eval(const EvalArgs& a) {
  if (a.batch <= 0) throw Error(ErrorKind::usage, "--batch must be positive");
  const formats::OpenedModel m = formats::open_model(a.checkpoint);
  EvalData data = load_eval_data(a.data, a.split, m.config, m.tok ? &*m.tok : nullptr);
  if (a.tokens > 0) {
    if (!data.ready.empty()) throw Error(ErrorKind::usage, "--tokens: " + a.data + " holds ready-made batches");
    data.starts.resize(std::min(data.starts.size(), static_cast<size_t>((a.tokens + data.T - 1) / data.T)));
  }
  const bool grads = !a.grad_out.empty();
  const double whole = 4.0 * static_cast<double>(model_cost(m.config).params);
  // the rows of one pass: a batch of windows, or fewer when there are fewer windows to evaluate
  double tokens = 0, pass_rows = 0;
  if (data.ready.empty()) {
    tokens = static_cast<double>(data.starts.size() * data.T);
    pass_rows = static_cast<double>(std::min<int64_t>(a.batch, static_cast<int64_t>(data.starts.size())) * data.T);
  } else {
    for (const auto& [x, y] : data.ready) {
      tokens += static_cast<double>(shape_numel(x.shape));
      pass_rows = std::max(pass_rows, static_cast<double>(shape_numel(x.shape)));
    }
  }
  const double batch_bytes = prefill_bytes(m.config, static_cast<int64_t>(pass_rows) / std::max<int64_t>(1, data.T), data.T, get_num_threads()) +
                             4.0 * pass_rows * static_cast<double>(m.config.vocab_size);
  // one block at a time, the hidden states of every window kept (tokens × d floats)
  const bool stream = read_streamed(m, batch_bytes, a.stream);
  const auto t0 = std::chrono::steady_clock::now();
  EvalResult r;
  double estimate = 0;
  const KvType kv_round = enum_from_name<KvType>(a.kv_cache, "--kv-cache");
  check_kv_type(kv_round, m.config.head_dim());
  if (kv_round != KvType::f32 && grads) throw Error(ErrorKind::usage, "--kv-cache rounds K and V for evaluation: no --grad-out");
  if (stream) {
    if (grads) throw Error(ErrorKind::usage, "--grad-out needs the whole model in memory (" + byte_size_str(whole) + " in float32)");
    if (kv_round != KvType::f32)
      throw Error(ErrorKind::usage, "--kv-cache " + a.kv_cache + " needs the whole model in memory (" + byte_size_str(whole) + " in float32)");
    estimate = streamed_eval_bytes(m, tokens, pass_rows);
    check_memory(estimate, available_memory_bytes(),
                 "evaluating " + m.what + " one block at a time on " + std::to_string(static_cast<int64_t>(tokens)) + " tokens");
    r = evaluate_streamed(m, data.batches(a.batch));
  }
  std::unique_ptr<GPT> loaded = stream ? nullptr : m.load();
  if (loaded) loaded->round_kv_as(kv_round);
  if (!stream) r = grads ? evaluate_with_grads(*loaded, data.batches(a.batch)) : evaluate(*loaded, data.batches(a.batch));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Finite weights can still overflow in the forward pass; a NaN loss is no result to print.
  if (!std::isfinite(r.loss))
    throw Error(ErrorKind::checkpoint, a.checkpoint + ": the loss on " + a.data + " is " +
                                           (std::isnan(r.loss) ? "NaN" : "Inf") + " (the model overflows)");
  if (grads) write_gradients(a.grad_out, *loaded, r.loss);
  if (a.json) {
    nlohmann::json j{{"loss", r.loss}, {"tokens", r.targets}, {"perplexity", std::exp(r.loss)}, {"kv_cache", a.kv_cache}};
    if (stream) j["streamed"] = true, j["seconds"] = seconds, j["memory_estimate_bytes"] = estimate;
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("loss %.6f over %ld tokens (perplexity %.4f)\n", r.loss, (long)r.targets, std::exp(r.loss));
    if (stream)
      std::printf("streamed one block at a time: %.1f s, %.1f tokens/s, %.1f GFLOP/s, about %s of memory\n", seconds,
                  static_cast<double>(r.targets) / seconds,
                  model_cost(m.config, data.T).forward_flops_per_token * static_cast<double>(r.targets) / seconds / 1e9,
                  byte_size_str(estimate).c_str());
  }
  return 0;
}

struct SampleArgs {
  std::string checkpoint, prompt = "\n";
  int64_t tokens = 500, top_k = 0;
  double temperature = 0.8;
  uint64_t seed = 1337;
  bool greedy = false, stream = false;
  std::string kv_cache = "f32", weights = "auto";
};

void sample_flags(CLI::App& c, SampleArgs& a) {
  c.add_option("--checkpoint", a.checkpoint, "model with a tokenizer: a checkpoint, a Hugging Face directory or a GGUF file")->required();
  c.add_flag("--stream", a.stream, "read the model one block at a time for every token (also when it does not fit in memory in float32)");
  c.add_option("--prompt", a.prompt, "text to continue (default: a newline)");
  c.add_option("--tokens", a.tokens, "tokens to generate");
  c.add_option("--temperature", a.temperature, "softmax temperature");
  c.add_option("--top-k", a.top_k, "sample among the k most likely tokens (0: all)");
  c.add_option("--seed", a.seed, "random seed")->check(seed_range);
  c.add_flag("--greedy", a.greedy, "always take the most likely token");
  c.add_option("--kv-cache", a.kv_cache, kv_cache_help)->check(CLI::IsMember(kv_cache_names));
  c.add_option("--weights", a.weights, std::string(weights_help) + "; auto (the default): q8_0 for a GGUF file of q8_0 matrices, else f32")
      ->check(CLI::IsMember({"auto", "f32", "q8_0"}));
}

int run_sample(const SampleArgs& a) {
  const formats::OpenedModel m = formats::open_model(a.checkpoint);
  if (!m.tok) throw Error(ErrorKind::checkpoint, a.checkpoint + ": has no tokenizer (a weights-only checkpoint); sample needs one");
  if (a.tokens < 0) throw Error(ErrorKind::usage, "--tokens must be >= 0");
  const Tokenizer* tok = &*m.tok;
  const KvType kv_type = enum_from_name<KvType>(a.kv_cache, "--kv-cache");
  check_kv_type(kv_type, m.config.head_dim());
  // each token then reads every block from the file
  const double whole = 4.0 * static_cast<double>(model_cost(m.config).params),
               cache = static_cast<double>(kv_cache_bytes_per_token(m.config, kv_type)) * static_cast<double>(m.config.block_size) +
                       prefill_bytes(m.config, 1, m.config.block_size, get_num_threads());
  const bool stream = read_streamed(m, cache, a.stream);
  // a GGUF file's q8_0 matrices decode as q8_0: quantizing their widened values gives back the
  // file's blocks (the largest |value| of a block is 127 d, so d and every q come back as stored)
  const bool q8 = a.weights == "q8_0" || (a.weights == "auto" && !stream && m.dtypes.find("Q8_0") != std::string::npos);
  std::unique_ptr<Decoder> model;
  if (stream && a.weights == "q8_0")
    throw Error(ErrorKind::usage, "--weights q8_0 quantizes the model in memory, but " + a.checkpoint +
                                      (a.stream ? " is read one block at a time (--stream)" : " does not fit in memory in float32 (" + byte_size_str(whole) + ")"));
  if (stream) {
    check_memory(StreamedModel::resident_bytes(m.config) + cache, available_memory_bytes(), "sampling from " + m.what + " one block at a time");
    std::fprintf(stderr, "tapelm: sampling from %s one block at a time (%s in float32): every token reads the whole model\n", a.checkpoint.c_str(),
                 byte_size_str(whole).c_str());
    model = std::make_unique<StreamedModel>(m);
  } else {
    std::unique_ptr<GPT> loaded = m.load();
    if (q8) loaded->quantize_q8_0();
    model = std::move(loaded);
  }
  std::vector<int32_t> prompt;
  const int32_t bos = tok->bos_id();
  try {
    // a sentencepiece model's documents begin with BOS (as prepare writes them); the default
    // prompt is then BOS alone
    if (bos >= 0) prompt.push_back(bos);
    if (bos < 0 || a.prompt != "\n") {
      const std::vector<int32_t> p = tok->encode(a.prompt.empty() ? "\n" : a.prompt);
      prompt.insert(prompt.end(), p.begin(), p.end());
    }
  } catch (const std::exception& e) {
    throw Error(ErrorKind::usage, std::string("--prompt: ") + e.what());
  }
  if (a.tokens > sample_warn_tokens)
    std::fprintf(stderr, "tapelm: warning: --tokens %ld: far more than a sample needs; the text streams as it is generated, stop it with Ctrl-C\n",
                 (long)a.tokens);
  SampleOptions so;
  so.greedy = a.greedy;
  so.temperature = a.temperature;
  so.top_k = a.top_k;
  so.kv_cache = kv_type;
  so.vocab_limit = tok->vocab_size();  // the model's ids past the tokenizer's cannot be printed
  so.stop_id = bos;  // BOS starts the next document: llama2.c's run.c stops there too
  // fwrite, not fputs: a byte-level token may be a NUL byte, or part of a character the next completes
  const auto put = [](const std::string& s) { std::fwrite(s.data(), 1, s.size(), stdout); };
  put(tok->decode(prompt));
  std::fflush(stdout);
  int32_t prev = prompt.back();
  generate_stream(*model, {prompt}, a.tokens, so, a.seed, [&](const std::vector<int32_t>& next) {
    put(tok->decode_next(prev, next[0]));
    prev = next[0];
    std::fflush(stdout);  // each token as it comes: a long sample shows progress, a pipe gets it at once
  });
  std::printf("\n");
  return 0;
}

struct ConvertArgs {
  std::string from, method = "mean", out, grouping = "contiguous", calib, dtype, format = "tapelm", kv_heads;
  int64_t kv_budget = 0, calib_tokens = 16384;
  uint64_t seed = 0;
};

/// "2" or "4,2,2,1": key/value head counts, each a positive integer; anything else is a usage
/// Error naming the flag.
std::vector<int64_t> parse_kv_heads(const std::string& s, const std::string& flag) {
  std::vector<int64_t> out;
  for (const std::string& item : split_list(s, flag)) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || v <= 0 || v > (int64_t(1) << 20))
      throw Error(ErrorKind::usage, flag + ": \"" + cut_for_message(item) + "\" is not a positive count of key/value heads");
    out.push_back(v);
  }
  return out;
}

void convert_flags(CLI::App& c, ConvertArgs& a) {
  c.add_option("--from", a.from, "source model: a checkpoint, a Hugging Face directory or a GGUF file (read one block at a time)")
      ->required();
  CLI::Option* kv = c.add_option("--kv-heads", a.kv_heads, "new number of key/value heads (divides the old), or one per layer: 4,2,2,1");
  c.add_option("--kv-budget", a.kv_budget, "instead of --kv-heads: the key/value heads of all layers together, placed where converting "
                                           "a layer costs the most loss on the calibration windows (needs --calib)")
      ->excludes(kv)
      ->check(CLI::PositiveNumber);
  c.add_option("--method", a.method, "conversion method")->check(CLI::IsMember(method_names()));
  c.add_option("--grouping", a.grouping, "contiguous, similar (similar K/V heads share a group) or per-layer (--kv-heads G: "
                                         "the budget of G in every layer, placed by the conversion error; see --kv-budget)")
      ->check(CLI::IsMember({"contiguous", "similar", "per-layer"}));
  c.add_option("--calib", a.calib,
               "calibration data for aligned, fit, aligned-fit and similar: what eval takes (text: its train split)");
  c.add_option("--calib-tokens", a.calib_tokens, "calibration tokens, drawn as seeded random windows");
  c.add_option("--out", a.out, "the converted model: a checkpoint, an HF directory or a GGUF file (--format)")->required();
  c.add_option("--format", a.format, "what --out is: tapelm (a checkpoint, default), hf (a Hugging Face directory) or gguf")
      ->check(CLI::IsMember({"tapelm", "hf", "gguf"}));
  c.add_option("--dtype", a.dtype, "weights as f32, bf16 or f16, or q8_0 in gguf (default: the source's 16-bit type, else f32)")
      ->check(CLI::IsMember({"f32", "bf16", "f16", "q8_0"}));
  c.add_option("--seed", a.seed, "seed for --method random and the calibration windows")->check(seed_range);
}

int run_convert(const ConvertArgs& a) {
  refuse_same_file(a.from, "--from", a.out, "--out");
  if (a.kv_heads.empty() == (a.kv_budget == 0)) throw Error(ErrorKind::usage, "convert: give --kv-heads or --kv-budget");
  const ConvertModelResult r =
      convert_model({.from = a.from, .out = a.out, .kv_heads = a.kv_heads.empty() ? std::vector<int64_t>{} : parse_kv_heads(a.kv_heads, "--kv-heads"),
                     .kv_budget = a.kv_budget, .variant = {&method(a.method), enum_from_name<Grouping>(a.grouping, "--grouping")}, .calib = a.calib, .calib_tokens = a.calib_tokens,
                     .seed = a.seed, .progress = true, .dtype = a.dtype, .format = a.format});
  std::string heads;
  for (int64_t k : r.kv_heads) heads += (heads.empty() ? "" : ",") + std::to_string(k);
  std::printf("converted %s: %ld -> %s kv heads%s by %s (%s groups%s) in %.2fs, written to %s (%s)\n", a.from.c_str(), (long)r.kv_heads_from,
              heads.c_str(), r.kv_heads.size() > 1 ? " (layer by layer)" : "", a.method.c_str(), a.grouping.c_str(),
              r.calib_tokens ? (", calibrated on " + std::to_string(r.calib_tokens) + " tokens").c_str() : "",
              r.seconds, a.out.c_str(), r.dtype.c_str());
  return 0;
}

struct InspectArgs {
  std::string checkpoint;
  bool system = false;
};

void inspect_flags(CLI::App& c, InspectArgs& a) {
  c.add_option("checkpoint", a.checkpoint, "checkpoint (HDF5)");
  c.add_flag("--system", a.system, "the CPU, OpenBLAS core, GEMM backend and both FLOP/s peaks instead");
}

/// `inspect --system`: the CPU, BLAS core, GEMM backend, both peaks and the memory bandwidth.
int run_inspect_system() {
  const ComputeInfo c = compute_info();
  std::printf("cpu %s\n", c.cpu.c_str());
  std::printf("simd %s\n", c.simd.c_str());
  std::printf("compiled for %s (-march=%s)\n", isa_built() ? isa_names(isa_built()).c_str() : "the x86-64 baseline",
              *isa_built_arch() ? isa_built_arch() : "the compiler's default");
  std::printf("threads %d\n", c.threads);
  std::printf("openblas core %s\n", c.blas_core.c_str());
  std::printf("gemm %s\n", c.gemm.c_str());
  std::printf("openmp wait %s\n", c.omp_wait.c_str());
  std::printf("sgemm peak %.1f GFLOP/s (measured, %d^3)\n", c.sgemm_peak / 1e9, kPeakSide);
  if (const std::string missing = precision_unavailable(Precision::bf16); !missing.empty()) {
    std::printf("bf16 peak unavailable: %s\n", missing.c_str());
  } else {
    const double bf16 = bf16_gemm_peak_flops();
    std::printf("bf16 peak %.1f GFLOP/s (measured, %d^3; %.2fx sgemm)\n", bf16 / 1e9, kPeakSide, bf16 / c.sgemm_peak);
  }
  std::printf("cpu peak %.1f GFLOP/s = %d cores x %d FMA units x %d lanes x 2 x %.2f GHz (clock measured; %s)\n",
              c.cpu_peak / 1e9, c.threads, c.fma_units, c.lanes, c.clock_hz / 1e9, c.peak_basis.c_str());
  std::printf("memory bandwidth %.1f GB/s (measured: STREAM triad over 3 x 256 MB)\n", memory_bandwidth() / 1e9);
  return 0;
}

int run_inspect(const InspectArgs& a) {
  if (a.system) return run_inspect_system();
  if (a.checkpoint.empty()) throw Error(ErrorKind::usage, "inspect: give a checkpoint, or --system");
  const std::string& path = a.checkpoint;
  const CheckpointInfo info = inspect_checkpoint(path);
  const GPTConfig& c = info.config;
  const ModelCost m = model_cost(c);
  std::printf("checkpoint %s\n", path.c_str());
  std::printf("config %s\n", c.to_json().dump().c_str());
  const char* kind = c.per_layer_kv() ? "GQA per layer" : c.n_kv_head == c.n_head ? "MHA" : c.n_kv_head == 1 ? "MQA" : "GQA";
  std::printf("attention %s: %ld query heads, %s key/value heads%s, head dim %ld\n", kind, (long)c.n_head, c.kv_heads_str().c_str(),
              c.per_layer_kv() ? " (layer by layer)" : "", (long)c.head_dim());
  std::printf("parameters %ld (%.3fM)\n", (long)m.params, m.params / 1e6);
  std::printf("forward FLOPs per token %.4g (at T = %ld), training FLOPs per token %.4g\n", m.forward_flops_per_token,
              (long)c.block_size, m.train_flops_per_token);
  std::printf("KV-cache bytes per token %ld\n", (long)m.kv_cache_bytes_per_token);
  if (info.has_train)
    std::printf("trained steps %ld, tokens seen %ld\n", (long)info.step, (long)info.tokens_seen);
  return 0;
}

struct PrepareArgs {
  PrepareOptions o;
  std::string tokenizer_model;
  bool quiet = false;
  bool tokenizer_given = false;
};

void prepare_flags(CLI::App& c, PrepareArgs& a) {
  PrepareOptions& po = a.o;
  c.add_option("--text", po.texts, "UTF-8 text files (each a document unless --doc-sep splits them)")->required();
  c.add_option("--out", po.out_dir, "output directory")->required();
  c.add_option("--tokenizer", po.tokenizer, "char (default), bpe or unigram (sentencepiece)")
      ->check(CLI::IsMember({"char", "bpe", "unigram"}))
      ->each([&a](const std::string&) { a.tokenizer_given = true; });
  c.add_option("--vocab-size", po.vocab_size, "bpe/unigram: pieces in the trained model (default 4096)")
      ->check(CLI::Range(1, 1048576));
  c.add_option("--tokenizer-model", a.tokenizer_model,
               "use this tokenizer instead of training one: a sentencepiece .model, a Hugging Face tokenizer.json "
               "(byte-level BPE), or GPT-2's vocab.json with merges.txt beside it");
  c.add_option("--sample-bytes", po.sample_bytes, "bpe/unigram: train on at most this much text (default 100 MB)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  c.add_option("--doc-sep", po.doc_sep, "document separator, e.g. <|endoftext|> (default: one document per file)");
  c.add_option("--val-fraction", po.val_fraction, "fraction of the documents (of the tokens, for one) in val (default 0.1)")
      ->check(CLI::Range(0.0, 0.99));
  c.add_option("--shard-tokens", po.shard_tokens, "tokens per shard file (default 100000000)")
      ->check(CLI::Range(int64_t{1}, int64_t{2147483647}));
  c.add_flag("--quiet", a.quiet, "no progress lines");
}

int run_prepare(const PrepareArgs& a) {
  PrepareOptions po = a.o;
  if (!a.tokenizer_model.empty()) {
    if (a.tokenizer_given && po.tokenizer == "char")
      throw Error(ErrorKind::usage, "a tokenizer model is a subword tokenizer: use it with the bpe or unigram tokenizer");
    po.given = hf::read_tokenizer_file(a.tokenizer_model);
    po.tokenizer = "bpe";
  }
  po.progress = !a.quiet;
  const PrepareResult r = prepare_corpus(po);
  std::printf("prepared %s: %s tokenizer of %d ids; train %ld tokens (%ld documents), val %ld tokens (%ld documents) "
              "in %ld shards; %.1f MB of text encoded at %.2f MB/s (%.1fs in all)\n",
              po.out_dir.c_str(), r.tok.kind_name().c_str(), r.tok.vocab_size(), (long)r.train_tokens, (long)r.train_docs,
              (long)r.val_tokens, (long)r.val_docs, (long)r.shards, r.text_bytes / 1e6,
              r.text_bytes / 1e6 / std::max(r.encode_seconds, 1e-9), r.seconds);
  return 0;
}

struct ExportArgs {
  formats::ExportRequest r;
  std::string format;
  CLI::Option *version_opt = nullptr, *dtype_opt = nullptr;
};

// "hf: f32, bf16, f16; gguf: ..." from the format table.
std::string dtype_help() {
  std::string out;
  for (const formats::ModelFormat& f : formats::model_formats()) {
    if (f.dtypes.empty()) continue;
    out += (out.empty() ? "" : "; ") + std::string(f.name) + ":";
    for (size_t i = 0; i < f.dtypes.size(); i++) out += (i ? ", " : " ") + f.dtypes[i];
  }
  return "the weights' type (default f32); " + out;
}

std::string format_help(const char* formats::ModelFormat::*field) {
  std::string out;
  for (const formats::ModelFormat& f : formats::model_formats()) out += (out.empty() ? "" : "; ") + std::string(f.name) + ": " + f.*field;
  return out;
}

void export_flags(CLI::App& c, ExportArgs& a) {
  std::vector<std::string> dtypes;
  for (const formats::ModelFormat& f : formats::model_formats())
    for (const std::string& d : f.dtypes)
      if (std::find(dtypes.begin(), dtypes.end(), d) == dtypes.end()) dtypes.push_back(d);
  c.add_option("--checkpoint", a.r.checkpoint, "checkpoint (HDF5)")->required();
  c.add_option("--format", a.format, formats::describe_model_formats())->required()->check(CLI::IsMember(formats::model_format_names()));
  a.version_opt = c.add_option("--version", a.r.version, "llama2c: file version 0 (what run.c reads, default) or 1")->check(CLI::IsMember({0, 1}));
  a.dtype_opt = c.add_option("--dtype", a.r.dtype, dtype_help())->check(CLI::IsMember(dtypes));
  c.add_option("--out", a.r.out, format_help(&formats::ModelFormat::out_help))->required();
}

int run_export(const ExportArgs& a) {
  refuse_same_file(a.r.checkpoint, "--checkpoint", a.r.out, "--out");
  const formats::ModelFormat& f = formats::model_format(a.format);
  formats::check_export_flags(f, a.r, a.version_opt->count() > 0, a.dtype_opt->count() > 0);
  std::printf("%s\n", f.export_model(a.r).c_str());
  return 0;
}

struct ImportArgs {
  formats::ImportRequest r;
  std::string format;
};

void import_flags(CLI::App& c, ImportArgs& a) {
  c.add_option("--format", a.format, formats::describe_model_formats())->required()->check(CLI::IsMember(formats::model_format_names()));
  c.add_option("--model", a.r.model, format_help(&formats::ModelFormat::model_help))->required();
  CLI::Option* model = c.add_option("--tokenizer-model", a.r.tokenizer_model, "llama2c: sentencepiece model (.model) to store with the weights");
  c.add_option("--tokenizer-bin", a.r.tokenizer_bin,
               "llama2c: run.c's tokenizer.bin for the model, checked to hold the --tokenizer-model's pieces and scores")
      ->needs(model);
  c.add_option("--out", a.r.out, "output checkpoint (HDF5, weights only)")->required();
}

int run_import(const ImportArgs& a) {
  refuse_same_file(a.r.model, "--model", a.r.out, "--out");
  if (!a.r.tokenizer_model.empty()) refuse_same_file(a.r.tokenizer_model, "--tokenizer-model", a.r.out, "--out");
  const formats::ModelFormat& f = formats::model_format(a.format);
  formats::check_import_flags(f, a.r);
  std::printf("%s\n", f.import_model(a.r).c_str());
  return 0;
}

struct DemoArgs {};

void demo_flags(CLI::App&, DemoArgs&) {}

int run_demo(const DemoArgs&) {
  const int64_t B = 2, T = 8, C = 16, V = 11;
  Var wte(randn({V, C}, 1, 0.5f), true), w1(randn({4 * C, C}, 2, 0.2f), true), w2(randn({C, 4 * C}, 3, 0.2f), true);
  Var g(Tensor::full({C}, 1.f), true), head(randn({V, C}, 4, 0.2f), true);
  Index idx, tgt;
  idx.shape = tgt.shape = {B, T};
  for (int64_t i = 0; i < B * T; i++) {
    idx.data.push_back(static_cast<int32_t>((i * 7) % V));
    tgt.data.push_back(static_cast<int32_t>((i * 7 + 3) % V));
  }
  auto forward = [&](const std::vector<Var>& p) {
    Var x = embedding(p[0], idx);
    x = x + linear(gelu(linear(layernorm(x, p[3]), p[1])), p[2]);
    return cross_entropy(linear(layernorm(x, p[3]), p[4]), tgt);
  };
  std::vector<Var> params{wte, w1, w2, g, head};
  Var loss = forward(params);
  std::printf("demo: loss %.6f (ln V = %.6f), tape of %zu ops\n", loss.item(), std::log(double(V)), tape_size());
  backward(loss);
  GradCheckResult r = gradcheck(forward, {wte.val(), w1.val(), w2.val(), g.val(), head.val()});
  std::printf("demo: finite-difference check %s (worst ratio %.3f)\n", r.ok ? "passed" : "FAILED", r.worst_ratio);
  return r.ok ? 0 : 1;
}

}  // namespace

std::vector<Command> add_commands(CLI::App& app, const int& threads) {
  TrainArgs train;
  train.threads = &threads;
  return {command(app, "train", "train a model (nanoGPT's train.py)", train_flags, run_train, train),
          command(app, "eval", "loss of a checkpoint on text, tokens or a parity file", eval_flags, run_eval),
          command(app, "sample", "generate text from a checkpoint", sample_flags, run_sample),
          command(app, "convert", "convert MHA/GQA to fewer key/value heads", convert_flags, run_convert),
          command(app, "uptrain", "convert to fewer kv heads, then train a fraction of the original steps", uptrain_flags,
                  run_uptrain),
          command(app, "sweep", "the MHA -> GQA/MQA trade-off study with report and plots", sweep_flags, run_sweep),
          command(app, "plot", "draw RUN_DIR/loss.png from RUN_DIR/metrics.jsonl", plot_flags, run_plot),
          command(app, "inspect", "config, parameters, FLOPs and KV-cache bytes of a checkpoint", inspect_flags, run_inspect),
          command(app, "prepare", "tokenize text files into llm.c token shards, meta.json and the tokenizer", prepare_flags,
                  run_prepare),
          command(app, "export", "write a checkpoint's model in another program's format (" + format_list() + ")", export_flags, run_export),
          command(app, "import", "read another program's model (" + format_list() + ") into a checkpoint", import_flags, run_import),
          command(app, "bench", "speed of a training step or of KV-cache decoding", bench_flags, run_bench),
          command(app, "demo", "a tiny forward/backward with a gradient check", demo_flags, run_demo)};
}

}  // namespace tapelm::cli
