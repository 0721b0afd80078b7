#include "nn/config.h"

#include <set>

namespace tapelm {

namespace {
const std::set<std::string> kKeys = {"vocab_size", "block_size", "n_layer",  "n_head", "n_kv_head",
                                     "n_embd",     "mlp_hidden", "norm",     "norm_eps", "pos",
                                     "rope_theta", "mlp",        "bias",     "tie_embeddings", "dropout"};

}  // namespace

namespace {
[[noreturn]] void bad_type(const std::string& k, const char* want, const nlohmann::json& v) {
  throw ConfigError("config key '" + k + "' must be " + want + ", got " + v.dump());
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

bool GPTConfig::is_key(const std::string& k) { return kKeys.count(k) > 0; }

GPTConfig GPTConfig::from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw ConfigError("model config must be a JSON object, got " + j.dump());
  for (const auto& [k, v] : j.items())
    if (!is_key(k)) throw ConfigError("unknown model config key '" + k + "'");
  GPTConfig c;
  config_get(j, "vocab_size", c.vocab_size);
  config_get(j, "block_size", c.block_size);
  config_get(j, "n_layer", c.n_layer);
  config_get(j, "n_head", c.n_head);
  c.n_kv_head = c.n_head;
  config_get(j, "n_kv_head", c.n_kv_head);
  config_get(j, "n_embd", c.n_embd);
  c.mlp_hidden = 4 * c.n_embd;
  config_get(j, "mlp_hidden", c.mlp_hidden);
  if (c.mlp_hidden == 0) c.mlp_hidden = 4 * c.n_embd;  // 0 means the default, as in the reference
  config_get(j, "norm", c.norm);
  config_get(j, "norm_eps", c.norm_eps);
  config_get(j, "pos", c.pos);
  config_get(j, "rope_theta", c.rope_theta);
  config_get(j, "mlp", c.mlp);
  config_get(j, "bias", c.bias);
  config_get(j, "tie_embeddings", c.tie_embeddings);
  config_get(j, "dropout", c.dropout);
  c.validate();
  return c;
}

GPTConfig GPTConfig::from_json_string(const std::string& s) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(s);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError(std::string("model config is not valid JSON: ") + e.what());
  }
  return from_json(j);
}

nlohmann::json GPTConfig::to_json() const {
  return {{"vocab_size", vocab_size}, {"block_size", block_size}, {"n_layer", n_layer},
          {"n_head", n_head},         {"n_kv_head", n_kv_head},   {"n_embd", n_embd},
          {"mlp_hidden", mlp_hidden}, {"norm", norm},             {"norm_eps", norm_eps},
          {"pos", pos},               {"rope_theta", rope_theta}, {"mlp", mlp},
          {"bias", bias},             {"tie_embeddings", tie_embeddings}, {"dropout", dropout}};
}

void GPTConfig::validate() const {
  auto positive = [](const char* k, int64_t v) {
    if (v <= 0) throw ConfigError(std::string("config ") + k + " must be positive, got " + std::to_string(v));
  };
  positive("vocab_size", vocab_size);
  positive("block_size", block_size);
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_kv_head", n_kv_head);
  positive("n_embd", n_embd);
  positive("mlp_hidden", mlp_hidden);
  if (vocab_size > 65536) throw ConfigError("config vocab_size " + std::to_string(vocab_size) + " exceeds 65536 (uint16 token files)");
  if (n_embd % n_head != 0)
    throw ConfigError("config n_embd " + std::to_string(n_embd) + " is not divisible by n_head " + std::to_string(n_head));
  if (n_head % n_kv_head != 0)
    throw ConfigError("config n_head " + std::to_string(n_head) + " is not divisible by n_kv_head " + std::to_string(n_kv_head));
  if (norm != "layernorm" && norm != "rmsnorm") throw ConfigError("config norm must be \"layernorm\" or \"rmsnorm\", got \"" + norm + "\"");
  if (pos != "learned" && pos != "rope") throw ConfigError("config pos must be \"learned\" or \"rope\", got \"" + pos + "\"");
  if (mlp != "gelu" && mlp != "swiglu") throw ConfigError("config mlp must be \"gelu\" or \"swiglu\", got \"" + mlp + "\"");
  if (pos == "rope" && head_dim() % 2 != 0)
    throw ConfigError("config pos \"rope\" needs an even head dim, got " + std::to_string(head_dim()));
  if (!(norm_eps > 0)) throw ConfigError("config norm_eps must be positive, got " + std::to_string(norm_eps));
  if (!(rope_theta > 0)) throw ConfigError("config rope_theta must be positive, got " + std::to_string(rope_theta));
  if (!(dropout >= 0 && dropout < 1)) throw ConfigError("config dropout must be in [0, 1), got " + std::to_string(dropout));
}

}  // namespace tapelm
