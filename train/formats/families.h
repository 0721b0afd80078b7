#pragma once
// The architecture families other programs run with the function tapelm's GPT computes, one row
// each (families.cpp): the family's structure (norm, positions, MLP, biases, fused q|k|v, RoPE's
// row order in GGUF), its tensor names where they differ from the base naming of a format (the
// rows of layout.cpp, as gguf-py's tensor_mapping.py lists a role's names), its config keys in
// each format, its aliases, and the few checks of its config no key expresses. The adapters
// (hf.cpp, gguf.cpp, llama2c.cpp) read and write any row; none branches on a family.
//
// A new family with known structure is an enum value and a row; a new structure (a transform of
// the rows, a norm, a position scheme) is code in the model and in layout.cpp first.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "autograd/error.h"
#include "nn/config.h"

namespace tapelm::formats {

/// The model formats whose tensors the table names.
enum class Format { tapelm, hf, gguf, llama2c };

/// The families (one row each in families.cpp).
enum class Family { llama, qwen2, gpt2, phi3, gptneox, opt, qwen3, olmo2, gemma };

/// What a tensor is in the model. The roles of a layer are listed in the order HF and GGUF write them.
enum class Role {
  tok_embd, pos_embd, attn_norm, attn_q, attn_k, attn_v, attn_qkv, attn_out, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate_up, ffn_gate,
  ffn_up, ffn_down,
  output_norm, output, rope_cos, rope_sin
};

/// A family's name for a role in one format in place of the base naming's (layout.cpp), without
/// ".weight"/".bias"; {L} is the layer, {P} the family's optional HF prefix.
struct NameOverride {
  Format format;
  Role role;
  const char* name;
};

/// config.json's key for a size, and its value when the key is absent or null: -1 the key is
/// required; 0 (feed-forward size only) four times the hidden size.
struct HfKey {
  const char* key;
  int64_t fallback = -1;
};

/// What the family's config.json checks beyond its keys: reads (and refuses) what only this family
/// has, naming the file. Set on c: anything the keys do not.
class HfJson {
 public:
  HfJson(const nlohmann::json& j, const std::string& what) : j_(j), what_(what) {}
  /// The key is there and not null.
  bool has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }
  /// j[key] into out with config_get's type checks (nothing when absent), errors naming the file.
  template <class T> void get(const std::string& key, T& out) const {
    try {
      config_get(j_, key, out);
    } catch (const Error& e) {
      refuse(e.what());
    }
  }
  const nlohmann::json& json() const { return j_; }
  /// A config Error: "<file>: why".
  [[noreturn]] void refuse(const std::string& why) const { throw Error(ErrorKind::config, what_ + ": " + why); }

 private:
  const nlohmann::json& j_;
  const std::string& what_;
};

/// How a family reads and writes config.json.
struct HfConfigKeys {
  const char* model_type;                        // config.json's model_type
  HfKey vocab, hidden, layers, heads, ffn, positions;
  const char* kv_heads = "";                     // "": the config has none (one K/V head per query head)
  const char* head_dim = "";                     // "": none (hidden / heads)
  int64_t head_dim_fallback = 0;                 // head_dim when the key is absent or null: 0 hidden / heads (Qwen3's is 128)
  const char* eps;
  double eps_fallback;
  const char* act;                               // the activation's key
  std::vector<std::pair<const char*, MlpKind>> acts;  // its values read (the first written for each kind); the first is the fallback
  bool tie_fallback = false;                     // tie_word_embeddings when absent
  const char* prefix = "";                       // a prefix some files put before the names ({P}), written always
  void (*read)(const HfJson& j, const std::string& architecture, GPTConfig& c) = nullptr;  // the family's own checks
  void (*write)(const GPTConfig& c, nlohmann::ordered_json& j) = nullptr;                  // its own keys, after the sizes
};

