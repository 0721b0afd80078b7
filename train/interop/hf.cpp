#include "train/interop/hf.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <unordered_set>

#include "autograd/error.h"
#include "data/io.h"
#include "data/tokenizer/tokenizer.h"
#include "data/tokenizer/sentencepiece.h"
#include "data/tokenizer/bytebpe/byte_bpe.h"
#include "train/interop/hf_tokenizer.h"
#include "nn/accounting.h"
#include "nn/gpt.h"
#include "train/checkpoint/checkpoint.h"
#include "train/interop/safetensors.h"
#include "train/train_config.h"

namespace tapelm::hf {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

[[noreturn]] void refuse(const std::string& what, const std::string& why) { throw Error(ErrorKind::config, what + ": " + why); }

// Reads j[key] with config_get's type checks, naming the file in the error.
template <class T> void get(const json& j, const std::string& key, T& out, const std::string& what) {
  try {
    config_get(j, key, out);
  } catch (const Error& e) {
    refuse(what, e.what());
  }
}

bool present(const json& j, const std::string& key) { return j.contains(key) && !j[key].is_null(); }

std::string arch_of(const json& j, const std::string& what) {
  if (j.contains("architectures")) {
    const json& a = j["architectures"];
    if (!a.is_array() || a.empty() || !a[0].is_string())
      refuse(what, "architectures must be a list of names, got " + echo_json(a));
    return a[0].get<std::string>();
  }
  std::string mt;
  get(j, "model_type", mt, what);
  if (mt == "llama") return "LlamaForCausalLM";
  if (mt == "mistral") return "MistralForCausalLM";
  if (mt == "qwen2") return "Qwen2ForCausalLM";
  if (mt == "gpt2") return "GPT2LMHeadModel";
  refuse(what, mt.empty() ? "names neither architectures nor model_type" : "model_type \"" + cut_for_message(mt) + "\" is not one tapelm reads");
}

void llama_like(const json& j, HfConfig& h, const std::string& what) {
  GPTConfig& c = h.config;
  const bool qwen = h.architecture == "Qwen2ForCausalLM";
  c.norm = NormKind::RMSNorm;
  c.mlp = MlpKind::SwiGLU;
  c.pos = PosKind::Rope;
  c.tie_embeddings = false;
  for (const char* k : {"hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size"})
    if (!j.contains(k)) refuse(what, std::string("has no ") + k);
  get(j, "vocab_size", c.vocab_size, what);
  get(j, "hidden_size", c.n_embd, what);
  get(j, "num_hidden_layers", c.n_layer, what);
  get(j, "num_attention_heads", c.n_head, what);
  c.n_kv_head = c.n_head;
  if (present(j, "num_key_value_heads")) get(j, "num_key_value_heads", c.n_kv_head, what);
  if (c.n_kv_head <= 0 || c.n_head % c.n_kv_head != 0)
    refuse(what, "num_key_value_heads " + std::to_string(c.n_kv_head) + " does not divide num_attention_heads " + std::to_string(c.n_head));
  get(j, "intermediate_size", c.mlp_hidden, what);
  c.norm_eps = 1e-6;
  get(j, "rms_norm_eps", c.norm_eps, what);
  c.block_size = 2048;
  get(j, "max_position_embeddings", c.block_size, what);
  get(j, "tie_word_embeddings", c.tie_embeddings, what);
  std::string act = "silu";
  get(j, "hidden_act", act, what);
  if (act != "silu") refuse(what, "hidden_act \"" + cut_for_message(act) + "\": tapelm's gated MLP uses silu");
  c.rope_theta = 10000.0;
  get(j, "rope_theta", c.rope_theta, what);
  if (present(j, "rope_scaling")) refuse(what, "rope_scaling " + echo_json(j["rope_scaling"]) + ": tapelm's RoPE has no scaling");
  if (present(j, "rope_parameters")) {  // transformers 5's spelling of rope_theta and rope_scaling
    const json& r = j["rope_parameters"];
    if (!r.is_object()) refuse(what, "rope_parameters must be an object, got " + echo_json(r));
    for (auto it = r.begin(); it != r.end(); ++it) {
      if (it.key() == "rope_theta") get(r, "rope_theta", c.rope_theta, what);
      else if (it.key() == "rope_type") {
        std::string t;
        get(r, "rope_type", t, what);
        if (t != "default") refuse(what, "rope_parameters.rope_type \"" + cut_for_message(t) + "\": tapelm's RoPE has no scaling");
      } else {
        refuse(what, "rope_parameters." + cut_for_message(it.key()) + " " + echo_json(it.value()) + ": tapelm's RoPE has no scaling");
      }
    }
  }
  if (present(j, "partial_rotary_factor")) {
    double f = 1;
    get(j, "partial_rotary_factor", f, what);
    if (f != 1) refuse(what, "partial_rotary_factor " + echo_json(j["partial_rotary_factor"]) + ": tapelm rotates the whole head");
  }
  if (present(j, "head_dim")) {
    int64_t hd = 0;
    get(j, "head_dim", hd, what);
    if (c.n_head <= 0 || hd * c.n_head != c.n_embd)
      refuse(what, "head_dim " + std::to_string(hd) + " is not hidden_size / num_attention_heads (" + std::to_string(c.n_embd) +
                       " / " + std::to_string(c.n_head) + ")");
  }
  if (present(j, "quantization_config")) refuse(what, "quantization_config: a quantized model (tapelm reads F32, F16 and BF16)");
  // A sliding window at least as long as the context never applies.
  bool sliding = !qwen || (present(j, "use_sliding_window") && j["use_sliding_window"] == true);
  if (qwen) get(j, "use_sliding_window", sliding, what);
  if (sliding && present(j, "sliding_window")) {
    int64_t w = 0;
    get(j, "sliding_window", w, what);
    if (w < c.block_size)
      refuse(what, "sliding_window " + std::to_string(w) + " is shorter than the context (max_position_embeddings " +
                       std::to_string(c.block_size) + "): tapelm attends over the whole context");
  }
  if (qwen) {
    c.qkv_bias = true;
  } else {
    bool attn_bias = false, mlp_bias = false;
    get(j, "attention_bias", attn_bias, what);
    get(j, "mlp_bias", mlp_bias, what);
    if (attn_bias != mlp_bias)
      refuse(what, std::string("attention_bias ") + (attn_bias ? "true" : "false") + " with mlp_bias " + (mlp_bias ? "true" : "false") +
                       ": tapelm's bias puts biases on every projection or none (Qwen2's q/k/v biases are qkv_bias)");
    c.bias = attn_bias;
  }
}

void gpt2(const json& j, HfConfig& h, const std::string& what) {
  GPTConfig& c = h.config;
  c.norm = NormKind::LayerNorm;
  c.pos = PosKind::Learned;
  c.bias = true;
  c.tie_embeddings = true;
  // GPT2Config's defaults: the 124M model
  c.vocab_size = 50257;
  c.block_size = 1024;
  c.n_embd = 768;
  c.n_layer = 12;
  c.n_head = 12;
  get(j, "vocab_size", c.vocab_size, what);
  get(j, "n_positions", c.block_size, what);
  get(j, "n_embd", c.n_embd, what);
  get(j, "n_layer", c.n_layer, what);
  get(j, "n_head", c.n_head, what);
  c.n_kv_head = c.n_head;
  c.mlp_hidden = 4 * c.n_embd;
  if (present(j, "n_inner")) get(j, "n_inner", c.mlp_hidden, what);
  c.norm_eps = 1e-5;
  get(j, "layer_norm_epsilon", c.norm_eps, what);
  get(j, "tie_word_embeddings", c.tie_embeddings, what);
  std::string act = "gelu_new";
  get(j, "activation_function", act, what);
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") c.mlp = MlpKind::GeluTanh;
  else if (act == "gelu") c.mlp = MlpKind::Gelu;
  else refuse(what, "activation_function \"" + cut_for_message(act) + "\": tapelm has GELU (exact, or tanh as gelu_new)");
  bool scale = true, by_layer = false, cross = false;
  get(j, "scale_attn_weights", scale, what);
  get(j, "scale_attn_by_inverse_layer_idx", by_layer, what);
  get(j, "add_cross_attention", cross, what);
  if (!scale) refuse(what, "scale_attn_weights false: tapelm scales scores by 1/sqrt(head dim)");
  if (by_layer) refuse(what, "scale_attn_by_inverse_layer_idx true: tapelm scales every layer's scores alike");
  if (cross) refuse(what, "add_cross_attention true: tapelm's blocks have no cross-attention");
}

}  // namespace

