// train, uptrain, sweep and plot: the commands that train.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "train/cli/commands.h"
#include "train/cli/common.h"
#include "train/formats/registry.h"
#include "data/dataset.h"
#include "data/outdir.h"
#include "nn/accounting.h"
#include "train/dist.h"
#include "train/formats/checkpoint.h"
#include "train/study/plot.h"
#include "train/study/sweep/runner.h"
#include "train/study/uptrain.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace tapelm::cli {

namespace fs = std::filesystem;

namespace {

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
  c.add_option("--precision", a.precision, precision_help)->check(CLI::IsMember(enum_names<Precision>()));
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
    refuse_outputs_over_inputs({{"--out", a.out}}, {{"--data", a.data}, {"--config", a.config}});
    corpus = load_corpus(a.data);
    std::vector<std::string> sets = a.sets;
    if (!a.precision.empty()) sets.push_back("precision=" + a.precision);
    cfg = build_train_config(a.config, a.resume, a.out, sets, corpus.tok.vocab_size(), threads);
    check_precision_runs(cfg.precision);
    check_training_memory(cfg, available_memory_bytes(), dist::size());  // a sharded run: a rank's share
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
      char b[160];
      std::snprintf(b, sizeof b, ", %.4f on %s", r.val_loss_full,
                    split_eval_what(cfg.final_eval_tokens, static_cast<int64_t>(corpus.val.size()), cfg.model.block_size).c_str());
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

/// The training keys uptrain_config derives from uptrain's flags, with the flag to use instead.
const std::vector<std::pair<std::string, std::string>>& uptrain_owned_keys() {
  static const std::vector<std::pair<std::string, std::string>> keys = {
      {"seed", "--seed"}, {"trainable", "--train"}, {"distill_lambda", "--distill-lambda"},
      {"distill_temperature", "--distill-temperature"}, {"distill_attention", "--distill-attention"},
      {"learning_rate", "--lr and --schedule"}, {"min_lr", "--lr and --schedule"}, {"warmup_iters", "--schedule"},
      {"lr_decay_iters", "--schedule"}, {"decay_lr", "--schedule"}};
  return keys;
}

struct UptrainArgs {
  std::string from, method = "mean", data, out, schedule = "rewarm", grouping = "contiguous", config, precision, train = "all";
  std::vector<std::string> sets;  // --set: the source's training config changed before uptraining derives from it
  int64_t kv_heads = 0, calib_tokens = 16384;
  std::optional<int64_t> eval_tokens;
  double fraction = 0.05, lr = 0;
  DistillArgs distill;
  bool lr_given = false;
  uint64_t seed = 1;
  bool resume = false, quiet = false;
  const int* threads = nullptr;  // the global --threads
};

void uptrain_flags(CLI::App& c, UptrainArgs& a) {
  c.add_option("--from", a.from, "the model to convert and uptrain: a full checkpoint of the original run, or weights only (a checkpoint, an HF directory, a GGUF file) with --config")->required();
  c.add_option("--kv-heads", a.kv_heads, "new number of key/value heads")->required();
  c.add_option("--method", a.method, "conversion method")->check(CLI::IsMember(method_names()));
  c.add_option("--grouping", a.grouping, "contiguous, similar, or per-layer (--kv-heads' budget over all layers, placed where the "
                                         "conversion error is largest)")
      ->check(CLI::IsMember({"contiguous", "similar", "per-layer"}));
  c.add_option("--calib-tokens", a.calib_tokens, "calibration tokens from the train split (aligned, fit, aligned-fit, similar)");
  c.add_option("--eval-tokens", a.eval_tokens, "the loss before and after uptraining on the val split's first N tokens "
                                               "(0: all; default: the original run's final_eval_tokens)")
      ->check(count_in(0, int64_t{1} << 40));
  c.add_option("--fraction", a.fraction, "uptraining steps as a fraction of the original max_iters (0: convert and evaluate)");
  c.add_option("--schedule", a.schedule, "rewarm (warmup + cosine) or continue (the original final lr)")
      ->check(CLI::IsMember({"rewarm", "continue"}));
  c.add_option("--data", a.data, "the original run's text or prepared directory")->required();
  c.add_option("--out", a.out, "run directory")->required();
  c.add_option("--config", a.config,
               "training config JSON for a weights-only source (an imported model); the model keys are the checkpoint's");
  c.add_option("--set", a.sets, "override a key of the source's training config before the uptraining config is derived from it: "
                               "key=value (repeatable; training keys such as shard, recompute, batch_size, grad_accum, max_iters; dropout)");
  c.add_option("--lr", a.lr, "rewarm: peak learning rate (default: half the original run's peak)")
      ->each([&a](const std::string&) { a.lr_given = true; });
  c.add_option("--seed", a.seed, "seed for batches, dropout and random init")->check(seed_range());
  c.add_option("--precision", a.precision, std::string(precision_help) + " (default: the original run's)")
      ->check(CLI::IsMember(enum_names<Precision>()));
  c.add_option("--train", a.train, "the parameters uptrained: all; attention (the q, k, v and output projections); kv (only the "
                                 "key and value projections the conversion made); the others stay frozen")
      ->check(CLI::IsMember(enum_names<Trainable>()));
  a.distill.add_flags(c, "distil from the source model: loss (1 - lambda)·CE + lambda·T²·KL(source || converted)", true);
  c.add_flag("--resume", a.resume, "continue an interrupted uptraining run");
  c.add_flag("--quiet", a.quiet, "no progress lines");
}

int run_uptrain(const UptrainArgs& a) {
  const StopToken stop = signal_stop_token();  // first, so a signal during set-up cannot kill one rank of a job
  Corpus corpus;
  UptrainOptions o;
  std::string setup_error;
  try {  // in a multi-rank job every rank reads its own inputs; dist::agree ends the job if one fails
    refuse_outputs_over_inputs({{"--out", a.out}}, {{"--from", a.from}, {"--data", a.data}, {"--config", a.config}});
    corpus = load_corpus(a.data);
    TrainConfig original = source_train_config(a.from, a.config, "uptraining");
    for (const std::string& s : a.sets)  // keys uptraining sets from its own flags: a --set of them would be lost
      for (const auto& [key, flag] : uptrain_owned_keys())
        if (s.substr(0, s.find('=')) == key)
          throw Error(ErrorKind::usage, "uptrain --set: '" + key + "' is set by " + flag);
    if (!a.sets.empty()) original = with_train_overrides(original, a.sets, "uptrain --set");
    if (*a.threads > 0) original.threads = *a.threads;  // the global --threads, as train takes it
    check_window_fits(corpus.train.size(), original.model.block_size, a.data + ": the train split");
    check_window_fits(corpus.val.size(), original.model.block_size, a.data + ": the val split");
    check_precision_runs(a.precision.empty() ? original.precision : enum_from_name<Precision>(a.precision, "--precision"));
    if (const formats::OpenedModel m = formats::open_model(a.from); m.tok && !(*m.tok == corpus.tok))
      throw Error(ErrorKind::data, a.data + ": its characters differ from the tokenizer of " + a.from);
    o.kv_heads = a.kv_heads;
    o.variant = {&method(a.method), enum_from_name<Grouping>(a.grouping, "--grouping")};
    o.calib_tokens = a.calib_tokens;
    o.fraction = a.fraction;
    o.schedule = parse_uptrain_schedule(a.schedule);
    if (a.lr_given) o.lr = a.lr;
    o.seed = a.seed;
    o.resume = a.resume;
    o.quiet = a.quiet || dist::rank() != 0;
    o.stop = stop;
    o.original = original;
    if (!a.precision.empty()) o.precision = enum_from_name<Precision>(a.precision, "--precision");
    o.eval_tokens = a.eval_tokens;
    o.trainable = enum_from_name<Trainable>(a.train, "--train");
    o.distill_lambda = a.distill.lambda_for("uptrain");
    o.distill_temperature = a.distill.temperature;
    o.distill_attention = a.distill.attention;
  } catch (const std::exception& e) {
    if (!dist::multi()) throw;
    setup_error = *e.what() ? e.what() : "unknown error";
  }
  dist::agree(setup_error);
  if (dist::rank() == 0 && dist::multi() && !a.quiet)
    std::printf("data parallel over %d ranks: rank 0 converts, every rank uptrains from its weights (shard %s)\n", dist::size(),
                to_string(o.original->shard).c_str());
  UptrainResult r = uptrain(a.from, corpus, a.out, o);
  if (dist::rank() != 0) return 0;
  if (r.interrupted) {
    std::printf("uptraining stopped by signal; resume with --resume\n");
    return 0;
  }
  std::printf("uptrained %s to %s kv heads by %s (%s groups, converted in %.2fs): %ld steps (fraction %g, schedule %s, lr %.2e -> %.2e): val loss %.4f "
              "(converted, before uptraining: %.4f) on %s; checkpoint %s/checkpoint.h5\n",
              a.from.c_str(), r.config.model.kv_heads_str().c_str(), a.method.c_str(), a.grouping.c_str(), r.convert_seconds, (long)r.steps, a.fraction, a.schedule.c_str(),
              r.config.learning_rate, r.config.decay_lr ? r.config.min_lr : r.config.learning_rate, r.val_loss,
              r.loss_before,
              split_eval_what(r.config.final_eval_tokens, static_cast<int64_t>(corpus.val.size()), r.config.model.block_size).c_str(),
              a.out.c_str());
  return 0;
}

struct SweepArgs {
  std::string preset = "tiny", data, out, methods, groupings, from, config, precision, distill_methods, train, train_method;
  DistillArgs distill;
  bool quiet = false, scratch = false, retime_decoding = false;
};

void sweep_flags(CLI::App& c, SweepArgs& a) {
  c.add_option("--preset", a.preset, "tiny (~10 min), small (~1 h) or paper (long)")
      ->check(CLI::IsMember({"tiny", "small", "paper", "micro"}));
  c.add_option("--data", a.data, "UTF-8 text (or a prepared directory)")->required();
  c.add_option("--out", a.out, "report directory (re-running resumes)")->required();
  c.add_option("--methods", a.methods, "conversion methods, comma-separated (default: all; must include mean)");
  c.add_option("--groupings", a.groupings, "groupings, comma-separated: contiguous,similar,per-layer (default: contiguous)");
  CLI::Option* from = c.add_option("--from", a.from,
                                   "start from this MHA model (a checkpoint, an HF directory or a GGUF file) instead of pretraining one; "
                                   "--data must be tokenized by its tokenizer");
  c.add_option("--config", a.config, "with --from: training config JSON (its max_iters is the P that α multiplies)")->needs(from);
  c.add_flag("--scratch", a.scratch, "with --from: also train each GQA/MQA model from scratch (off by default)")->needs(from);
  c.add_option("--precision", a.precision, std::string(precision_help) + " — for every training and uptraining run of the study")
      ->check(CLI::IsMember(enum_names<Precision>()));
  a.distill.add_flags(c, "also uptrain each KV count at the headline alpha distilled from the MHA model (every seed; the MHA "
                         "row alike; models from scratch again at the distilled compute)");
  c.add_option("--distill-methods", a.distill_methods, "with --distill: the conversions distilled, comma-separated (default: mean,aligned-fit "
                                                       "where among --methods)");
  c.add_option("--train", a.train, "also uptrain each GQA/MQA model at the headline alpha training only these parameters, comma-separated: "
                                 "attention, kv (every seed; the others frozen as converted)");
  c.add_option("--train-method", a.train_method, "with --train: the conversion of those cells (default: aligned-fit; among --methods)");
  c.add_flag("--retime-decoding", a.retime_decoding,
             "train nothing: time every model shape's decoding again with this build and, when every cell has run, write the "
             "report again with the new times");
  c.add_flag("--quiet", a.quiet, "no progress lines");
}

int run_sweep(const SweepArgs& a) {
  refuse_outputs_over_inputs({{"--out", a.out}}, {{"--from", a.from}, {"--data", a.data}, {"--config", a.config}});
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
  if (!a.train.empty())
    for (const std::string& t : split_list(a.train, "--train")) p.partial.push_back(enum_from_name<Trainable>(t, "--train"));
  if (!a.train_method.empty()) {
    if (a.train.empty()) throw Error(ErrorKind::usage, "sweep: --train-method needs --train");
    p.partial_method = a.train_method;
  }
  if (a.retime_decoding) {
    tapelm::retime_sweep_decoding(p, a.data, a.out, a.quiet);
    return 0;
  }
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

}  // namespace

namespace {
/// c, marked as a command that runs as one job under mpirun.
Command on_many_ranks(Command c) {
  c.multi_rank = true;
  return c;
}
}  // namespace

Command train_command(CLI::App& app, const int& threads) {
  TrainArgs train;
  train.threads = &threads;
  return on_many_ranks(command(app, "train", "train a model (nanoGPT's train.py)", train_flags, run_train, train));
}

Command uptrain_command(CLI::App& app, const int& threads) {
  UptrainArgs uptrain;
  uptrain.threads = &threads;
  return on_many_ranks(command(app, "uptrain", "convert to fewer kv heads, then train a fraction of the original steps", uptrain_flags,
                               run_uptrain, uptrain));
}

Command sweep_command(CLI::App& app) {
  return command(app, "sweep", "the MHA -> GQA/MQA trade-off study with report and plots", sweep_flags, run_sweep);
}

Command plot_command(CLI::App& app) {
  return command(app, "plot", "draw RUN_DIR/loss.png from RUN_DIR/metrics.jsonl", plot_flags, run_plot);
}

}  // namespace tapelm::cli
