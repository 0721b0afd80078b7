#pragma once
// The model configuration of SPEC.md §1, from and to JSON.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace tapelm {

/// A bad configuration: unknown key, wrong type or a value the model cannot take.
struct ConfigError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// Reads j[key] into out when the key is present; a value of the wrong JSON type is a
/// ConfigError naming the key (integers also accept floats with an integral value).
void config_get(const nlohmann::json& j, const std::string& key, int64_t& out);
void config_get(const nlohmann::json& j, const std::string& key, double& out);
void config_get(const nlohmann::json& j, const std::string& key, bool& out);
void config_get(const nlohmann::json& j, const std::string& key, std::string& out);

struct GPTConfig {
  int64_t vocab_size = 65;
  int64_t block_size = 64;
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_kv_head = 4;
  int64_t n_embd = 128;
  int64_t mlp_hidden = 512;  // 4 * n_embd unless given
  std::string norm = "layernorm";
  double norm_eps = 1e-5;
  std::string pos = "learned";
  double rope_theta = 10000.0;
  std::string mlp = "gelu";
  bool bias = false;
  bool tie_embeddings = true;
  double dropout = 0.0;

  int64_t head_dim() const { return n_embd / n_head; }
  /// Reads every key of SPEC.md §1 (all optional; n_kv_head defaults to n_head, mlp_hidden to
  /// 4·n_embd); an unknown key or a value of the wrong type is a ConfigError. Validates.
  static GPTConfig from_json(const nlohmann::json& j);
  static GPTConfig from_json_string(const std::string& s);
  /// Every key, with derived defaults filled in.
  nlohmann::json to_json() const;
  /// Throws ConfigError naming the first bad value.
  void validate() const;
  /// The keys this config understands.
  static bool is_key(const std::string& k);
  bool operator==(const GPTConfig&) const = default;
};

}  // namespace tapelm