HfConfig parse_config(const json& j, const std::string& what) {
  if (!j.is_object()) refuse(what, "is not a JSON object");
  HfConfig h;
  h.architecture = arch_of(j, what);
  if (h.architecture == "LlamaForCausalLM" || h.architecture == "MistralForCausalLM" || h.architecture == "Qwen2ForCausalLM")
    llama_like(j, h, what);
  else if (h.architecture == "GPT2LMHeadModel")
    gpt2(j, h, what);
  else
    refuse(what, "architecture \"" + cut_for_message(h.architecture) +
                     "\" is not one tapelm reads (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPT2LMHeadModel)");
  h.config.dropout = 0;
  for (const char* k : {"bos_token_id", "eos_token_id"}) {
    if (!present(j, k)) continue;
    const json& v = j[k];
    int64_t id = -1;
    if (v.is_array()) {  // several EOS ids (Llama 3.1): the first is the one tapelm uses
      if (!v.empty()) get(json{{k, v[0]}}, k, id, what);
    } else {
      get(j, k, id, what);
    }
    (std::string(k) == "bos_token_id" ? h.bos_token_id : h.eos_token_id) = id;
  }
  try {
    h.config.validate();
  } catch (const Error& e) {
    refuse(what, e.what());
  }
  return h;
}

