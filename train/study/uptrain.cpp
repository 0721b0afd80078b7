#include "train/study/uptrain.h"

#include "train/study/convert_model.h"

#include <chrono>
#include <cstdio>
#include <cmath>
#include <filesystem>

#include "autograd/json_read.h"
#include "autograd/tensor.h"
#include "data/io.h"
#include "data/sampler.h"
#include "train/dist.h"
#include "train/formats/h5file.h"
#include "train/formats/registry.h"

namespace tapelm {

namespace fs = std::filesystem;

UptrainSchedule parse_uptrain_schedule(const std::string& s) {
  if (s == "rewarm") return UptrainSchedule::Rewarm;
  if (s == "continue") return UptrainSchedule::Continue;
  throw Error(ErrorKind::usage, "unknown uptraining schedule \"" + s + "\" (expected rewarm or continue)");
}

std::string to_string(UptrainSchedule s) { return s == UptrainSchedule::Rewarm ? "rewarm" : "continue"; }

TrainConfig uptrain_config(const TrainConfig& original, const UptrainOptions& o) {
  if (!(o.fraction >= 0 && o.fraction <= 10))
    throw Error(ErrorKind::usage, "uptraining fraction " + std::to_string(o.fraction) + " is not in [0, 10]");
  if (o.lr && !(*o.lr > 0 && std::isfinite(*o.lr)))  // 0, -1 and NaN were taken as "not given"
    throw Error(ErrorKind::usage, "uptraining learning rate " + echo_json(*o.lr) + " is not positive and finite");
  TrainConfig c = original;
  // uniform: a per-layer source's list goes (it was left beside the new count, and validate()
  // refused the pair naming no file); a per-layer result sets its own list after converting
  c.model.set_kv_heads({o.kv_heads});
  c.model.validate();
  const int64_t steps = std::llround(o.fraction * static_cast<double>(original.max_iters));
  c.max_iters = steps;
  c.seed = o.seed;
  if (o.precision) c.precision = *o.precision;
  if (o.eval_tokens) c.final_eval_tokens = *o.eval_tokens;
  c.trainable = o.trainable;
  c.distill_lambda = o.distill_lambda;
  c.distill_temperature = o.distill_temperature;
  c.distill_attention = o.distill_attention;
  c.validate();  // λ in [0, 1], T > 0
  if (o.schedule == UptrainSchedule::Rewarm) {
    c.learning_rate = o.lr ? *o.lr : original.learning_rate * o.rewarm_scale;
    c.min_lr = std::min(original.min_lr, c.learning_rate);
    c.warmup_iters = std::min(original.warmup_iters, std::max<int64_t>(1, steps / 10));
    c.lr_decay_iters = std::max<int64_t>(1, steps);
    c.decay_lr = true;
  } else {
    c.learning_rate = lr_at(original.max_iters, original.schedule());
    c.min_lr = c.learning_rate;
    c.warmup_iters = 0;
    c.decay_lr = false;
  }
  c.eval_interval = std::max<int64_t>(1, std::min(original.eval_interval, std::max<int64_t>(1, steps / 4)));
  c.checkpoint_interval = std::max<int64_t>(1, std::min(original.checkpoint_interval, std::max<int64_t>(1, steps)));
  c.log_interval = std::max<int64_t>(1, std::min(original.log_interval, std::max<int64_t>(1, steps / 10)));
  return c;
}

namespace {

/// Rank 0's model on every rank: its config (a per-layer conversion's counts included), then its
/// weights. The other ranks pass nothing and get a model of that config holding rank 0's values;
/// under `shard: parameters` (the run's) only the values they will hold while training: a block
/// weight another rank keeps is received into a buffer of one tensor and dropped, and its own
/// place is never touched, so no rank but 0 holds the whole model.
std::unique_ptr<GPT> share_from_rank0(std::unique_ptr<GPT> mine, const TrainConfig& run) {
  if (!dist::multi()) return mine;
  std::string config = dist::rank() == 0 ? mine->config().to_json().dump() : "";
  dist::broadcast(config);
  GPT::Keep keep;
  if (run.shard == Shard::parameters) {
    TrainConfig c = run;
    c.model = GPTConfig::from_json_string(config);
    keep = start_keep(c);
  }
  if (dist::rank() != 0) mine = std::make_unique<GPT>(GPTConfig::from_json_string(config), 1337, keep);
  for (const auto& [name, p] : mine->named_parameters()) {
    if (dist::rank() == 0 || !keep || keep(name)) {
      dist::broadcast(p.val().data(), static_cast<size_t>(p.numel()));
      continue;
    }
    Tensor passing = Tensor::empty(p.shape());
    dist::broadcast(passing.data(), static_cast<size_t>(passing.numel()));
  }
  return mine;
}

// Under `shard: parameters` on several ranks only rank 0 holds a whole model outside training.
bool holds_whole_model_on_rank0_only(const TrainConfig& run) { return dist::multi() && run.shard == Shard::parameters; }

// The val loss of rank 0's model, evaluated there alone and told to every rank (the others sleep
// meanwhile, leaving it the cores): the figure evaluate_split deals out over the ranks.
// `model` is read on rank 0 only.
double evaluate_on_rank0(GPT* model, const Corpus& corpus, const TrainConfig& run) {
  double loss = dist::rank() == 0 ? evaluate_split(*model, corpus.val, false, run.final_eval_tokens) : 0.0;
  dist::barrier_sleeping();
  dist::allreduce_sum(&loss, 1);
  return loss;
}

// The trained model's val loss: rank 0 read it (mine); shared with every rank and dealt out, or,
// under `shard: parameters`, evaluated on rank 0 alone, so that no other rank holds it whole.
double evaluate_on_rank0_or_all(std::unique_ptr<GPT> mine, const Corpus& corpus, const TrainConfig& run) {
  if (holds_whole_model_on_rank0_only(run)) return evaluate_on_rank0(mine.get(), corpus, run);
  const std::unique_ptr<GPT> done = share_from_rank0(std::move(mine), run);
  return evaluate_split(*done, corpus.val, dist::multi(), run.final_eval_tokens);
}

// Whether the run's frozen block weights are held in 16 bits outside training too, as the conversion
// makes them and as the trained checkpoint is read back: in one process (under mpirun rank 0 shares
// the model whole), with frozen weights and frozen_weights not f32.
bool narrows_outside_training(const TrainConfig& run) {
  return !dist::multi() && run.trainable != Trainable::all && run.frozen_weights != FrozenWeights::f32;
}

// How many of run's weights the memory checks count in 16 bits, from a source stored in
// source_type converted by method m: every frozen block weight under bf16 or f16; under auto when
// the source's type is 16-bit, but for `wq` and `wo` under kv when m rotates them (`auto` keeps a
// weight the conversion changed in float32). Less one block's, float32 while it is filled or read.
double expected_16bit_values(const TrainConfig& run, WeightType source_type, const MethodRow& m) {
  const bool source16 = source_type == WeightType::bf16 || source_type == WeightType::f16;
  if (run.trainable == Trainable::all || run.frozen_weights == FrozenWeights::f32 ||
      (run.frozen_weights == FrozenWeights::automatic && !source16))
    return 0;
  const BlockParams frozen = frozen_block_params(run);
  double n = frozen.all - frozen.largest;
  if (run.frozen_weights == FrozenWeights::automatic && run.trainable == Trainable::kv && m.aligns)
    for (const auto& [name, shape] : parameter_shapes(run.model))
      if (name.find(".attn.wq.") != std::string::npos || name.find(".attn.wo.") != std::string::npos)
        n -= static_cast<double>(shape_numel(shape));
  return std::max(n, 0.0);
}

}  // namespace

UptrainResult uptrain(const std::string& from, const Corpus& corpus, const std::string& out_dir, const UptrainOptions& o) {
  // Under mpirun (data parallel, sharded as the config's `shard` says) rank 0 alone locks the run
  // directory, converts and writes; the others take its converted weights. Ranks given other
  // arguments than rank 0's are refused before any conversion, and what fails before the
  // conversion's result is shared is agreed on: the job ends with one message, before any rank
  // waits in a collective the others skip.
  const bool lead = dist::rank() == 0;
  RunDir dir(out_dir);
  UptrainResult r;
  std::unique_ptr<GPT> source, converted;
  std::string from_digest, setup_error, mine;  // mine: what every rank must share with rank 0
  int64_t kv_heads_from = 0;
  WeightType source_type = WeightType::f32;  // what the source's weights are stored in
  TrainConfig original;  // the source's run's config (or --config's), with --set
  const bool teaching = o.distill_lambda > 0 || o.distill_attention > 0;
  try {
    if (o.resume && !fs::exists(dir.checkpoint()))  // before converting, and before anything is made
      throw Error(ErrorKind::train, out_dir + ": resuming, but there is no checkpoint.h5 to resume from");
    // The run directory is locked before anything is read or converted: a second uptrain on the same
    // --out fails here, not after minutes of calibration and conversion.
    if (lead) dir.prepare();
    // The run's teacher and starting point, by content: --resume with another model under --from (of
    // the same shape, or a GQA one) went on distilling from it, exit 0. Rank 0 reads the whole
    // source for it; another rank only when the source teaches there (else it never reads the
    // source's weights: rank 0 converts, and its digest is the run's)
    if (lead || teaching) from_digest = formats::model_digest(from, "uptrain --from");
    if (o.resume && !from_digest.empty()) {
      H5File f = H5File::open_read(dir.checkpoint());
      const nlohmann::json extra =
          f.has_attr("/train", "extra") ? parse_json(f.read_attr_string("/train", "extra"), dir.checkpoint() + " /train extra", ErrorKind::checkpoint)
                                        : nlohmann::json::object();
      const std::string was = extra.is_object() && extra.contains("from_digest") && extra["from_digest"].is_string() ? extra["from_digest"].get<std::string>() : "";
      if (!was.empty() && was != from_digest)
        throw Error(ErrorKind::usage, "uptrain --resume: " + dir.checkpoint() + " was uptrained from a model of digest " + was + ", but --from " + from +
                                          " has digest " + from_digest + ": resume with the model the run began from");
    }
    original = o.original ? *o.original : read_train_config(H5File::open_read(from));
    kv_heads_from = original.model.n_kv_head;
    r.config = uptrain_config(original, o);
    r.steps = r.config.max_iters;
    mine = r.config.to_json().dump() + "|" + (teaching ? from_digest : "") + "|" + std::to_string(o.kv_heads) + "|" + o.variant.method->name + "|" +
           to_string(o.variant.grouping) + "|" + std::to_string(o.calib_tokens) + "|" + std::to_string(o.resume) + "|" +
           std::to_string(o.known_loss_before) + "|" + corpus.train.fingerprint() + "|" + corpus.val.fingerprint();
  } catch (const std::exception& e) {
    if (!dist::multi()) throw;
    setup_error = *e.what() ? e.what() : "unknown error";
  }
  if (dist::multi()) {  // before any rank converts or waits for rank 0 to
    std::string lead_args = mine;
    dist::broadcast(lead_args);
    if (setup_error.empty() && mine != lead_args)
      setup_error = "its uptraining differs from rank 0's (another source, corpus, conversion, fraction or --set; config: " +
                    r.config.to_json().dump() + ")";
  }
  dist::agree(setup_error);
  try {
    // The source: on every rank the teacher of distillation; on rank 0 what is converted, loaded
    // whole only when it teaches or a budget measures every layer's conversion on it, else read
    // one block at a time (the same result, without the source's float32 copy beside it).
    {
      const formats::OpenedModel opened = formats::open_model(from);  // a checkpoint, an HF directory or a GGUF file
      GPTConfig same = original.model;
      same.dropout = opened.config.dropout;  // a training choice, not the model's
      if (!(same == opened.config))
        throw Error(ErrorKind::config, "uptrain: the training config's model differs from " + from + "'s");
      source_type = opened.kept_dtype();
    }
    const bool budget = kv_budget_of({.heads = {o.kv_heads}}, o.variant, original.model) > 0;
    if (teaching || (lead && budget)) source = formats::open_model(from).load();
    if (lead) {
      const CalibrationSource calib{.ids = corpus.train, .tokens = o.calib_tokens, .seed = o.calib_seed, .what = "calibration data (the train split)"};
      // one process: the frozen block weights go to 16 bits (frozen_weights) as each block is made,
      // so the float32 model is never whole (a 7B's 23 GB); the trainer takes them over as they are
      // (on a resume too: the trainer reads the checkpoint's into them a block at a time)
      const NarrowedBlocks::HeldAs held_as = narrows_outside_training(r.config) ? frozen_weights_held_as(r.config, 1) : nullptr;
      Converted c = source ? calibrate_and_convert(*source, o.kv_heads, o.variant, o.seed, calib)
                           : convert_streamed_in_memory(from, o.kv_heads, o.variant, o.seed, calib, held_as,
                                                        expected_16bit_values(r.config, source_type, *o.variant.method));
      converted = std::move(c.model);
      if (held_as && source)  // converted whole (a teacher, a budget): narrowed now
        if (auto n = std::make_shared<NarrowedBlocks>(*converted, held_as); n->values() > 0) converted->residency = n;
      r.convert_seconds = c.seconds;
      if (const auto n = std::dynamic_pointer_cast<NarrowedBlocks>(converted->residency)) {
        r.narrowed_values = n->values();
        if (!o.quiet)
          std::printf("%sconverted in %.1f s, the frozen block weights held in %s from here on: %.2f M parameters in %s%s\n", o.label.c_str(),
                      c.seconds, n->types().c_str(), static_cast<double>(n->values()) / 1e6,
                      byte_size_str(2.0 * static_cast<double>(n->values())).c_str(),
                      n->inexact() == 0 ? " (exactly their values)" : (" (" + std::to_string(n->inexact()) + " values rounded)").c_str());
        std::fflush(stdout);
      }
    }
    // The source is the teacher of distillation and nothing else once converted: without one it is
    // freed here, not held beside the model being trained (a 1.3 B model's 5.4 GB).
    if (!teaching) source.reset();
  } catch (const std::exception& e) {
    if (!dist::multi()) throw;
    setup_error = *e.what() ? e.what() : "unknown error";
  }
  dist::barrier_sleeping();  // the other ranks, idle while rank 0 converts, leave it the cores
  dist::agree(setup_error);
  converted = share_from_rank0(std::move(converted), r.config);
  if (converted->config().per_layer_kv()) r.config.model.set_kv_heads(converted->config().layer_kv_heads);
  if (o.known_loss_before >= 0)
    r.loss_before = o.known_loss_before;
  else if (holds_whole_model_on_rank0_only(r.config))
    r.loss_before = evaluate_on_rank0(converted.get(), corpus, r.config);
  else
    r.loss_before = evaluate_split(*converted, corpus.val, dist::multi(), r.config.final_eval_tokens);

  TrainOptions to;
  to.resume = o.resume;
  to.quiet = o.quiet;
  to.label = o.label;
  to.stop = o.stop;
  to.init_from = converted.get();  // its weights are taken over, not copied
  to.init_shared = true;           // share_from_rank0 sent them to every rank
  if (teaching) {
    source->eval();  // the teacher: no dropout
    to.teacher = source.get();
  }
  to.final_eval = false;  // evaluated below, outside the timed training
  to.dir_locked = true;   // dir holds the lock
  to.extra_json = nlohmann::json{{"uptrain_from", fs::path(from).filename().string()},
                                 {"from_digest", from_digest},
                                 {"kv_heads_from", kv_heads_from},
                                 {"kv_heads", converted->config().kv_heads_json()},
                                 {"method", o.variant.method->name},
                                 {"grouping", to_string(o.variant.grouping)},
                                 {"fraction", o.fraction},
                                 {"schedule", to_string(o.schedule)},
                                 {"distill_lambda", o.distill_lambda},
                                 {"distill_temperature", o.distill_temperature},
                                 {"distill_attention", o.distill_attention}}
                      .dump();
  const auto t0 = std::chrono::steady_clock::now();
  if (r.steps == 0) {
    // α = 0: the converted weights are the result; keep them as a checkpoint all the same.
    if (lead) {
      auto opt = r.config.make_optimizer(converted->named_parameters());
      TrainState st;
      st.extra_json = to.extra_json;
      st.dropout_rng = converted->dropout_rng().state();
      OptimStateSource widened;  // weights held in 16 bits written in float32, one tensor at a time
      if (const auto narrowed = std::dynamic_pointer_cast<NarrowedBlocks>(converted->residency))
        widened.weight = [narrowed](const Var& p, const Shape&) { return narrowed->value(p); };
      save_training_checkpoint(dir.checkpoint(), *converted, *opt, r.config, st, corpus.tok, widened.weight ? &widened : nullptr);
    }
    r.val_loss = r.loss_before;
    return r;
  }
  const TrainResult trained = tapelm::train(r.config, corpus, out_dir, to);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.interrupted = trained.interrupted;
  if (r.interrupted) return r;  // the checkpoint of the last completed step is saved; --resume goes on
  // what was trained is evaluated as saved (rank 0 reads it; the others take its weights); the
  // storage the run took over goes first
  converted.reset();
  source.reset();
  release_cached_storage();  // the run's freed tensors, kept for reuse, go back before the checkpoint is read whole
  // one process: read with the frozen block weights narrowed as in training, one block at a time
  // (the checkpoint's values widen back exactly, so the loss is the float32 model's)
  std::unique_ptr<GPT> trained_model;
  if (lead) {
    const bool narrow = narrows_outside_training(r.config);
    const double params = static_cast<double>(model_cost(r.config.model).params);
    const double bytes = narrow ? (4 * params - 2 * expected_16bit_values(r.config, source_type, *o.variant.method)) / params : 4;
    trained_model = load_model(dir.checkpoint(), bytes, narrow ? frozen_weights_held_as(r.config, 1) : nullptr).model;
  }
  r.val_loss = evaluate_on_rank0_or_all(std::move(trained_model), corpus, r.config);
  return r;
}

}  // namespace tapelm
