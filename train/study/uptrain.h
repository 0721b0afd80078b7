#pragma once
// Uptraining (Ainslie et al. 2023, §2.1): convert an MHA (or GQA) checkpoint to fewer key/value
// heads, then continue training for a fraction α of the original run's steps with the original
// run's training config. The optimizer starts fresh (K and V change shape).
#include <optional>
#include <string>

#include "autograd/error.h"
#include "train/study/convert/convert.h"
#include "train/trainer.h"
#include "train/train_config.h"

namespace tapelm {

enum class UptrainSchedule {
  Rewarm,    // short warmup, then cosine to min_lr over the uptraining steps
  Continue,  // the original run's final learning rate, constant
};
UptrainSchedule parse_uptrain_schedule(const std::string& s);
std::string to_string(UptrainSchedule s);

/// --distill's λ when not given (docs/guide/uptraining.md: measured on the tiny study).
inline constexpr double kDefaultDistillLambda = 0.5;

struct UptrainOptions {
  int64_t kv_heads = 1;           // grouping per-layer: this count's budget, placed layer by layer (budget.h)
  Variant variant;                // conversion method and grouping
  int64_t calib_tokens = 16384;  // calibration tokens from the corpus's train split (aligned, fit, similar)
  uint64_t calib_seed = 0;       // which windows: fixed, so every seed of a study converts alike
  double fraction = 0.05;  // α; 0: convert and evaluate only
  UptrainSchedule schedule = UptrainSchedule::Rewarm;
  std::optional<double> lr;  // rewarm: the peak (unset: the original run's peak × rewarm_scale); continue: ignored
  double rewarm_scale = 0.5;  // re-warming a converged model to its full peak undoes part of its training
  uint64_t seed = 1;       // batches, dropout, and the random conversion
  bool resume = false;
  bool quiet = false;
  std::string label;
  double known_loss_before = -1;  // >= 0: the converted model's val loss, already measured
  StopToken stop;                 // requested: save after the current step and return
  // The original run's training config when the source is weights only (an imported model);
  // unset: the source's own /train config.
  std::optional<TrainConfig> original;
  /// The precision of the uptraining run (autograd/autocast.h); unset: the original run's.
  std::optional<Precision> precision;
  /// The loss before and after on the val split's first this many tokens (0: all); unset: the
  /// original run's final_eval_tokens.
  std::optional<int64_t> eval_tokens;
  /// The parameters uptrained (all, the attention projections, or the new key and value
  /// projections only); the others stay as converted.
  Trainable trainable = Trainable::all;
  /// Distillation from the source model as the teacher: loss (1 − λ)·CE + λ·T²·KL(source ‖
  /// converted) on every batch (autograd/ops.h, distill_kl); λ = 0: plain uptraining.
  double distill_lambda = 0;
  double distill_temperature = 2.0;
  /// β of the per-layer attention-output term (train/trainer.h, micro_batch_loss); 0: off.
  double distill_attention = 0;
};

struct UptrainResult {
  int64_t steps = 0;          // α × the original max_iters
  double val_loss = 0;        // on the val split (its first final_eval_tokens when set), non-overlapping windows
  double loss_before = 0;     // the converted model before any uptraining, same windows
  double seconds = 0;         // training wall time
  double convert_seconds = 0; // conversion wall time, calibration included
  int64_t narrowed_values = 0; // frozen block weights held in 16 bits from the conversion on (frozen_weights; one process)
  TrainConfig config;         // what the uptraining ran with
  bool interrupted = false;   // stopped by a signal (on any rank): no final evaluation, --resume goes on
};

/// The config uptraining runs with, from the original run's. A fraction outside [0, 10] or a
/// given learning rate that is not positive and finite is a usage Error naming the value.
TrainConfig uptrain_config(const TrainConfig& original, const UptrainOptions& o);

/// Converts `from`, uptrains into out_dir (checkpoint.h5, metrics.jsonl) and evaluates.
UptrainResult uptrain(const std::string& from, const Corpus& corpus, const std::string& out_dir, const UptrainOptions& o);


}  // namespace tapelm
