#include "nn/config.h"

#include "autograd/json_read.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <fstream>
#include <filesystem>
#include <vector>

namespace tapelm {

namespace {
[[noreturn]] void bad_type(const std::string& k, const char* want, const nlohmann::json& v) {
  throw Error(ErrorKind::config, "config key '" + k + "' must be " + want + ", got " + echo_json(v));
}

std::string number_str(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<int64_t>(v));
  return std::to_string(v);
}

// Deeper than any config needs, shallow enough that nothing recursing over a value can overflow the stack.
constexpr int max_json_depth = 16;
}  // namespace

std::string echo_json(const nlohmann::json& v) {
  if (v.is_array()) return "an array of " + std::to_string(v.size()) + " elements";
  if (v.is_object()) return "an object of " + std::to_string(v.size()) + " keys";
  return cut_for_message(v.dump());
}

nlohmann::json parse_config_json(const std::string& text, const std::string& what) {
  return parse_json(text, what, ErrorKind::config, max_json_depth, true);
}

void config_get(const nlohmann::json& j, const std::string& k, int64_t& out) {
  if (!j.contains(k)) return;
  const auto& v = j.at(k);
  constexpr double two63 = 9223372036854775808.0;
  const bool too_big = (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) ||
                       (v.is_number_float() && !(std::fabs(v.get<double>()) < two63));
  if (too_big) throw Error(ErrorKind::config, "config " + k + " is out of range, got " + echo_json(v));
  if (v.is_number_integer()) out = v.get<int64_t>();
  else if (v.is_number_float() && v.get<double>() == std::trunc(v.get<double>()))
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

void config_check(const char* k, int64_t v, Check c, int64_t max) {
  config_check(k, static_cast<double>(v), c);
  if (v > max)
    throw Error(ErrorKind::config, "config " + std::string(k) + " must be at most " + std::to_string(max) + ", got " +
                    std::to_string(v));
}

bool GPTConfig::is_key(const std::string& k) {
#define TAPELM_IS_KEY(type, key, def, check, max) \
  if (k == #key) return true;
  TAPELM_GPT_FIELDS(TAPELM_IS_KEY)
#undef TAPELM_IS_KEY
  return false;
}

int64_t GPTConfig::total_kv_heads() const {
  if (!per_layer_kv()) return n_kv_head * n_layer;  // no loop: a config's n_layer may be any count up to 2^31
  int64_t n = 0;
  for (int64_t k : layer_kv_heads) n += k;
  return n;
}

void GPTConfig::set_kv_heads(const std::vector<int64_t>& per_layer) {
  if (per_layer.empty()) throw Error(ErrorKind::config, "config n_kv_head: an empty list");
  n_kv_head = *std::max_element(per_layer.begin(), per_layer.end());
  const bool uniform = std::all_of(per_layer.begin(), per_layer.end(), [&](int64_t k) { return k == per_layer[0]; });
  layer_kv_heads = uniform ? std::vector<int64_t>{} : per_layer;
}

GPTConfig GPTConfig::layer(int64_t l) const {
  GPTConfig c = *this;
  c.n_kv_head = kv_heads(l);
  c.layer_kv_heads.clear();
  return c;
}

std::string GPTConfig::kv_heads_str() const {
  if (!per_layer_kv()) return std::to_string(n_kv_head);
  std::string s;
  for (int64_t k : layer_kv_heads) s += (s.empty() ? "" : ",") + std::to_string(k);
  return s;
}

nlohmann::json GPTConfig::kv_heads_json() const {
  return per_layer_kv() ? nlohmann::json(layer_kv_heads) : nlohmann::json(n_kv_head);
}

namespace {

/// n_kv_head given as a list: one count per layer, each an integer (checked against the model by validate()).
std::vector<int64_t> kv_heads_list(const nlohmann::json& v) {
  if (v.size() > static_cast<size_t>(count_max)) throw Error(ErrorKind::config, "config n_kv_head: " + echo_json(v));
  std::vector<int64_t> out;
  for (size_t i = 0; i < v.size(); i++) {
    int64_t k = 0;
    config_get(nlohmann::json{{"n_kv_head[" + std::to_string(i) + "]", v[i]}}, "n_kv_head[" + std::to_string(i) + "]", k);
    config_check(("n_kv_head[" + std::to_string(i) + "]").c_str(), k, Check::positive, count_max);
    out.push_back(k);
  }
  return out;
}

}  // namespace

GPTConfig GPTConfig::from_json(const nlohmann::json& j_in) {
  if (!j_in.is_object()) throw Error(ErrorKind::config, "model config must be a JSON object, got " + echo_json(j_in));
  for (const auto& [k, v] : j_in.items())
    if (!is_key(k)) throw Error(ErrorKind::config, "unknown model config key '" + cut_for_message(k) + "'");
  // n_kv_head as a list: a count per layer
  const bool per_layer = j_in.contains("n_kv_head") && j_in["n_kv_head"].is_array();
  nlohmann::json stripped;
  if (per_layer) (stripped = j_in).erase("n_kv_head");
  const nlohmann::json& j = per_layer ? stripped : j_in;
  GPTConfig c;
#define TAPELM_GET(type, key, def, check, max) config_get(j, #key, c.key);
  TAPELM_GPT_FIELDS(TAPELM_GET)
#undef TAPELM_GET
  if (per_layer) c.set_kv_heads(kv_heads_list(j_in["n_kv_head"]));
  else if (!j.contains("n_kv_head")) c.n_kv_head = c.n_head;
  if (!j.contains("mlp_hidden") || c.mlp_hidden == 0) {  // 0: the default, as in the reference
    config_check("n_embd", c.n_embd, Check::positive, count_max / 4);  // before 4·n_embd can overflow
    c.mlp_hidden = 4 * c.n_embd;
  }
  c.validate();
  return c;
}

GPTConfig GPTConfig::from_json_string(const std::string& s) { return from_json(parse_config_json(s, "model config")); }

nlohmann::json GPTConfig::to_json() const {
  nlohmann::json j = nlohmann::json::object();
#define TAPELM_PUT(type, key, def, check, max) j[#key] = config_value(key);
  TAPELM_GPT_FIELDS(TAPELM_PUT)
#undef TAPELM_PUT
  j["n_kv_head"] = kv_heads_json();
  // most configs: named by their structure, rotating whole heads, one residual after the other, as
  // before these keys were
  if (family.empty()) j.erase("family");
  if (rotary_dims == 0) j.erase("rotary_dims");
  if (!parallel_residual) j.erase("parallel_residual");
  if (head_size == 0) j.erase("head_size");
  if (qk_norm == QkNorm::none) j.erase("qk_norm");
  if (norm_position == NormPosition::pre) j.erase("norm_position");
  if (embed_scale == 0) j.erase("embed_scale");
  return j;
}

void GPTConfig::validate() const {
#define TAPELM_CHECK(type, key, def, check, max) \
  config_check(#key, key, Check::check, max);
  TAPELM_GPT_FIELDS(TAPELM_CHECK)
#undef TAPELM_CHECK
  if (family.size() > 32 || !std::all_of(family.begin(), family.end(), [](char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9'); }))
    throw Error(ErrorKind::config, "config family must be a family's name (lowercase letters and digits), got " + echo_json(family));
  if (head_size == 0 && n_embd % n_head != 0)
    throw Error(ErrorKind::config, "config n_embd " + std::to_string(n_embd) + " is not divisible by n_head " + std::to_string(n_head));
  if (per_layer_kv()) {
    if (static_cast<int64_t>(layer_kv_heads.size()) != n_layer)
      throw Error(ErrorKind::config, "config n_kv_head lists " + std::to_string(layer_kv_heads.size()) + " layers' key/value heads for n_layer " +
                                         std::to_string(n_layer));
    for (size_t l = 0; l < layer_kv_heads.size(); l++)
      if (layer_kv_heads[l] <= 0 || n_head % layer_kv_heads[l] != 0)
        throw Error(ErrorKind::config, "config n_head " + std::to_string(n_head) + " is not divisible by n_kv_head[" + std::to_string(l) +
                                           "] " + std::to_string(layer_kv_heads[l]));
    if (n_kv_head != *std::max_element(layer_kv_heads.begin(), layer_kv_heads.end()))
      throw Error(ErrorKind::internal, "config n_kv_head is not the largest of its per-layer counts");
  }
  if (n_head % n_kv_head != 0)
    throw Error(ErrorKind::config, "config n_head " + std::to_string(n_head) + " is not divisible by n_kv_head " + std::to_string(n_kv_head));
  if (pos == PosKind::Rope && head_dim() % 2 != 0)
    throw Error(ErrorKind::config, "config pos \"rope\" needs an even head dim, got " + std::to_string(head_dim()));
  if (parallel_residual && norm_position == NormPosition::post)
    throw Error(ErrorKind::config, "config parallel_residual with norm_position \"post\": the parallel block normalises its input");
  if (rotary_dims != 0 && pos != PosKind::Rope)
    throw Error(ErrorKind::config, "config rotary_dims " + std::to_string(rotary_dims) + " with pos \"" + to_string(pos) + "\": only RoPE rotates");
  if (rotary_dims % 2 != 0 || rotary_dims > head_dim())
    throw Error(ErrorKind::config, "config rotary_dims " + std::to_string(rotary_dims) + " must be even and at most the head dim " +
                                       std::to_string(head_dim()));
}

nlohmann::json read_config_file(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) throw Error(ErrorKind::config, path + ": cannot read the config file (no such file)");
  if (!std::filesystem::is_regular_file(st)) throw Error(ErrorKind::config, path + ": the config is not a regular file");
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size > static_cast<uintmax_t>(max_config_bytes))
    throw Error(ErrorKind::config, path + ": the config file is " + std::to_string(size) + " bytes, over the " +
                                       std::to_string(max_config_bytes) + " a config may have");
  std::ifstream in(path);
  if (!in) throw Error(ErrorKind::config, path + ": cannot read the config file");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = parse_config_json(text.str(), path);
  if (!j.is_object()) throw Error(ErrorKind::config, path + ": the config must be a JSON object");
  return j;
}

}  // namespace tapelm