HfConfig read_config(const std::string& path) { return parse_config(read_config_file(path), "HF config " + path); }

std::string architecture_for(const GPTConfig& c, const std::string& what) {
  if (c.norm == NormKind::RMSNorm && c.mlp == MlpKind::SwiGLU && c.pos == PosKind::Rope)
    return c.qkv_bias && !c.bias ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
  if (c.norm == NormKind::LayerNorm && c.mlp != MlpKind::SwiGLU && c.pos == PosKind::Learned) {
    if (c.n_kv_head != c.n_head)
      refuse(what, std::to_string(c.n_kv_head) + " key/value heads for " + std::to_string(c.n_head) +
                       " query heads: GPT-2's layout (learned positions, LayerNorm, GELU) has no HF config with fewer KV heads");
    if (c.qkv_bias && !c.bias) refuse(what, "qkv_bias without bias: GPT-2's layout has biases everywhere or (written as zeros) nowhere");
    return "GPT2LMHeadModel";
  }
  refuse(what, "norm \"" + to_string(c.norm) + "\", mlp \"" + to_string(c.mlp) + "\", pos \"" + to_string(c.pos) +
                   "\" match no HF architecture tapelm writes (Llama: rmsnorm, swiglu, rope; GPT-2: layernorm, gelu, learned)");
}

