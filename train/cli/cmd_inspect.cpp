// eval, sample, inspect and bench: the commands that run or look at a model, or the machine.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "train/cli/commands.h"
#include "train/cli/common.h"
#include "autograd/isa.h"
#include "data/outdir.h"
#include "autograd/runtime.h"
#include "nn/accounting.h"
#include "nn/generate.h"
#include "train/bench.h"
#include "train/eval.h"
#include "train/formats/checkpoint.h"
#include "train/formats/model_source.h"
#include "train/formats/registry.h"
#include "train/streamed.h"
#include "train/train_config.h"

namespace tapelm::cli {

namespace fs = std::filesystem;

namespace {

// More tokens than any sample is read for: sample warns, as it will run for hours.
constexpr int64_t sample_warn_tokens = 1000000;

struct BenchArgs {
  std::string config, mode = "train";
  std::vector<std::string> sets;
  int64_t batch = 0, decode_len = 0, prompt = 1;
  int iters = 10, warmup = 3;
  uint64_t seed = 1337;
  bool json = false;
  std::string kv_cache = "f32", weights = "f32", precision;
};

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
  c.add_option("--seed", a.seed, "seed for weights and tokens")->check(seed_range());
  c.add_flag("--json", a.json, "print one JSON line");
  c.add_option("--precision", a.precision, std::string("train: ") + precision_help)->check(CLI::IsMember(enum_names<Precision>()));
  c.add_option("--kv-cache", a.kv_cache, std::string("decode: ") + kv_cache_help)->check(CLI::IsMember(enum_names<KvType>()));
  c.add_option("--weights", a.weights, std::string("decode: ") + weights_help)->check(CLI::IsMember(enum_names<WeightType>()));
}

// Decoding at a serving shape, against the memory-bandwidth limit: every step must read the
// weights and the batch's KV cache at least once.
int run_bench_decode(const BenchArgs& a, const TrainConfig& cfg, int64_t batch) {
  DecodeShape shape{batch, a.prompt, a.decode_len};
  shape.kv_cache = enum_from_name<KvType>(a.kv_cache, "--kv-cache");
  shape.weights = enum_from_name<WeightType>(a.weights, "--weights");
  const DecodeResult r = bench_decode_shape(cfg.model, shape, a.iters, a.warmup, a.seed);
  const DecodeRoofline roof = decode_roofline(cfg.model, r);
  if (a.json) {
    std::printf("%s\n", bench_record(cfg.model, r, roof, a.iters, a.warmup).dump().c_str());
    return 0;
  }
  std::printf("%s | memory bandwidth %.1f GB/s (triad)\n", compute_summary(compute_info()).c_str(), roof.bandwidth / 1e9);
  std::printf("decode (%s weights, %s KV cache): batch %ld, prompt %ld, context %ld (%ld steps): prefill %.2f ms; %.3f ms per step (%.1f us per token, "
              "%.0f tokens/s; min %.3f, max %.3f over %d iterations after %d warm-up, %d threads)\n",
              a.weights.c_str(), a.kv_cache.c_str(), (long)batch, (long)r.shape.prompt, (long)r.shape.context,
              (long)(r.shape.context - r.shape.prompt), r.prefill_median_s * 1e3, r.step_median_s * 1e3,
              r.step_median_s * 1e6 / static_cast<double>(batch), r.tokens_per_s, r.step_min_s * 1e3, r.step_max_s * 1e3, a.iters, a.warmup,
              get_num_threads());
  std::printf("bandwidth: %.1f MB per step at least (weights and KV cache as stored), %.3f ms at %.1f GB/s: %.0f%% of the bandwidth limit\n",
              r.bytes_per_step / 1e6, roof.bandwidth_s * 1e3, roof.bandwidth / 1e9, 100.0 * roof.bandwidth_s / r.step_median_s);
  std::printf("compute: %.2f GFLOP per step, %.3f ms at the sgemm peak; roofline (the larger limit): %.0f%%\n", roof.flops / 1e9,
              roof.compute_s * 1e3, roof.roofline_pct(r.step_median_s));
  return 0;
}

int run_bench(const BenchArgs& a) {
  nlohmann::json j = a.config.empty() ? nlohmann::json::object() : read_config_file(a.config);
  TrainConfig::apply_overrides(j, a.sets);
  if (!a.precision.empty()) j["precision"] = a.precision;
  TrainConfig cfg = TrainConfig::from_json(j);
  check_precision_runs(cfg.precision);
  if (a.iters <= 0 || a.warmup < 0) throw Error(ErrorKind::usage, "bench: --iters must be positive and --warmup >= 0");
  if (a.mode == "decode") {
    const int64_t batch = a.batch > 0 ? a.batch : 1;
    // decoding holds the weights, the batch's KV cache and one prefill's activations, not training state
    const ModelCost cost = model_cost(cfg.model);
    const int64_t context = a.decode_len > 0 ? a.decode_len : cfg.model.block_size;
    const double kv = static_cast<double>(kv_cache_bytes_per_token(cfg.model, enum_from_name<KvType>(a.kv_cache, "--kv-cache")));
    check_memory(4.0 * static_cast<double>(cost.params) + static_cast<double>(batch) * static_cast<double>(context) * kv +
                     prefill_bytes(cfg.model, batch, a.prompt, get_num_threads()),
                 available_memory_bytes(), "decoding " + std::to_string(batch) + " sequences of " + std::to_string(context) + " positions");
    return run_bench_decode(a, cfg, batch);
  }
  const int64_t batch = a.batch > 0 ? a.batch : cfg.batch_size;
  cfg.batch_size = batch;  // --batch is what runs: count it, not the config's batch_size
  cfg.eval_iters = 0;
  cfg.frozen_weights = FrozenWeights::f32;  // bench_train holds every weight in float32
  check_training_memory(cfg);
  const BenchResult r = bench_train(cfg, batch, a.iters, a.warmup, a.seed);
  if (a.json) {
    std::printf("%s\n", bench_record(cfg, r, batch, a.iters, a.warmup).dump().c_str());
    return 0;
  }
  const ComputeInfo ci = compute_info();
  std::printf("%s\n", compute_summary(ci).c_str());
  const std::string how = to_string(cfg.precision) + (cfg.recompute == Recompute::none ? "" : ", recompute " + to_string(cfg.recompute)) +
                          (cfg.trainable == Trainable::all ? "" : ", trainable " + to_string(cfg.trainable));
  std::printf("train (%s): median %.3f ms per step, %.0f tokens/s (%d iterations after %d warm-up, %d threads)\n",
              how.c_str(), r.median_s * 1e3, r.tokens_per_s, a.iters, a.warmup, get_num_threads());
  const double mf = r.tokens_per_s * cfg.train_flops_per_token();
  std::printf("model FLOP/s %.1f G: MFU %.1f%% of sgemm peak, %.1f%% of CPU peak\n", mf / 1e9, 100.0 * mf / ci.sgemm_peak,
              100.0 * mf / ci.cpu_peak);
  std::printf("linear layers' products: median %.3f ms per step (%.0f%% of the step's median)\n", r.linear_median_s * 1e3,
              100.0 * r.linear_median_s / r.median_s);
  if (cfg.precision == Precision::bf16) std::printf("%s\n", bf16_rate_note().c_str());
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
  c.add_option("--tokens", a.tokens, "evaluate the first windows holding this many tokens (0: all)")->check(count_in(0, int64_t{1} << 40));
  c.add_flag("--stream", a.stream, "read the model one block at a time (also when it does not fit in memory in float32)");
  c.add_option("--split", a.split, "for text: train, val or all")->check(CLI::IsMember({"train", "val", "all"}));
  c.add_option("--grad-out", a.grad_out, "write d loss / d parameter to this HDF5 file");
  c.add_option("--batch", a.batch, "windows per forward pass")->check(count_in(1, int64_t{1} << 20));
  c.add_flag("--json", a.json, "print one JSON line");
  c.add_option("--kv-cache", a.kv_cache, "round K and V as a KV cache of this type stores them: the loss a 16-bit or 8-bit cache gives")
      ->check(CLI::IsMember(enum_names<KvType>()));
}

int run_eval(const EvalArgs& a) {
  refuse_outputs_over_inputs({{"--grad-out", a.grad_out}}, {{"--checkpoint", a.checkpoint}, {"--data", a.data}});
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
    const int64_t windows = static_cast<int64_t>(pass_rows) / std::max<int64_t>(1, data.T);
    // streaming chosen by tapelm, not asked for: say why, and what a smaller --batch would hold
    // (eval --batch 100000 was refused with the estimate of a streamed run alone)
    const std::string why = a.stream ? "" : " (streamed because the model in float32 and a pass of " + std::to_string(windows) +
                                                 " windows, " + byte_size_str(whole + batch_bytes) + ", do not fit in memory; a smaller --batch holds less)";
    check_memory(estimate, available_memory_bytes(),
                 "evaluating " + m.what + " one block at a time on " + std::to_string(static_cast<int64_t>(tokens)) + " tokens" + why);
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
  c.add_option("--tokens", a.tokens, "tokens to generate")->check(count_in(0, int64_t{1} << 40));
  c.add_option("--temperature", a.temperature, "softmax temperature, above 0 (--greedy: the most likely token)")->check(number_in(0, std::numeric_limits<double>::infinity(), true));
  c.add_option("--top-k", a.top_k, "sample among the k most likely tokens (0: all)")->check(count_in(0, int64_t{1} << 31));
  c.add_option("--seed", a.seed, "random seed")->check(seed_range());
  c.add_flag("--greedy", a.greedy, "always take the most likely token");
  c.add_option("--kv-cache", a.kv_cache, kv_cache_help)->check(CLI::IsMember(enum_names<KvType>()));
  c.add_option("--weights", a.weights,
               std::string(weights_help) +
                   "; auto (the default): q8_0 for a GGUF file of q8_0 matrices; the file's 16-bit type for a file of bf16 or "
                   "f16 matrices too large for memory in float32; else f32")
      ->check(CLI::IsMember({"auto", "f32", "bf16", "f16", "q8_0"}));
}

int run_sample(const SampleArgs& a) {
  using Clock = std::chrono::steady_clock;
  const auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  const Clock::time_point start = Clock::now();
  const formats::OpenedModel m = formats::open_model(a.checkpoint);
  if (!m.tok) throw Error(ErrorKind::checkpoint, a.checkpoint + ": has no tokenizer (a weights-only checkpoint); sample needs one");
  const Tokenizer* tok = &*m.tok;
  const KvType kv_type = enum_from_name<KvType>(a.kv_cache, "--kv-cache");
  check_kv_type(kv_type, m.config.head_dim());
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
  // the cache holds the positions the run reaches (generate_stream), the prefill runs the prompt
  const int64_t positions = std::min<int64_t>(m.config.block_size, static_cast<int64_t>(prompt.size()) + a.tokens);
  const double whole = 4.0 * static_cast<double>(model_cost(m.config).params),
               cache = static_cast<double>(kv_cache_bytes_per_token(m.config, kv_type)) * static_cast<double>(positions) +
                       prefill_bytes(m.config, 1, std::min<int64_t>(m.config.block_size, static_cast<int64_t>(prompt.size())), get_num_threads());
  const DecodePlan plan = plan_decode(m, cache, a.stream, a.weights, available_memory_bytes(), address_space_limited());
  std::unique_ptr<Decoder> model;
  if (plan.hold == DecodeHold::kept) {
    check_memory(plan.bytes, available_memory_bytes(), "sampling from " + m.what);
    // before the read, which takes a while (OpenedModel::mappable is what map_matrix maps)
    std::fprintf(stderr, "tapelm: sampling from %s with its matrices in %s (%s, %s of it mapped from the file; %s in float32, more than fits)\n",
                 a.checkpoint.c_str(), to_string(plan.weights).c_str(), byte_size_str(StreamedModel::resident_bytes(m.config, plan.weights)).c_str(),
                 byte_size_str(plan.mapped).c_str(), byte_size_str(whole).c_str());
    auto sm = std::make_unique<StreamedModel>(m);
    sm->pack_weights(plan.weights);
    sm->keep_blocks();
    model = std::move(sm);
  } else if (plan.hold == DecodeHold::streamed) {
    check_memory(plan.bytes, available_memory_bytes(), "sampling from " + m.what + " one block at a time");
    std::fprintf(stderr, "tapelm: sampling from %s one block at a time (%s in float32): every token reads the whole model\n", a.checkpoint.c_str(),
                 byte_size_str(whole).c_str());
    auto sm = std::make_unique<StreamedModel>(m);
    if (plan.weights != WeightType::f32) sm->pack_weights(plan.weights);
    model = std::move(sm);
  } else {
    std::unique_ptr<GPT> loaded = m.load();
    if (plan.weights != WeightType::f32) loaded->pack_weights(plan.weights);
    model = std::move(loaded);
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
  const Clock::time_point loaded = Clock::now();
  Clock::time_point first, last;
  int64_t made = 0;
  generate_stream(*model, {prompt}, a.tokens, so, a.seed, [&](const std::vector<int32_t>& next) {
    put(tok->decode_next(prev, next[0]));
    prev = next[0];
    std::fflush(stdout);  // each token as it comes: a long sample shows progress, a pipe gets it at once
    (made++ == 0 ? first : last) = Clock::now();
  });
  std::printf("\n");
  // llama.cpp's timings, in one line: what reading the model, the prompt and each later token took
  if (made >= 2)
    std::fprintf(stderr, "tapelm: %ld tokens: model ready in %.2f s, prompt of %zu tokens and the first token %.3f s, then %.2f ms a token\n",
                 (long)made, seconds(start, loaded), prompt.size(), seconds(loaded, first),
                 1e3 * seconds(first, last) / static_cast<double>(made - 1));
  return 0;
}

struct InspectArgs {
  std::string checkpoint;
  bool system = false;
};

void inspect_flags(CLI::App& c, InspectArgs& a) {
  c.add_option("checkpoint", a.checkpoint, "model: a checkpoint, a Hugging Face directory or a GGUF file");
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
  // any model tapelm reads, opened as every command opens one; a checkpoint also says its training
  const formats::OpenedModel opened = formats::open_model(path);
  const CheckpointInfo info = opened.format == "tapelm" ? inspect_checkpoint(path) : CheckpointInfo{opened.config};
  const GPTConfig& c = opened.config;
  const ModelCost m = model_cost(c);
  if (opened.format == "tapelm") std::printf("checkpoint %s\n", path.c_str());
  else std::printf("model %s (%s)\n", path.c_str(), opened.what.c_str());
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

}  // namespace

Command eval_command(CLI::App& app) {
  return command(app, "eval", "loss of a checkpoint on text, tokens or a parity file", eval_flags, run_eval);
}

Command sample_command(CLI::App& app) { return command(app, "sample", "generate text from a checkpoint", sample_flags, run_sample); }

Command inspect_command(CLI::App& app) {
  return command(app, "inspect", "config, parameters, FLOPs and KV-cache bytes of a checkpoint", inspect_flags, run_inspect);
}

Command bench_command(CLI::App& app) {
  return command(app, "bench", "speed of a training step or of KV-cache decoding", bench_flags, run_bench);
}

}  // namespace tapelm::cli
