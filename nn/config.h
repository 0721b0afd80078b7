#pragma once
// The model configuration of docs/formats.md §1, from and to JSON. Each key is declared once, in
// TAPELM_GPT_FIELDS: the struct's members, the key set, from_json, to_json and the simple range
// checks are all expanded from that one table (as PyTorch's TORCH_ARG declares an option once).
#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "autograd/error.h"
#include "autograd/names.h"
#include "autograd/quant.h"  // WeightType

namespace tapelm {

enum class NormKind { LayerNorm, RMSNorm, RMSNorm1p };
enum class PosKind { Learned, Rope };
enum class MlpKind { Gelu, GeluTanh, SwiGLU, Relu, GeGLU };
/// RMSNorm on the queries and keys after their projections, before RoPE: none, over each head
/// (Qwen3's q_norm/k_norm: one weight of hd values shared by the heads), or over the whole
/// projection (OLMo-2's: H·hd and KV·hd weights).
enum class QkNorm { none, head, all };
/// Where a block's two norms sit: before the attention and the MLP (GPT-2, Llama), or on their
/// outputs, before each residual add, with none on their inputs (OLMo-2).
enum class NormPosition { pre, post };

/// The JSON spelling of each value of a config enum (autograd/names.h); parsed once, when a config is read.
template <> struct EnumNames<NormKind> {
  static constexpr std::array<std::pair<NormKind, const char*>, 3> values{
      {{NormKind::LayerNorm, "layernorm"}, {NormKind::RMSNorm, "rmsnorm"}, {NormKind::RMSNorm1p, "rmsnorm_1p"}}};
};
template <> struct EnumNames<PosKind> {
  static constexpr std::array<std::pair<PosKind, const char*>, 2> values{
      {{PosKind::Learned, "learned"}, {PosKind::Rope, "rope"}}};
};
template <> struct EnumNames<MlpKind> {
  static constexpr std::array<std::pair<MlpKind, const char*>, 5> values{{{MlpKind::Gelu, "gelu"},
                                                                          {MlpKind::GeluTanh, "gelu_tanh"},
                                                                          {MlpKind::SwiGLU, "swiglu"},
                                                                          {MlpKind::Relu, "relu"},
                                                                          {MlpKind::GeGLU, "geglu"}}};
};

template <> struct EnumNames<QkNorm> {
  static constexpr std::array<std::pair<QkNorm, const char*>, 3> values{
      {{QkNorm::none, "none"}, {QkNorm::head, "head"}, {QkNorm::all, "all"}}};
};

template <> struct EnumNames<NormPosition> {
  static constexpr std::array<std::pair<NormPosition, const char*>, 2> values{{{NormPosition::pre, "pre"}, {NormPosition::post, "post"}}};
};

/// Range checks a table row can name; `any` checks nothing (validate() does the rest).
enum class Check { any, positive, non_negative, unit_interval };
/// The max column of a row that has no upper bound (floats, strings, enums).
struct NoMax {};
inline constexpr NoMax none{};
/// The largest value of a count key: a product of two counts stays far inside int64, so no
/// arithmetic on checked keys can overflow (memory checks compute in double).
inline constexpr int64_t count_max = 2147483647;

/// A JSON value as a message echoes it: scalars dumped and cut, arrays and objects by their size
/// (dumping them would recurse as deep as they nest).
std::string echo_json(const nlohmann::json& v);
/// Parses a config's JSON text; `what` (a file name, "--set key") starts each error. Rejects
/// nesting deeper than 16 levels (before any recursion) and a key repeated in one object.
nlohmann::json parse_config_json(const std::string& text, const std::string& what);
/// Configs are kilobytes: a file larger than this is refused unread.
inline constexpr int64_t max_config_bytes = 1 << 20;

/// The JSON object in a config file; a path that is not a regular file, a file over
/// max_config_bytes, bad JSON or a non-object is a config Error naming the file.
nlohmann::json read_config_file(const std::string& path);

/// Reads j[key] into out when the key is present; a value of the wrong JSON type is a
/// config Error naming the key (integers also accept floats with an integral value).
void config_get(const nlohmann::json& j, const std::string& key, int64_t& out);
void config_get(const nlohmann::json& j, const std::string& key, uint64_t& out);
void config_get(const nlohmann::json& j, const std::string& key, double& out);
void config_get(const nlohmann::json& j, const std::string& key, bool& out);
void config_get(const nlohmann::json& j, const std::string& key, std::string& out);
template <class E, class = decltype(EnumNames<E>::values)>
void config_get(const nlohmann::json& j, const std::string& key, E& out) {
  if (!j.contains(key)) return;
  std::string s, expected;
  config_get(j, key, s);
  for (const auto& [v, name] : EnumNames<E>::values) {
    if (s == name) {
      out = v;
      return;
    }
    expected += std::string(expected.empty() ? "" : " or ") + "\"" + name + "\"";
  }
  throw Error(ErrorKind::config, "config " + key + " must be " + expected + ", got \"" + cut_for_message(s) + "\"");
}
/// The JSON value of a config member (enums by name).
template <class T> nlohmann::json config_value(const T& v) {
  if constexpr (std::is_enum_v<T>) return to_string(v);
  else return v;
}
/// Throws a config Error naming the key when v breaks the row's check or exceeds its max.
void config_check(const char* key, double v, Check c);
void config_check(const char* key, int64_t v, Check c, int64_t max);
template <class T, class M> void config_check(const char* key, const T& v, Check c, M max) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    // uint64 keys hold at most INT64_MAX: config_get reads through int64
    config_check(key, static_cast<int64_t>(v), c, static_cast<int64_t>(max));
  } else if constexpr (std::is_arithmetic_v<T>) {
    config_check(key, static_cast<double>(v), c);
  }
}