nlohmann::ordered_json config_json(const GPTConfig& c, const std::string& arch, const std::string& torch_dtype, int64_t bos,
                                   int64_t eos) {
  nlohmann::ordered_json j;
  j["architectures"] = {arch};
  auto ids = [&] {
    if (bos >= 0) j["bos_token_id"] = bos;
    if (eos >= 0) j["eos_token_id"] = eos;
  };
  if (arch == "GPT2LMHeadModel") {
    j["model_type"] = "gpt2";
    j["vocab_size"] = c.vocab_size;
    j["n_positions"] = c.block_size;
    j["n_embd"] = c.n_embd;
    j["n_layer"] = c.n_layer;
    j["n_head"] = c.n_head;
    j["n_inner"] = c.mlp_hidden;
    j["activation_function"] = c.mlp == MlpKind::GeluTanh ? "gelu_new" : "gelu";
    j["layer_norm_epsilon"] = c.norm_eps;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
    j["scale_attn_weights"] = true;
    j["scale_attn_by_inverse_layer_idx"] = false;
    j["reorder_and_upcast_attn"] = false;
    j["initializer_range"] = 0.02;
  } else {
    const bool qwen = arch == "Qwen2ForCausalLM";
    j["model_type"] = qwen ? "qwen2" : "llama";
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.n_embd;
    j["intermediate_size"] = c.mlp_hidden;
    j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = c.n_head;
    j["num_key_value_heads"] = c.n_kv_head;
    j["head_dim"] = c.head_dim();
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = c.block_size;
    j["rms_norm_eps"] = c.norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = nullptr;
    if (qwen) {
      j["use_sliding_window"] = false;
      j["sliding_window"] = nullptr;
      j["max_window_layers"] = c.n_layer;
    } else {
      j["attention_bias"] = c.bias;
      j["mlp_bias"] = c.bias;
      j["pretraining_tp"] = 1;
    }
    j["attention_dropout"] = 0.0;
    j["initializer_range"] = 0.02;
  }
  j["tie_word_embeddings"] = c.tie_embeddings;
  ids();
  j["use_cache"] = true;
  j["torch_dtype"] = torch_dtype;
  return j;
}

namespace {

// One HF tensor and where its values live in tapelm's model: `parts` stacked along their first
// dimension form the nn.Linear-oriented matrix [out, in] (or a vector), which the file stores
// transposed, [in, out], when `transpose` (GPT-2's Conv1D).
struct Slot {
  std::string name;
  std::vector<int64_t> shape;  // as stored in the file
  bool transpose = false;
  std::vector<Tensor> parts;
};

void add(std::vector<Slot>& s, std::string name, std::vector<Tensor> parts, bool transpose = false) {
  int64_t rows = 0;
  for (const Tensor& t : parts) rows += t.shape()[0];
  std::vector<int64_t> shape{rows};
  if (parts[0].ndim() == 2) shape.push_back(parts[0].shape()[1]);
  if (transpose) std::swap(shape[0], shape[1]);
  s.push_back({std::move(name), std::move(shape), transpose, std::move(parts)});
}

// The tensors of `arch` for model m, with `prefix` before GPT-2's transformer names.
std::vector<Slot> slots(const GPT& m, const std::string& arch, const std::string& prefix) {
  std::vector<Slot> s;
  const GPTConfig& c = m.config();
  auto bias = [](const std::shared_ptr<Linear>& l) { return l->bias.defined(); };
  if (arch == "GPT2LMHeadModel") {
    add(s, prefix + "wte.weight", {m.wte->weight.val()});
    add(s, prefix + "wpe.weight", {m.wpe->weight.val()});
    for (int64_t i = 0; i < c.n_layer; i++) {
      const Block& b = *m.blocks[i];
      const std::string p = prefix + "h." + std::to_string(i) + ".";
      add(s, p + "ln_1.weight", {b.ln1->weight.val()});
      add(s, p + "ln_1.bias", {b.ln1->bias.val()});
      add(s, p + "attn.c_attn.weight", {b.attn->wq->weight.val(), b.attn->wk->weight.val(), b.attn->wv->weight.val()}, true);
      add(s, p + "attn.c_attn.bias", {b.attn->wq->bias.val(), b.attn->wk->bias.val(), b.attn->wv->bias.val()});
      add(s, p + "attn.c_proj.weight", {b.attn->wo->weight.val()}, true);
      add(s, p + "attn.c_proj.bias", {b.attn->wo->bias.val()});
      add(s, p + "ln_2.weight", {b.ln2->weight.val()});
      add(s, p + "ln_2.bias", {b.ln2->bias.val()});
      add(s, p + "mlp.c_fc.weight", {b.mlp->fc->weight.val()}, true);
      add(s, p + "mlp.c_fc.bias", {b.mlp->fc->bias.val()});
      add(s, p + "mlp.c_proj.weight", {b.mlp->proj->weight.val()}, true);
      add(s, p + "mlp.c_proj.bias", {b.mlp->proj->bias.val()});
    }
    add(s, prefix + "ln_f.weight", {m.ln_f->weight.val()});
    add(s, prefix + "ln_f.bias", {m.ln_f->bias.val()});
    if (!c.tie_embeddings) add(s, "lm_head.weight", {m.lm_head.val()});
    return s;
  }
  add(s, "model.embed_tokens.weight", {m.wte->weight.val()});
  for (int64_t i = 0; i < c.n_layer; i++) {
    const Block& b = *m.blocks[i];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(s, p + "input_layernorm.weight", {b.ln1->weight.val()});
    const std::pair<const char*, std::shared_ptr<Linear>> attn[] = {
        {"q_proj", b.attn->wq}, {"k_proj", b.attn->wk}, {"v_proj", b.attn->wv}, {"o_proj", b.attn->wo}};
    for (const auto& [n, l] : attn) {
      add(s, p + "self_attn." + n + ".weight", {l->weight.val()});
      if (bias(l)) add(s, p + "self_attn." + n + ".bias", {l->bias.val()});
    }
    add(s, p + "post_attention_layernorm.weight", {b.ln2->weight.val()});
    const std::pair<const char*, std::shared_ptr<Linear>> mlp[] = {
        {"gate_proj", b.mlp->gate}, {"up_proj", b.mlp->up}, {"down_proj", b.mlp->down}};
    for (const auto& [n, l] : mlp) {
      add(s, p + "mlp." + n + ".weight", {l->weight.val()});
      if (bias(l)) add(s, p + "mlp." + n + ".bias", {l->bias.val()});
    }
  }
  add(s, "model.norm.weight", {m.ln_f->weight.val()});
  if (!c.tie_embeddings) add(s, "lm_head.weight", {m.lm_head.val()});
  return s;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); i++) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// Buffers the file's layout of the matrix the parts form (or hands out the part itself).
