#include "train/train_config.h"


namespace tapelm {

namespace {
bool is_train_key(const std::string& k) {
#define TAPELM_IS_KEY(type, key, def, check) \
  if (k == #key) return true;
  TAPELM_TRAIN_FIELDS(TAPELM_IS_KEY)
#undef TAPELM_IS_KEY
  return false;
}
}  // namespace

TrainConfig TrainConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw Error(ErrorKind::config, "training config must be a JSON object, got " + j.dump());
  nlohmann::json model = nlohmann::json::object();
  for (const auto& [k, v] : j.items()) {
    if (GPTConfig::is_key(k)) model[k] = v;
    else if (!is_train_key(k)) throw Error(ErrorKind::config, "unknown config key '" + k + "'");
  }
  TrainConfig c;
  c.model = GPTConfig::from_json(model);
#define TAPELM_GET(type, key, def, check) config_get(j, #key, c.key);
  TAPELM_TRAIN_FIELDS(TAPELM_GET)
#undef TAPELM_GET
  if (!j.contains("lr_decay_iters")) c.lr_decay_iters = c.max_iters;
  c.validate();
  return c;
}

void TrainConfig::apply_overrides(nlohmann::json& j, const std::vector<std::string>& sets) {
  for (const std::string& s : sets) {
    const auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0) throw Error(ErrorKind::config, "--set expects key=value, got '" + s + "'");
    const std::string k = s.substr(0, eq), v = s.substr(eq + 1);
    if (!GPTConfig::is_key(k) && !is_train_key(k)) throw Error(ErrorKind::config, "unknown config key '" + k + "' in --set");
    try {
      j[k] = nlohmann::json::parse(v);
    } catch (const nlohmann::json::parse_error&) {
      j[k] = v;  // a bare word such as rmsnorm
    }
  }
}

nlohmann::json TrainConfig::to_json() const {
  nlohmann::json j = model.to_json();
#define TAPELM_PUT(type, key, def, check) j[#key] = config_value(key);
  TAPELM_TRAIN_FIELDS(TAPELM_PUT)
#undef TAPELM_PUT
  return j;
}

void TrainConfig::validate() const {
  model.validate();
#define TAPELM_CHECK(type, key, def, check) \
  config_check(#key, key, Check::check);
  TAPELM_TRAIN_FIELDS(TAPELM_CHECK)
#undef TAPELM_CHECK
  if (optimizer != "adamw" && optimizer != "sgd")
    throw Error(ErrorKind::config, "config optimizer must be \"adamw\" or \"sgd\", got \"" + optimizer + "\"");
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
