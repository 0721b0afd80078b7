#include "nn/config.h"

#include <cmath>

namespace tapelm {

namespace {
[[noreturn]] void bad_type(const std::string& k, const char* want, const nlohmann::json& v) {
  throw Error(ErrorKind::config, "config key '" + k + "' must be " + want + ", got " + v.dump());
}

std::string number_str(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  return std::to_string(v);
}
}  // namespace

void config_get(const nlohmann::json& j, const std::string& k, int64_t& out) {
  if (!j.contains(k)) return;
  const auto& v = j.at(k);
  if (v.is_number_integer()) out = v.get<int64_t>();
  else if (v.is_number_float() && v.get<double>() == static_cast<double>(static_cast<int64_t>(v.get<double>())))
    out = static_cast<int64_t>(v.get<double>());
  else bad_type(k, "an integer", v);
}

void config_get(const nlohmann::json& j, const std::string& k, uint64_t& out) {
  if (!j.contains(k)) return;
  int64_t v = 0;
  config_get(j, k, v);
  if (v < 0) throw Error(ErrorKind::config, "config " + k + " must be >= 0, got " + std::to_string(v));
  out = static_cast<uint64_t>(v);
}

void config_get(const nlohmann::json& j, const std::string& k, double& out) {
  if (!j.contains(k)) return;
  if (!j.at(k).is_number()) bad_type(k, "a number", j.at(k));
  out = j.at(k).get<double>();
}

void config_get(const nlohmann::json& j, const std::string& k, bool& out) {
  if (!j.contains(k)) return;
  if (!j.at(k).is_boolean()) bad_type(k, "true or false", j.at(k));
  out = j.at(k).get<bool>();
}

void config_get(const nlohmann::json& j, const std::string& k, std::string& out) {
  if (!j.contains(k)) return;
  if (!j.at(k).is_string()) bad_type(k, "a string", j.at(k));
  out = j.at(k).get<std::string>();
}

void config_check(const char* k, double v, Check c) {
  const std::string key(k);
  switch (c) {
    case Check::any: return;
    case Check::positive:
      if (!(v > 0)) throw Error(ErrorKind::config, "config " + key + " must be positive, got " + number_str(v));
      return;
    case Check::non_negative:
      if (!(v >= 0)) throw Error(ErrorKind::config, "config " + key + " must be >= 0, got " + number_str(v));
      return;
    case Check::unit_interval:
      if (!(v >= 0 && v < 1)) throw Error(ErrorKind::config, "config " + key + " must be in [0, 1), got " + number_str(v));
      return;
  }
}

bool GPTConfig::is_key(const std::string& k) {
#define TAPELM_IS_KEY(type, key, def, check) \
  if (k == #key) return true;
  TAPELM_GPT_FIELDS(TAPELM_IS_KEY)
#undef TAPELM_IS_KEY
  return false;
}

GPTConfig GPTConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw Error(ErrorKind::config, "model config must be a JSON object, got " + j.dump());
  for (const auto& [k, v] : j.items())
    if (!is_key(k)) throw Error(ErrorKind::config, "unknown model config key '" + k + "'");
  GPTConfig c;
#define TAPELM_GET(type, key, def, check) config_get(j, #key, c.key);
  TAPELM_GPT_FIELDS(TAPELM_GET)
#undef TAPELM_GET
  if (!j.contains("n_kv_head")) c.n_kv_head = c.n_head;
  if (!j.contains("mlp_hidden") || c.mlp_hidden == 0) c.mlp_hidden = 4 * c.n_embd;  // 0: the default, as in the reference
  c.validate();
  return c;
}

GPTConfig GPTConfig::from_json_string(const std::string& s) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(s);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ErrorKind::config, std::string("model config is not valid JSON: ") + e.what());
  }
  return from_json(j);
}

nlohmann::json GPTConfig::to_json() const {
  nlohmann::json j = nlohmann::json::object();
#define TAPELM_PUT(type, key, def, check) j[#key] = config_value(key);
  TAPELM_GPT_FIELDS(TAPELM_PUT)
#undef TAPELM_PUT
  return j;
}

void GPTConfig::validate() const {
#define TAPELM_CHECK(type, key, def, check) \
  config_check(#key, key, Check::check);
  TAPELM_GPT_FIELDS(TAPELM_CHECK)
#undef TAPELM_CHECK
  if (vocab_size > 65536) throw Error(ErrorKind::config, "config vocab_size " + std::to_string(vocab_size) + " exceeds 65536 (uint16 token files)");
  if (n_embd % n_head != 0)
    throw Error(ErrorKind::config, "config n_embd " + std::to_string(n_embd) + " is not divisible by n_head " + std::to_string(n_head));
  if (n_head % n_kv_head != 0)
    throw Error(ErrorKind::config, "config n_head " + std::to_string(n_head) + " is not divisible by n_kv_head " + std::to_string(n_kv_head));
  if (pos == PosKind::Rope && head_dim() % 2 != 0)
    throw Error(ErrorKind::config, "config pos \"rope\" needs an even head dim, got " + std::to_string(head_dim()));
}

}  // namespace tapelm