const float* file_layout(const Slot& s, std::deque<std::vector<float>>& keep) {
  if (s.parts.size() == 1 && !s.transpose) return s.parts[0].data();
  std::vector<float> m;
  for (const Tensor& t : s.parts) m.insert(m.end(), t.data(), t.data() + t.numel());
  if (s.transpose) {  // m is [out, in]; the file wants [in, out] = shape
    const int64_t in = s.shape[0], out = s.shape[1];
    std::vector<float> t(m.size());
    for (int64_t o = 0; o < out; o++)
      for (int64_t i = 0; i < in; i++) t[i * out + o] = m[o * in + i];
    m.swap(t);
  }
  keep.push_back(std::move(m));
  return keep.back().data();
}

// Stores the file's values (in its layout) into the parts.
void from_file_layout(const Slot& s, const float* v) {
  std::vector<float> m;
  if (s.transpose) {
    const int64_t in = s.shape[0], out = s.shape[1];
    m.resize(static_cast<size_t>(in * out));
    for (int64_t i = 0; i < in; i++)
      for (int64_t o = 0; o < out; o++) m[o * in + i] = v[i * out + o];
    v = m.data();
  }
  for (const Tensor& t : s.parts) {
    std::memcpy(const_cast<float*>(t.data()), v, static_cast<size_t>(t.numel()) * sizeof(float));
    v += t.numel();
  }
}

// Tensors a file may hold that are no parameter: GPT-2's causal-mask buffers, old Llama files'
// RoPE frequencies.
bool ignorable(const std::string& name) {
  auto ends = [&](const std::string& suffix) {
    return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias") || ends(".rotary_emb.inv_freq");
}

// A plain file name inside the model directory (an index naming "../x" or "/etc/x" is refused).
std::string shard_path(const std::string& dir, const std::string& name, const std::string& index) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
    throw Error(ErrorKind::data, index + ": weight_map names \"" + cut_for_message(name) + "\", not a file name in " + dir);
  return (fs::path(dir) / name).string();
}

std::optional<Tokenizer> read_tokenizer(const std::string& dir, std::string& file) {
  const fs::path spm = fs::path(dir) / "tokenizer.model";
  if (fs::exists(spm)) {
    file = spm.string();
    return SentencePiece::load(read_file_bytes(file, "sentencepiece model"));
  }
  for (const char* name : {"tokenizer.json", "vocab.json"}) {  // byte-level BPE
    const fs::path p = fs::path(dir) / name;
    if (fs::exists(p)) {
      file = p.string();
      return hf::read_tokenizer_file(file);
    }
  }
  file.clear();
  return std::nullopt;
}

}  // namespace