/// How a family is written in GGUF (the keys are "<architecture>.<key>", as llama.cpp names them).
struct GgufKeys {
  const char* eps;                               // the norm's epsilon key
  bool rope = false;                             // rope.freq_base, rope.dimension_count (and vocab_size) are written
  const char* per_layer_kv_arch = "";            // the architecture llama.cpp runs per-layer KV heads as ("" none)
  MlpKind gelu = MlpKind::GeluTanh;              // the GELU llama.cpp computes for a family without the gated MLP
  bool optional_bias = false;                    // biases on every projection or none, told by blk.0.attn_output.bias
  bool no_window_key = false;                    // attention.sliding_window written as 0 (none): older llama.cpp assumed one
  bool none = false;                             // llama.cpp has no architecture for the family (OPT): refused in GGUF
  bool norm_plus_one = false;                    // the norms' weights stored as 1 + w (llama.cpp's gemma: convert_hf_to_gguf adds 1)
};

/// A family: its structure, decided once, and its names in other programs.
struct FamilyInfo {
  Family family;
  const char* name;                              // "llama", "qwen2", "gpt2": the GGUF architecture too
  const char* hf_architecture;                   // config.json's architectures[0]
  std::vector<std::pair<const char*, const char*>> hf_aliases;  // other (architecture, model_type) pairs read as this family
  NormKind norm;
  PosKind pos;
  bool swiglu = false;                           // the gated MLP (else GELU, exact or tanh, or ReLU)
  bool relu = false;                             // the MLP's activation is ReLU (OPT), and no GELU
  bool geglu = false;                            // the gated MLP with the tanh GELU (Gemma)
  bool embed_scale = false;                      // token embeddings multiplied by √d (Gemma: rounded as the model's dtype rounds it)
  bool qkv_bias_only = false;                    // biases on q, k and v only (Qwen2)
  bool all_biases = false;                       // every projection and norm carries a bias: zeros when the model has none
  bool unbiased = false;                         // no projection carries a bias (Phi-3)
  QkNorm qk_norm = QkNorm::none;                 // RMSNorm of q and k before RoPE (Qwen3: per head; OLMo-2: over the projection)
  NormPosition norm_position = NormPosition::pre;  // the block's norms on the sublayers' outputs (OLMo-2)
  bool fused_qkv = false;                        // q|k|v stored as one tensor in HF and GGUF
  bool fused_gate_up = false;                    // the gated MLP's gate|up stored as one tensor in HF and GGUF
  bool gguf_interleaves_rope = false;            // llama.cpp rotates this family's q/k rows in interleaved pairs
  bool hf_conv1d = false;                        // HF holds its matrices [in, out] (GPT-2's Conv1D), embeddings and head aside
  bool hf_qkv_per_head = false;                  // HF's fused q|k|v interleaves them head by head (GPT-NeoX: q₀ k₀ v₀ q₁ …)
  bool parallel_residual = false;                // the family has a key for parallel_residual (GPT-NeoX's use_parallel_residual)
  bool partial_rotary = false;                   // the family has a key for rotary_dims (GPT-NeoX's rotary_pct)
  int64_t hf_position_offset = 0;                // HF's position table has this many rows before position 0 (OPT's 2)
  std::vector<NameOverride> names;
  HfConfigKeys hf;
  GgufKeys gguf;
};

/// Every family, in the order messages list them.
const std::vector<FamilyInfo>& families();
/// The row of a family.
const FamilyInfo& family_info(Family f);
/// The family whose name (or HF architecture, or model_type, or an alias's) is `name`, or null.
const FamilyInfo* find_family(const std::string& name);
/// The family a tapelm config is: the one its `family` key names (which must have its structure),
/// else the first whose structure it has; or a config Error starting with `what` naming why there
/// is none.
Family family_of(const GPTConfig& c, const std::string& what);
/// The `family` key a config of family f read from another program's file takes: "" when its
/// structure names f already, else f's name (Phi-3 has Llama's structure).
std::string family_key(Family f, const GPTConfig& c);
/// The embedding scales a family with `embed_scale` accepts: √d rounded to float32, bfloat16 or
/// float16 (transformers multiplies by √d in the model's dtype; llama.cpp by sqrtf(d)).
bool is_sqrt_d(double scale, int64_t d);
/// √d as a model of that torch dtype ("bfloat16", "float16", else float32) multiplies by it.
double sqrt_d_as(int64_t d, const std::string& torch_dtype);
/// c with the keys the family fixes set (norm, pos, mlp kind, biases, and `family` where the
/// structure names another), as an importer starts from.
void apply_family(Family f, GPTConfig& c);

}  // namespace tapelm::formats
