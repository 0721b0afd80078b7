#include "train/study/uptrain.h"

#include "train/study/convert_model.h"

#include <chrono>
#include <cmath>
#include <filesystem>

#include "autograd/json_read.h"
#include "data/io.h"
#include "data/sampler.h"
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

UptrainResult uptrain(const std::string& from, const Corpus& corpus, const std::string& out_dir, const UptrainOptions& o) {
  if (o.resume && !fs::exists(RunDir(out_dir).checkpoint()))  // before converting, and before anything is made
    throw Error(ErrorKind::train, out_dir + ": resuming, but there is no checkpoint.h5 to resume from");
  // The run directory is locked before anything is read or converted: a second uptrain on the same
  // --out fails here, not after minutes of calibration and conversion.
  RunDir dir(out_dir);
  dir.prepare();
  // The run's teacher and starting point, by content: --resume with another model under --from (of
  // the same shape, or a GQA one) went on distilling from it, exit 0
  const std::string from_digest = formats::model_digest(from, "uptrain --from");
  if (o.resume) {
    H5File f = H5File::open_read(dir.checkpoint());
    const nlohmann::json extra =
        f.has_attr("/train", "extra") ? parse_json(f.read_attr_string("/train", "extra"), dir.checkpoint() + " /train extra", ErrorKind::checkpoint)
                                      : nlohmann::json::object();
    const std::string was = extra.is_object() && extra.contains("from_digest") && extra["from_digest"].is_string() ? extra["from_digest"].get<std::string>() : "";
    if (!was.empty() && was != from_digest)
      throw Error(ErrorKind::usage, "uptrain --resume: " + dir.checkpoint() + " was uptrained from a model of digest " + was + ", but --from " + from +
                                        " has digest " + from_digest + ": resume with the model the run began from");
  }
  std::unique_ptr<GPT> source = formats::open_model(from).load();  // a checkpoint, an HF directory or a GGUF file
  GPT& src = *source;
  const TrainConfig original = o.original ? *o.original : read_train_config(H5File::open_read(from));
  GPTConfig same = original.model;
  same.dropout = src.config().dropout;  // a training choice, not the model's
  if (!(same == src.config()))
    throw Error(ErrorKind::config, "uptrain: the training config's model differs from " + from + "'s");
  UptrainResult r;
  r.config = uptrain_config(original, o);
  r.steps = r.config.max_iters;
  Converted c = calibrate_and_convert(
      src, o.kv_heads, o.variant, o.seed,
      {.ids = corpus.train, .tokens = o.calib_tokens, .seed = o.calib_seed, .what = "calibration data (the train split)"});
  std::unique_ptr<GPT> converted = std::move(c.model);
  if (converted->config().per_layer_kv()) r.config.model.set_kv_heads(converted->config().layer_kv_heads);
  r.convert_seconds = c.seconds;
  const int64_t kv_heads_from = src.config().n_kv_head;
  // The source is the teacher of distillation and nothing else once converted: without one it is
  // freed here, not held beside the model being trained (a 1.3 B model's 5.4 GB).
  const bool teaching = o.distill_lambda > 0 || o.distill_attention > 0;
  if (!teaching) source.reset();
  r.loss_before = o.known_loss_before >= 0 ? o.known_loss_before : evaluate_split(*converted, corpus.val, false, r.config.final_eval_tokens);

  TrainOptions to;
  to.resume = o.resume;
  to.quiet = o.quiet;
  to.label = o.label;
  to.stop = o.stop;
  to.init_from = converted.get();  // its weights are taken over, not copied
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
    auto opt = r.config.make_optimizer(converted->named_parameters());
    TrainState st;
    st.extra_json = to.extra_json;
    st.dropout_rng = converted->dropout_rng().state();
    save_training_checkpoint(dir.checkpoint(), *converted, *opt, r.config, st, corpus.tok);
    r.val_loss = r.loss_before;
    return r;
  }
  tapelm::train(r.config, corpus, out_dir, to);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // what was trained is evaluated as saved; the storage the run took over goes first
  converted.reset();
  source.reset();
  std::unique_ptr<GPT> done = load_model(RunDir(out_dir).checkpoint()).model;
  r.val_loss = evaluate_split(*done, corpus.val, false, r.config.final_eval_tokens);
  return r;
}

}  // namespace tapelm