ImportResult import_model(const std::string& dir, const std::string& out) {
  if (!fs::is_directory(dir)) throw Error(ErrorKind::data, "HF model directory " + dir + ": not a directory");
  ImportResult r;
  r.hf = read_config((fs::path(dir) / "config.json").string());
  const GPTConfig& cfg = r.hf.config;

  // The weight files: one model.safetensors, or the shards an index names.
  const fs::path single = fs::path(dir) / "model.safetensors", index = fs::path(dir) / "model.safetensors.index.json";
  std::map<std::string, std::string> weight_map;  // tensor -> file, from the index
  if (fs::exists(single) || !fs::exists(index)) {
    r.weight_files.push_back(single.string());
  } else {
    const json j = read_config_file(index.string());
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(ErrorKind::data, index.string() + ": has no weight_map object");
    std::set<std::string> files;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        throw Error(ErrorKind::data, index.string() + ": weight_map." + cut_for_message(it.key()) + " is not a file name");
      const std::string p = shard_path(dir, it.value().get<std::string>(), index.string());
      weight_map[it.key()] = p;
      if (files.insert(p).second) r.weight_files.push_back(p);
    }
    if (r.weight_files.empty()) throw Error(ErrorKind::data, index.string() + ": weight_map names no tensor");
  }
  std::vector<safetensors::File> files;
  for (const std::string& p : r.weight_files) files.push_back(safetensors::File::open(p));

  // Every tensor of every file, once; the index (when there is one) must agree.
  std::map<std::string, std::pair<const safetensors::File*, const safetensors::TensorInfo*>> have;
  std::set<std::string> dtypes;
  for (const safetensors::File& f : files)
    for (const safetensors::TensorInfo& t : f.tensors()) {
      if (!have.emplace(t.name, std::make_pair(&f, &t)).second)
        throw Error(ErrorKind::data, "safetensors file " + f.path() + ": tensor '" + cut_for_message(t.name) + "' is also in " +
                                         have[t.name].first->path());
      if (!weight_map.empty()) {
        auto w = weight_map.find(t.name);
        if (w == weight_map.end() || w->second != f.path())
          throw Error(ErrorKind::data, index.string() + ": " + (w == weight_map.end() ? "does not name tensor '" : "puts tensor '") +
                                           cut_for_message(t.name) + "'" + (w == weight_map.end() ? "" : " in " + w->second) +
                                           ", which " + f.path() + " holds");
      }
    }

  const ModelCost cost = model_cost(cfg);
  check_memory(4.0 * static_cast<double>(cost.params), available_memory_bytes(),
               "HF model " + dir + " (" + std::to_string(cost.params) + " parameters in float32)");
  GPT model(cfg);
  model.eval();
  std::string prefix;
  if (r.hf.architecture == "GPT2LMHeadModel" && have.count("transformer.wte.weight")) prefix = "transformer.";
  const std::vector<Slot> want = slots(model, r.hf.architecture, prefix);
  std::set<std::string> used;
  std::vector<float> buf;
  for (const Slot& s : want) {
    auto it = have.find(s.name);
    if (it == have.end())
      throw Error(ErrorKind::data, "HF model " + dir + ": no tensor '" + s.name + "' (" + r.hf.architecture + " " + shape_str(s.shape) +
                                       ") in " + (r.weight_files.size() == 1 ? r.weight_files[0] : "its safetensors shards"));
    const auto& [f, t] = it->second;
    if (t->shape != s.shape)
      throw Error(ErrorKind::data, "safetensors file " + f->path() + ": tensor '" + s.name + "' has shape " + shape_str(t->shape) +
                                       ", config.json makes it " + shape_str(s.shape));
    buf.resize(static_cast<size_t>(t->numel()));
    f->read_f32(*t, buf.data());
    from_file_layout(s, buf.data());
    used.insert(s.name);
    dtypes.insert(t->dtype);
  }
  for (const auto& [name, ft] : have) {
    if (used.count(name) || ignorable(name)) continue;
    // A tied head stored anyway must be the embedding itself.
    const std::string emb = r.hf.architecture == "GPT2LMHeadModel" ? prefix + "wte.weight" : "model.embed_tokens.weight";
    if (name == "lm_head.weight" && cfg.tie_embeddings) {
      const auto& [f, t] = ft;
      const auto& [ef, et] = have.at(emb);
      if (t->shape == et->shape && t->dtype == et->dtype && f->bytes(*t) == ef->bytes(*et)) continue;
      throw Error(ErrorKind::data, "safetensors file " + f->path() + ": lm_head.weight differs from " + emb +
                                       " but config.json ties them (tie_word_embeddings)");
    }
    throw Error(ErrorKind::data, "safetensors file " + ft.first->path() + ": tensor '" + cut_for_message(name) + "' has no place in " +
                                     r.hf.architecture + " as config.json describes it");
  }
  for (const std::string& d : dtypes) r.dtypes += (r.dtypes.empty() ? "" : ", ") + d;

  const std::optional<Tokenizer> tok = read_tokenizer(dir, r.tokenizer_file);
  if (tok && tok->vocab_size() > cfg.vocab_size)
    throw Error(ErrorKind::data, r.tokenizer_file + ": " + std::to_string(tok->vocab_size()) + " tokens, more than the model's vocab_size " +
                                     std::to_string(cfg.vocab_size));
  nlohmann::json from{{"format", "hf"}, {"architecture", r.hf.architecture}, {"dtype", r.dtypes}};
  if (r.hf.bos_token_id >= 0) from["bos_token_id"] = r.hf.bos_token_id;
  if (r.hf.eos_token_id >= 0) from["eos_token_id"] = r.hf.eos_token_id;
  write_imported(out, model, tok ? &*tok : nullptr, from.dump(), {});
  return r;
}

