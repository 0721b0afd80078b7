#pragma once
// The training configuration (SPEC.md §4): the model keys of §1 plus the optimisation keys,
// from one flat JSON object with `--set key=value` overrides; unknown keys are rejected.
#include <string>
#include <vector>

#include "nn/config.h"
#include "optim/optim.h"

namespace tapelm {

struct TrainConfig {
  GPTConfig model;
  int64_t batch_size = 12;
  int64_t max_iters = 2000;
  double learning_rate = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_iters = 100;
  int64_t lr_decay_iters = 2000;
  bool decay_lr = true;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double eps = 1e-8;
  double momentum = 0.9;  // SGD only
  bool nesterov = false;  // SGD only
  double grad_clip = 1.0; // 0: off
  int64_t grad_accum = 1;
  std::string optimizer = "adamw";
  int64_t eval_interval = 250;
  int64_t eval_iters = 20;
  int64_t log_interval = 10;
  int64_t checkpoint_interval = 500;
  uint64_t seed = 1337;
  int64_t threads = 0;        // 0: all cores
  double peak_flops = 0;      // for MFU; 0: measure this machine's sgemm peak

  /// From a JSON object (model keys and training keys side by side). Validates.
  static TrainConfig from_json(const nlohmann::json& j);
  /// Applies "key=value" overrides (value parsed as JSON, else taken as a string) to a JSON object.
  static void apply_overrides(nlohmann::json& j, const std::vector<std::string>& sets);
  nlohmann::json to_json() const;
  void validate() const;
  LrSchedule schedule() const;
  /// The hyper-parameters of the chosen optimizer, in the form tapelm::make_optimizer reads.
  std::string optimizer_hparams_json() const;
  /// The optimizer this config describes, over the given parameters (via tapelm::make_optimizer).
  std::unique_ptr<Optimizer> make_optimizer(const NamedParams& params) const;
};

}  // namespace tapelm