// type, key, default, check, max. n_kv_head and mlp_hidden have derived defaults (n_head and
// 4·n_embd; the 4 and 512 below are those of the default config), which from_json fills in when
// the key is absent. mlp_hidden = 0 also stands for 4·n_embd; n_kv_head = 0 does not: it is
// rejected by validate() ("must be positive"), as n_kv_head must be >= 1 and divide n_head.
// n_embd's max keeps 4·n_embd a count.
// vocab_size: 2^20, past the largest subword vocabularies (Llama 3: 128,256); token shards hold
// uint16 ids up to 65,536 and llm.c's uint32 variant above.
#define TAPELM_GPT_FIELDS(X)                                      \
  X(int64_t, vocab_size, 65, positive, 1048576)                   \
  X(int64_t, block_size, 64, positive, count_max)                 \
  X(int64_t, n_layer, 4, positive, count_max)                     \
  X(int64_t, n_head, 4, positive, count_max)                      \
  X(int64_t, n_kv_head, 4, positive, count_max)                   \
  X(int64_t, n_embd, 128, positive, count_max / 4)                \
  X(int64_t, head_size, 0, non_negative, count_max / 4) /* each head's width when not n_embd / n_head (Qwen3, Gemma); 0: n_embd / n_head */ \
  X(int64_t, mlp_hidden, 512, positive, count_max)                \
  X(NormKind, norm, NormKind::LayerNorm, any, none)               \
  X(double, norm_eps, 1e-5, positive, none)                       \
  X(PosKind, pos, PosKind::Learned, any, none)                    \
  X(double, rope_theta, 10000.0, positive, none)                  \
  X(int64_t, rotary_dims, 0, non_negative, count_max) /* RoPE on each head's first dims only (GPT-NeoX); 0: the whole head */ \
  X(MlpKind, mlp, MlpKind::Gelu, any, none)                       \
  X(bool, bias, false, any, none)                                 \
  X(bool, qkv_bias, false, any, none)                             \
  X(bool, tie_embeddings, true, any, none)                        \
  X(double, embed_scale, 0.0, non_negative, none) /* token embeddings multiplied by it (Gemma's √d, rounded as its dtype rounds it); 0: not */ \
  X(NormPosition, norm_position, NormPosition::pre, any, none) /* ln1/ln2 before attention and MLP, or on their outputs (OLMo-2) */ \
  X(QkNorm, qk_norm, QkNorm::none, any, none) /* RMSNorm on q and k before RoPE (Qwen3: per head; OLMo-2: over the projection) */ \
  X(bool, parallel_residual, false, any, none) /* x + attn(ln1 x) + mlp(ln2 x) (GPT-NeoX); false: x + attn, then + mlp */ \
  X(double, dropout, 0.0, unit_interval, none)                    \
  X(std::string, family, "", any, none) /* the family other programs know it as, where its structure alone names another ("" otherwise: train/formats/families.h) */

struct GPTConfig {
#define TAPELM_MEMBER(type, key, def, check, max) type key = def;
  TAPELM_GPT_FIELDS(TAPELM_MEMBER)

  /// Key/value heads per layer when layers differ (the config's n_kv_head given as a list, one
  /// count per layer); empty when every layer has n_kv_head. When set, n_kv_head is their largest.
  std::vector<int64_t> layer_kv_heads;

  int64_t head_dim() const { return head_size > 0 ? head_size : n_embd / n_head; }
  /// The MLP is gated, down(act(gate x) · up x): SwiGLU or GeGLU.
  bool gated() const { return mlp == MlpKind::SwiGLU || mlp == MlpKind::GeGLU; }
  /// The dims of each head RoPE rotates (the whole head unless rotary_dims says fewer).
  int64_t rope_dims() const { return rotary_dims > 0 ? rotary_dims : head_dim(); }
  /// Layer l's key/value heads.
  int64_t kv_heads(int64_t l) const { return layer_kv_heads.empty() ? n_kv_head : layer_kv_heads.at(static_cast<size_t>(l)); }
  /// The key/value heads of every layer together.
  int64_t total_kv_heads() const;
  bool per_layer_kv() const { return !layer_kv_heads.empty(); }
  /// Sets each layer's count; counts all equal make the config uniform again (n_kv_head that count).
  void set_kv_heads(const std::vector<int64_t>& per_layer);
  /// The config layer l is built with: its own n_kv_head, no list.
  GPTConfig layer(int64_t l) const;
  /// "2", or "4,2,2,1" per layer.
  std::string kv_heads_str() const;
  /// The config's n_kv_head value: 2, or [4, 2, 2, 1] per layer.
  nlohmann::json kv_heads_json() const;
  /// Reads every key of docs/formats.md §1 (all optional; n_kv_head defaults to n_head, mlp_hidden to
  /// 4·n_embd); an unknown key or a value of the wrong type is a config Error. Validates.
  static GPTConfig from_json(const nlohmann::json& j);
  static GPTConfig from_json_string(const std::string& s);
  /// Every key, with derived defaults filled in.
  nlohmann::json to_json() const;
  /// Throws config Error naming the first bad value.
  void validate() const;
  /// The keys this config understands.
  static bool is_key(const std::string& k);
  bool operator==(const GPTConfig&) const = default;
};

}  // namespace tapelm