ExportResult export_model(const std::string& checkpoint, const std::string& dir, const std::string& dtype, uint64_t max_shard_bytes) {
  static const std::map<std::string, std::pair<std::string, std::string>> dtypes{
      {"f32", {"F32", "float32"}}, {"bf16", {"BF16", "bfloat16"}}, {"f16", {"F16", "float16"}}};
  auto dt = dtypes.find(dtype);
  if (dt == dtypes.end()) throw Error(ErrorKind::usage, "dtype \"" + dtype + "\": HF export writes f32, bf16 or f16");
  if (fs::exists(dir) && !fs::is_directory(dir)) throw Error(ErrorKind::data, "HF model directory " + dir + ": exists and is not a directory");
  const GPTConfig cfg = read_model_config(H5File::open_read(checkpoint));
  ExportResult r;
  r.architecture = architecture_for(cfg, checkpoint);
  LoadedModel l = load_model(checkpoint, 8.0);
  std::unique_ptr<GPT> model = std::move(l.model);
  if (r.architecture == "GPT2LMHeadModel" && !cfg.bias) {
    // GPT-2's layers all carry biases: a model without them is the same function with zeros.
    model = with_zero_biases(*model);
    r.note = "biases written as zeros (GPT-2's layout has them everywhere)";
  }

  const std::vector<Slot> s = slots(*model, r.architecture, "transformer.");
  std::deque<std::vector<float>> keep;
  std::vector<safetensors::OutTensor> tensors;
  for (const Slot& x : s) tensors.push_back({x.name, x.shape, file_layout(x, keep)});

  // Shards of at most max_shard_bytes of data each, as save_pretrained cuts them.
  const std::string st_dtype = dt->second.first;
  const int esize = st_dtype == "F32" ? 4 : 2;
  std::vector<std::vector<safetensors::OutTensor>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (const auto& t : tensors) {
    uint64_t n = static_cast<uint64_t>(esize);
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    if (in_shard > 0 && in_shard + n > max_shard_bytes) shards.emplace_back(), in_shard = 0;
    shards.back().push_back(t);
    in_shard += n;
    total += n;
  }
  const std::map<std::string, std::string> meta{{"format", "pt"}};
  std::vector<std::pair<std::string, StreamWriter>> files;
  auto text_file = [&](const std::string& name, std::string bytes) {  // a small file's bytes, held in memory
    const std::string p = (fs::path(dir) / name).string();
    files.emplace_back(p, [p, bytes = std::move(bytes)](std::FILE* f) {
      if (std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size()) throw Error(ErrorKind::data, "cannot write " + p);
    });
  };
  const int64_t bos = l.tok ? l.tok->bos_id() : -1, eos = l.tok ? l.tok->eos_id() : -1;
  text_file("config.json", config_json(model->config(), r.architecture,
                                       dt->second.second, bos, eos)
                               .dump(2) +
                               "\n");
  nlohmann::ordered_json gen = nlohmann::ordered_json::object();
  if (bos >= 0) gen["bos_token_id"] = bos;
  if (eos >= 0) gen["eos_token_id"] = eos;
  text_file("generation_config.json", gen.dump(2) + "\n");
  std::vector<std::string> shard_names;
  if (shards.size() == 1) {
    shard_names.push_back("model.safetensors");
  } else {
    nlohmann::ordered_json idx;
    idx["metadata"] = {{"total_size", total}};
    nlohmann::ordered_json wm = nlohmann::ordered_json::object();
    for (size_t i = 0; i < shards.size(); i++) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      shard_names.push_back(name);
      for (const auto& t : shards[i]) wm[t.name] = name;
    }
    idx["weight_map"] = wm;
    text_file("model.safetensors.index.json", idx.dump(2) + "\n");
  }
  for (size_t i = 0; i < shards.size(); i++) {
    const std::string p = (fs::path(dir) / shard_names[i]).string();
    files.emplace_back(p, [p, &shard = shards[i], &st_dtype, &meta](std::FILE* f) { safetensors::write(f, shard, st_dtype, meta, p); });
  }
  if (l.tok && l.tok->kind() == TokenizerKind::sentencepiece) {
    text_file("tokenizer.model", l.tok->serialized());
    nlohmann::ordered_json tc;
    tc["tokenizer_class"] = "LlamaTokenizer";
    tc["bos_token"] = l.tok->piece(l.tok->bos_id());
    tc["eos_token"] = l.tok->piece(l.tok->eos_id());
    tc["unk_token"] = l.tok->piece(0);
    tc["add_bos_token"] = true;
    tc["add_eos_token"] = false;
    tc["legacy"] = true;
    tc["model_max_length"] = cfg.block_size;
    text_file("tokenizer_config.json", tc.dump(2) + "\n");
  } else if (l.tok && l.tok->as<ByteBpe>()) {
    text_file("tokenizer.json", l.tok->as<ByteBpe>()->tokenizer_json() + "\n");
    nlohmann::ordered_json tc;
    tc["tokenizer_class"] = "PreTrainedTokenizerFast";
    if (l.tok->bos_id() >= 0) tc["bos_token"] = l.tok->piece(l.tok->bos_id());
    if (l.tok->eos_id() >= 0) tc["eos_token"] = l.tok->piece(l.tok->eos_id());
    tc["add_bos_token"] = false;
    tc["model_max_length"] = cfg.block_size;
    text_file("tokenizer_config.json", tc.dump(2) + "\n");
  } else if (l.tok) {
    r.note += std::string(r.note.empty() ? "" : "; ") + "the " + l.tok->kind_name() + " tokenizer has no HF form and was not written";
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(ErrorKind::data, "HF model directory " + dir + ": cannot create: " + ec.message());
  write_files_atomic_streamed(files);
  for (const auto& [p, w] : files) r.files.push_back(p);
  // A previous export's weight files that this one does not replace would confuse a loader.
  std::set<std::string> written(r.files.begin(), r.files.end());
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    const bool ours = n == "model.safetensors" || n == "model.safetensors.index.json" ||
                      (n.rfind("model-", 0) == 0 && n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0);
    if (ours && !written.count(e.path().string())) fs::remove(e.path(), ec);
  }
  return r;
}

}  // namespace tapelm::hf
