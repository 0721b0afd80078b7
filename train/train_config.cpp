#include "train/train_config.h"

#include <set>

namespace tapelm {

namespace {
const std::set<std::string> kTrainKeys = {
    "batch_size", "max_iters", "learning_rate", "min_lr",     "warmup_iters",  "lr_decay_iters",
    "decay_lr",   "weight_decay", "beta1",      "beta2",      "eps",           "momentum",
    "nesterov",   "grad_clip", "grad_accum",    "optimizer",  "eval_interval", "eval_iters",
    "log_interval", "checkpoint_interval", "seed", "threads", "peak_flops"};

}  // namespace

TrainConfig TrainConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw ConfigError("training config must be a JSON object, got " + j.dump());
  nlohmann::json model = nlohmann::json::object();
  for (const auto& [k, v] : j.items()) {
    if (GPTConfig::is_key(k)) model[k] = v;
    else if (!kTrainKeys.count(k)) throw ConfigError("unknown config key '" + k + "'");
  }
  TrainConfig c;
  c.model = GPTConfig::from_json(model);
  config_get(j, "batch_size", c.batch_size);
  config_get(j, "max_iters", c.max_iters);
  config_get(j, "learning_rate", c.learning_rate);
  config_get(j, "min_lr", c.min_lr);
  config_get(j, "warmup_iters", c.warmup_iters);
  c.lr_decay_iters = c.max_iters;
  config_get(j, "lr_decay_iters", c.lr_decay_iters);
  config_get(j, "decay_lr", c.decay_lr);
  config_get(j, "weight_decay", c.weight_decay);
  config_get(j, "beta1", c.beta1);
  config_get(j, "beta2", c.beta2);
  config_get(j, "eps", c.eps);
  config_get(j, "momentum", c.momentum);
  config_get(j, "nesterov", c.nesterov);
  config_get(j, "grad_clip", c.grad_clip);
  config_get(j, "grad_accum", c.grad_accum);
  config_get(j, "optimizer", c.optimizer);
  config_get(j, "eval_interval", c.eval_interval);
  config_get(j, "eval_iters", c.eval_iters);
  config_get(j, "log_interval", c.log_interval);
  config_get(j, "checkpoint_interval", c.checkpoint_interval);
  int64_t seed = static_cast<int64_t>(c.seed);
  config_get(j, "seed", seed);
  if (seed < 0) throw ConfigError("config seed must be >= 0, got " + std::to_string(seed));
  c.seed = static_cast<uint64_t>(seed);
  config_get(j, "threads", c.threads);
  config_get(j, "peak_flops", c.peak_flops);
  c.validate();
  return c;
}

void TrainConfig::apply_overrides(nlohmann::json& j, const std::vector<std::string>& sets) {
  for (const std::string& s : sets) {
    const auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) throw ConfigError("--set expects key=value, got '" + s + "'");
    const std::string k = s.substr(0, eq), v = s.substr(eq + 1);
    if (!GPTConfig::is_key(k) && !kTrainKeys.count(k)) throw ConfigError("unknown config key '" + k + "' in --set");
    try {
      j[k] = nlohmann::json::parse(v);
    } catch (const nlohmann::json::parse_error&) {
      j[k] = v;  // a bare word such as rmsnorm
    }
  }
}

nlohmann::json TrainConfig::to_json() const {
  nlohmann::json j = model.to_json();
  j["batch_size"] = batch_size;
  j["max_iters"] = max_iters;
  j["learning_rate"] = learning_rate;
  j["min_lr"] = min_lr;
  j["warmup_iters"] = warmup_iters;
  j["lr_decay_iters"] = lr_decay_iters;
  j["decay_lr"] = decay_lr;
  j["weight_decay"] = weight_decay;
  j["beta1"] = beta1;
  j["beta2"] = beta2;
  j["eps"] = eps;
  j["momentum"] = momentum;
  j["nesterov"] = nesterov;
  j["grad_clip"] = grad_clip;
  j["grad_accum"] = grad_accum;
  j["optimizer"] = optimizer;
  j["eval_interval"] = eval_interval;
  j["eval_iters"] = eval_iters;
  j["log_interval"] = log_interval;
  j["checkpoint_interval"] = checkpoint_interval;
  j["seed"] = seed;
  j["threads"] = threads;
  j["peak_flops"] = peak_flops;
  return j;
}

void TrainConfig::validate() const {
  model.validate();
  auto pos = [](const char* k, int64_t v) {
    if (v <= 0) throw ConfigError(std::string("config ") + k + " must be positive, got " + std::to_string(v));
  };
  pos("batch_size", batch_size);
  pos("grad_accum", grad_accum);
  pos("eval_interval", eval_interval);
  pos("eval_iters", eval_iters);
  pos("log_interval", log_interval);
  pos("checkpoint_interval", checkpoint_interval);
  if (max_iters < 0) throw ConfigError("config max_iters must be >= 0, got " + std::to_string(max_iters));
  if (warmup_iters < 0) throw ConfigError("config warmup_iters must be >= 0, got " + std::to_string(warmup_iters));
  if (!(learning_rate > 0)) throw ConfigError("config learning_rate must be positive, got " + std::to_string(learning_rate));
  if (!(min_lr >= 0)) throw ConfigError("config min_lr must be >= 0, got " + std::to_string(min_lr));
  if (!(grad_clip >= 0)) throw ConfigError("config grad_clip must be >= 0, got " + std::to_string(grad_clip));
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
    throw ConfigError("config beta1 and beta2 must be in [0, 1)");
  if (optimizer != "adamw" && optimizer != "sgd")
    throw ConfigError("config optimizer must be \"adamw\" or \"sgd\", got \"" + optimizer + "\"");
  if (threads < 0) throw ConfigError("config threads must be >= 0, got " + std::to_string(threads));
}

LrSchedule TrainConfig::schedule() const {
  LrSchedule s;
  s.lr = learning_rate;
  s.min_lr = min_lr;
  s.warmup_iters = warmup_iters;
  s.lr_decay_iters = lr_decay_iters;
  s.decay = decay_lr;
  return s;
}

std::string TrainConfig::optimizer_hparams_json() const {
  // Only the keys of the chosen optimizer: make_optimizer rejects the others' (SGD's dampening
  // is not a config key and stays at its default 0). JSON doubles round-trip exactly.
  nlohmann::json j{{"lr", learning_rate}, {"weight_decay", weight_decay}};
  if (optimizer == "sgd") {
    j["momentum"] = momentum;
    j["nesterov"] = nesterov;
  } else {
    j["beta1"] = beta1;
    j["beta2"] = beta2;
    j["eps"] = eps;
  }
  return j.dump();
}

std::unique_ptr<Optimizer> TrainConfig::make_optimizer(const NamedParams& params) const {
  return tapelm::make_optimizer(optimizer, params, optimizer_hparams_json());
}

}  // namespace tapelm
